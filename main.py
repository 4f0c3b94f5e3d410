"""Twinbench entry point.

`python main.py` opens the desktop app; `python main.py demo` opens it with the virtual lab;
`python main.py CMD ...` runs the command line, which never loads Qt.
"""

from __future__ import annotations

import os
import sys

# A robot process runs its control loop SCHED_FIFO; a BLAS call on that thread that fans out
# to OpenBLAS's worker threads (normal priority) waits for them, and on a busy machine they
# wait behind every other process: 10-13 ms control-loop stalls with 4 busy processes
# beside the lab, gone with one BLAS thread (docs/TRAPS.md).
MATH_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def single_threaded_math(env: dict[str, str] | None = None) -> None:
    """One BLAS/OpenMP thread in this process (or in `env`, for a child's environment)."""
    target = os.environ if env is None else env
    for var in MATH_THREAD_VARS:
        target[var] = "1"


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
        single_threaded_math()  # before numpy loads: it reads these once
    from app.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
