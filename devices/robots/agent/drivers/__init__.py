"""Robot drivers (robot side). `DRIVER_NAMES` is the one list of the drivers the agent can
serve (`python -m devices.robots.agent.serve --driver NAME`), in the order a user is offered them;
`registry.DRIVERS` maps each to how it is built. The names live here, apart from the
builders, so that the workbench (Add robot…) can list them without importing what a builder
imports (the lab's builder imports MuJoCo, which app/ and widgets/ must never load, §2)."""

DRIVER_NAMES: tuple[str, ...] = ("lab", "dynamixel", "feetech", "franka", "ideal")
