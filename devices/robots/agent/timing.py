"""A fixed-rate loop on an absolute schedule, with its own jitter measurement.

Tick k is due at `t0 + k * dt` (time.perf_counter). The loop sleeps until shortly before
the due time and spins the rest, so wake-up error is mostly the OS scheduler's. A late tick
runs at once (the schedule does not drift); more than `resync_periods` behind, the schedule
restarts from now and the skipped ticks are counted. A robot's control loop resyncs after
half a period (the agent): ticks it missed are not run back to back afterwards, where each
would send one more speed-limited step within a millisecond (after a 20 ms stall on a busy
machine, five catch-up targets drove a joint to 1.1x its speed limit).
"""

from __future__ import annotations

import os
import time

import numpy as np


def set_realtime(priority: int, native_id: int = 0) -> bool:
    """Give a thread (default: the calling one) SCHED_FIFO `priority`, as robot control
    loops do. Returns False where the OS refuses (no CAP_SYS_NICE / rtprio limit), in which
    case the thread keeps its normal priority."""
    try:
        os.sched_setscheduler(native_id, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError):
        return False
    return True


class RateLoop:
    """Call `wait()` once per tick; it returns the due time of the tick."""

    def __init__(
        self,
        rate_hz: float,
        spin_s: float = 0.0004,
        resync_periods: float = 5.0,
        history: int = 20000,
    ) -> None:
        self.dt = 1.0 / float(rate_hz)
        self.spin_s = spin_s
        self.resync_periods = resync_periods
        self.k = 0
        self.t0 = time.perf_counter()
        self.skipped = 0
        self._lateness = np.zeros(history)  # s, wake time minus due time, ring buffer
        self._n = 0

    def restart(self) -> None:
        self.t0 = time.perf_counter()
        self.k = 0

    def wait(self) -> float:
        """Block until the next tick is due; returns the time it was due (before any resync)."""
        self.k += 1
        due = self.t0 + self.k * self.dt
        now = time.perf_counter()
        scheduled = due  # lateness is measured against it, resynced or not
        if now - due > self.resync_periods * self.dt:
            missed = int((now - due) / self.dt)
            self.skipped += missed
            self.t0, self.k, due = now, 0, now
        else:
            rest = due - now - self.spin_s
            if rest > 0:
                time.sleep(rest)
            while time.perf_counter() < due:
                pass
        woke = time.perf_counter()
        self._lateness[self._n % self._lateness.size] = woke - scheduled
        self._n += 1
        return scheduled

    def jitter_ms(self, last: int | None = None) -> dict[str, float]:
        """Wake-up lateness statistics (ms) over the recent history (the newest `last`
        ticks if given)."""
        m = min(self._n, self._lateness.size, last if last else self._lateness.size)
        if m == 0:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0, "ticks": 0.0, "skipped": 0.0}
        idx = np.arange(self._n - m, self._n) % self._lateness.size
        lat = self._lateness[idx] * 1e3
        return {
            "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)),
            "max": float(lat.max()),
            "ticks": float(self._n),
            "skipped": float(self.skipped),
        }

    def reset_stats(self) -> None:
        self._n = 0
        self.skipped = 0
