"""Twinbench entry point.

`python main.py` opens the desktop app; `python main.py demo` opens it with the virtual lab;
`python main.py CMD ...` runs the command line, which never loads Qt.

main.py stands outside the floors (docs/ARCHITECTURE.md §2) and composes what app/ may not
import: `bench` (the benches/ package, the top floor) is registered with app's CLI from here,
and `agent serve` / `lab serve` (the robot's / the lab's own process) run
devices/robots/agent/serve.py directly, without app/.
"""

from __future__ import annotations

import sys

# Commands from above app/ (app's CLI lists them after its own): name -> (module, summary).
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("benches.cli", "run a benchmark; --json prints one JSON object on the last line"),
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if (
        not args
        or args[0] in ("gui", "demo")
        or (args[0].startswith("--") and args[0] not in ("--help", "-h"))
    ):
        from widgets.app import run_gui  # Qt is imported only here

        demo = bool(args) and args[0] == "demo"
        rest = args[1:] if args and args[0] in ("gui", "demo") else args
        return run_gui(demo=demo, argv=rest)
    if args[:2] in (["lab", "serve"], ["agent", "serve"]):
        from devices.robots.agent.math_threads import single_threaded_math  # stdlib only

        single_threaded_math()  # before numpy loads: it reads these once
        from devices.robots.agent.serve import main as serve_main

        return serve_main(
            args[2:],
            prog=f"python main.py {args[0]} serve",
            driver="lab" if args[0] == "lab" else None,
            description=None,
            error_prefix="",  # as app's CLI prints errors
        )
    from app.cli import main as cli_main

    return cli_main(args, extra=EXTRA_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
