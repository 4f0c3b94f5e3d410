"""Twinbench entry point.

`python main.py` opens the desktop app; `python main.py demo` opens it with the virtual lab;
`python main.py CMD ...` runs the command line, which never loads Qt.
"""

from __future__ import annotations

import sys


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
        from devices.robots.math_threads import single_threaded_math  # stdlib only

        single_threaded_math()  # before numpy loads: it reads these once
    from app.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
