"""The job protocol every long operation follows, on every floor (docs/ARCHITECTURE.md §5).

A job is a generator that yields `Progress` records and returns its result. Cancelling is
`gen.close()` between yields: the generator sees GeneratorExit at its current `yield`, its
`finally` blocks run, and nothing half-done is saved. The protocol lives on the ground floor
so that twins/, policies/, devices/ and reconstruction/ yield `Progress` themselves and app/
passes their jobs on as they are. Drivers: `run_to_end` (anywhere), `app/jobs.run_cli` (the
terminal), `widgets/jobs.JobRunner` (a worker thread of the window).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Progress:
    """One progress record: fraction in [0, 1] or None (indeterminate), a message, and an
    optional partial result (the newest mesh, the loss so far...)."""

    fraction: float | None
    message: str
    partial: Any = None


Job = Generator[Progress, None, R]


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
