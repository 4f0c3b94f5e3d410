"""What app/ adds to the job protocol (docs/ARCHITECTURE.md §5; the protocol itself,
`Progress`, `Job`, `run_to_end`, `sub_job`, lives in resources/jobs.py): the CLI's terminal
driver `run_cli`, and `preload_step_libraries`, which a window calls before its heap freeze.
"""

from __future__ import annotations

import importlib
import sys
import time
import warnings
from typing import TextIO, TypeVar

from resources.jobs import Job, Progress, run_to_end

R = TypeVar("R")


# Libraries the steps import the first time they run (the CLI's commands start without them):
# the fit's CMA-ES (170 modules), the recorder's parquet writer and pandas. A window loads them
# up front (`preload_step_libraries`) so that its heap freeze covers them: imported inside a
# job they were walked by the garbage collector's next full collection, 85-173 ms with every
# thread waiting in bench loop's fit step on a loaded machine.
STEP_LIBRARIES = ("cma", "pandas", "pyarrow.parquet")


def preload_step_libraries() -> None:
    """Import `STEP_LIBRARIES` now (0.4 s on a quiet machine)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cma: "Could not import matplotlib.pyplot" (not used)
        for name in STEP_LIBRARIES:
            importlib.import_module(name)


class TerminalProgress:
    """A one-line terminal progress bar for the CLI (plain lines when not a TTY)."""

    def __init__(self, stream: TextIO | None = None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self._last_plain = 0.0
        self._last_msg = ""

    def __call__(self, rec: Progress) -> None:
        if self.tty:
            if rec.fraction is None:
                bar = "." * self.width
                pct = "  ?%"
            else:
                f = min(max(rec.fraction, 0.0), 1.0)
                n = int(round(f * self.width))
                bar = "#" * n + "-" * (self.width - n)
                pct = f"{f * 100:3.0f}%"
            self.stream.write(f"\r[{bar}] {pct} {rec.message[:60]:<60}")
            self.stream.flush()
        else:
            now = time.monotonic()
            if rec.message != self._last_msg or now - self._last_plain > 2.0:
                pct = "" if rec.fraction is None else f"{rec.fraction * 100:5.1f}% "
                self.stream.write(f"{pct}{rec.message}\n")
                self._last_plain, self._last_msg = now, rec.message

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def run_cli(job: Job[R], quiet: bool = False) -> R:
    """Run a job in the terminal with a progress bar; Ctrl-C cancels it cleanly."""
    bar = None if quiet else TerminalProgress()
    try:
        return run_to_end(job, bar)
    except KeyboardInterrupt:
        job.close()
        raise
    finally:
        if bar is not None:
            bar.close()
