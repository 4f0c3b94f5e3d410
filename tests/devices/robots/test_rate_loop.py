"""The control loop's schedule (devices/robots/agent/timing.py): after a stall, the agent's loop
does not run the ticks it missed back to back (each would write one more speed-limited step
within a millisecond), and its lateness statistics still show the stall."""

from __future__ import annotations

import time

import numpy as np
import pytest

from devices.robots.agent.timing import RateLoop

pytestmark = pytest.mark.realtime  # wall-clock spacing: run on its own, not beside xdist


def _wakes_after_stall(loop: RateLoop, stall_s: float) -> list[float]:
    loop.restart()
    for _ in range(3):
        loop.wait()
    time.sleep(stall_s)  # the tick's work (or the OS) held the loop up
    wakes = []
    for _ in range(6):
        loop.wait()
        wakes.append(time.perf_counter())
    return wakes


def test_missed_ticks_are_skipped_not_bunched() -> None:
    dt = 0.004
    gaps = []
    for _ in range(5):
        loop = RateLoop(1 / dt, resync_periods=0.5)
        gaps.append(np.diff(_wakes_after_stall(loop, 4.5 * dt)).min())
        assert loop.skipped >= 3
        assert loop.jitter_ms()["max"] >= 0.8 * 3.5 * dt * 1e3  # the stall stays visible
    # old behaviour (resync after 5 periods): the missed ticks ran within ~0.1 ms
    assert np.median(gaps) > 0.4 * dt, gaps
    bunched = RateLoop(1 / dt, resync_periods=5.0)
    assert np.diff(_wakes_after_stall(bunched, 4.5 * dt))[:3].max() < 0.4 * dt
