"""The robot agent on the robot's computer: `python -m devices.robots.agent.serve --driver NAME …`
(also `python main.py agent serve …`). Drivers: lab, dynamixel, feetech, franka, ideal
(devices/robots/agent/drivers/registry.py).

Builds the driver, the agent (safety envelope, watchdog, policy runner) and the protocol
server, prints `agent serve: … listening on HOST:PORT` once clients may connect, and runs
until Ctrl-C / SIGTERM (or, with --exit-with-parent, until stdin closes); the robot is then
left held and the driver closed (servo arms: torque off). The workbench connects to it
exactly as to the lab; `get_info` carries the robot-description bundle
(`info.meta["bundle"]`: URDF, limits, calibration) where the driver has one.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from devices.errors import DeviceError
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.registry import DRIVERS, Served
from devices.robots.agent.drivers.registry import add_arguments as driver_arguments
from devices.robots.agent.drivers.registry import build as build_driver
from devices.robots.agent.server import RobotServer, is_loopback
from devices.robots.agent.timing import set_realtime
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.wire.auth import TOKEN_ENV, load_token
from devices.robots.wire.tls import (
    default_tls_dir,
    ensure_certificate,
    fingerprint,
    server_context,
)
from resources.errors import TwinbenchError

PREFIX = "agent serve"


def add_arguments(p: argparse.ArgumentParser, driver: str | None = None) -> None:
    """The serve options; `driver` fixes the driver (`lab serve` is `--driver lab`)."""
    if driver is None:
        p.add_argument("--driver", required=True, choices=sorted(DRIVERS), help="what moves joints")
    else:
        p.set_defaults(driver=driver)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default loopback; any other address needs --allow-remote)",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host; turns TLS on (clients pin the certificate)",
    )
    p.add_argument("--tls", action="store_true", help="serve TLS even on loopback")
    p.add_argument("--tls-dir", type=Path, default=None, help="TLS certificate folder")
    p.add_argument("--port", type=int, default=7700, help="TCP port (0: any free port)")
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"file holding the access token (default: ${TOKEN_ENV})",
    )
    p.add_argument(
        "--rt-priority",
        type=int,
        default=20,
        help="SCHED_FIFO priority for the control thread where the OS allows it (0: normal)",
    )
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when stdin closes (the launching process ended or crashed)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=0.25,
        help="watchdog: stop when the controlling client is silent this long (s)",
    )
    p.add_argument(
        "--policy-timeout",
        type=float,
        default=None,
        help="watchdog: stop when the policy gives no new output this long (s; "
        "default 5 control periods)",
    )
    driver_arguments(p)


def build(args: argparse.Namespace) -> tuple[Agent, RobotServer, Served]:
    """Driver, agent and server described by `args` (not yet started)."""
    token = load_token(args.token_file)
    if not is_loopback(args.host) and not args.allow_remote:
        raise DeviceError(
            f"{PREFIX}: refusing --host {args.host}: that exposes the robot to the network. "
            "Add --allow-remote (TLS is then on; clients pin the certificate fingerprint "
            "printed at start) or bind 127.0.0.1"
        )
    served = build_driver(args.driver, args)
    try:
        agent = Agent(
            served.driver,
            safety=served.safety,
            watchdog=WatchdogConfig(
                heartbeat_timeout_s=args.heartbeat_timeout,
                policy_timeout_s=args.policy_timeout,
            ),
            # the SDKs poll the port in a busy loop: SCHED_FIFO would starve an in-process peer
            realtime_priority=(args.rt_priority or None) if served.realtime_ok else None,
        )
        if hasattr(served.driver, "on_reflex"):  # an arm that reports reflexes (Franka):
            agent_ = agent  # a reflex latches the e-stop; only the operator clears it
            served.driver.on_reflex = lambda msg: agent_.estop(f"reflex: {msg}")
        tls_ctx = None
        if args.allow_remote or args.tls:
            cert, key = ensure_certificate(args.tls_dir or default_tls_dir())
            tls_ctx = server_context(cert, key)
            print(f"{PREFIX}: TLS certificate {cert}, fingerprint {fingerprint(cert)}", flush=True)
        server = RobotServer(
            agent,
            token,
            host=args.host,
            port=args.port,
            cameras=served.cameras,
            tls=tls_ctx,
            allow_remote=args.allow_remote,
        )
    except BaseException:
        _close_all(served.closers)
        raise
    return agent, server, served


def _close_all(closers: list[Callable[[], None]]) -> None:
    for fn in closers:
        fn()


def run(args: argparse.Namespace) -> int:
    # Short GIL switch interval: the control thread must not wait 5 ms behind the bus,
    # physics, camera and network threads.
    sys.setswitchinterval(0.0005)
    agent, server, served = build(args)
    done = threading.Event()
    import signal

    def on_signal(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.exit_with_parent:

        def watch_parent() -> None:
            while sys.stdin.buffer.read(4096):
                pass
            done.set()

        threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format=f"{PREFIX}: %(message)s")
    gc.freeze()  # what was built lives for the whole run: keep it out of full collections
    agent.add_event_listener(
        lambda kind, message, data: print(
            f"{PREFIX}: {message if message.startswith(kind) else f'{kind}: {message}'}",
            flush=True,
        )
    )
    try:
        if args.rt_priority and served.realtime_ok:
            # Every thread of this process (the server's readers and writers, created from
            # here on, inherit it) runs SCHED_FIFO just below the control loop: they share
            # its GIL, and one preempted by a busy normal process while holding it stalled
            # the FIFO loop 100 ms (4 busy processes beside the lab). Processes started from
            # here (policy inference, lab cameras) drop back to normal scheduling themselves.
            set_realtime(max(1, args.rt_priority - 10))
        agent.start()
        if (
            args.rt_priority and served.realtime_ok
        ):  # the lab's physics thread is as time-critical as the agent's
            for t in threading.enumerate():
                if t.name.startswith("lab-") and t.native_id is not None:
                    set_realtime(args.rt_priority, t.native_id)
        server.start()
        info = agent.info
        print(
            f"{PREFIX}: {served.label}: {info.name}, {len(info.joint_names)} joints at "
            f"{info.control_rate_hz:g} Hz, cameras: {', '.join(server.cameras) or 'none'}",
            flush=True,
        )
        time.sleep(0.05)
        rt = "SCHED_FIFO" if agent.realtime else "normal scheduling"
        print(f"{PREFIX}: control loop {rt}; listening on {server.host}:{server.port}", flush=True)
        while not done.wait(0.5):
            pass
    finally:
        server.close()
        agent.close()
        _close_all(served.closers)
        print(f"{PREFIX}: stopped (robot held)", flush=True)
    return 0


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = "python -m devices.robots.agent.serve",
    driver: str | None = None,
    description: str | None = __doc__,
    error_prefix: str = f"{PREFIX}: ",
) -> int:
    """Entry point; a TwinbenchError is printed (naming the device) and exits 2.

    main.py runs `python main.py agent serve …` / `lab serve …` here directly (prog, the
    fixed `driver` of `lab serve`, and its CLI's error format): the robot's / lab's process
    never goes through app/, and app/ never imports this module (docs/ARCHITECTURE.md §2)."""

    p = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(p, driver=driver)
    args = p.parse_args(argv)
    try:
        return run(args)
    except TwinbenchError as exc:
        print(f"{error_prefix}error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:  # before the signal handlers are in place (building the driver)
        print("cancelled", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
