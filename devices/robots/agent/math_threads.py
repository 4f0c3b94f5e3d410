"""One BLAS/OpenMP thread for a robot process (standard library only: importable before numpy).

A robot process runs its control loop SCHED_FIFO; a BLAS call on that thread that fans out to
OpenBLAS's worker threads (normal priority) waits for them, and on a busy machine they wait
behind every other process: 10-13 ms control-loop stalls with 4 busy processes beside the
lab, 2-4 ms with one BLAS thread (docs/TRAPS.md). The libraries read these variables once,
when they load, so they are set before numpy is imported (`main.py` for `lab serve` /
`agent serve`) or in a launched robot process's environment (`devices/robots/agent/launch.py`).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

MATH_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def single_threaded_math(env: MutableMapping[str, str] | None = None) -> None:
    """One BLAS/OpenMP thread in this process's environment (or in `env`, a child's)."""
    target = os.environ if env is None else env
    for var in MATH_THREAD_VARS:
        target[var] = "1"
