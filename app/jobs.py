"""The job protocol every long operation follows (docs/ARCHITECTURE.md §5).

A job is a generator that yields `Progress` records and returns its result. Cancelling is
`gen.close()` between yields: the generator sees GeneratorExit at its current `yield`, its
`finally` blocks run, and nothing half-done is saved. The CLI drives jobs with `run_cli`
(terminal progress bar); widgets/ drives them on a worker thread.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
import warnings
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Progress:
    """One progress record: fraction in [0, 1] or None (indeterminate), a message, and an
    optional partial result (the newest mesh, the loss so far...)."""

    fraction: float | None
    message: str
    partial: Any = None


Job = Generator[Progress, None, R]

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


class Cancelled(Exception):
    """Raised by `run_to_end` when the stop callback asks to cancel."""


def run_to_end(
    job: Job[R],
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> R:
    """Drive `job` to completion, calling `on_progress` for each record.

    If `should_stop()` becomes true the job is closed at its next yield and `Cancelled` is
    raised. Exceptions raised inside the job propagate unchanged.
    """
    try:
        while True:
            rec = next(job)
            if on_progress is not None:
                on_progress(rec)
            if should_stop is not None and should_stop():
                job.close()
                raise Cancelled("cancelled")
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def sub_job(job: Job[R], lo: float, hi: float, prefix: str = "") -> Generator[Progress, None, R]:
    """Re-yield a nested job's progress mapped into [lo, hi] of the outer job.

    Use as `result = yield from sub_job(inner(), 0.2, 0.8)`.
    """
    try:
        while True:
            rec = next(job)
            frac = None if rec.fraction is None else lo + (hi - lo) * rec.fraction
            yield Progress(frac, f"{prefix}{rec.message}", rec.partial)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        job.close()


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


def tap_progress(job: Any, on_progress: Callable[[Any], None], stop: threading.Event) -> Any:
    """`job` passed through, each Progress also given to `on_progress` (from the job's
    thread); when `stop` is set the job is closed at its next yield (a fit then saves a
    resumable checkpoint) and this returns None."""
    try:
        while True:
            if stop.is_set():
                return None
            try:
                p = next(job)
            except StopIteration as s:
                return s.value
            on_progress(p)
            yield p
    finally:
        job.close()
