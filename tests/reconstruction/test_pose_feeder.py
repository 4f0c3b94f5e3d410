"""The pose feeder's camera-to-robot clock map: a fixed offset maps exactly; an estimated
one (smallest arrival delay) never makes a pose older than it is and is short by at most
the smallest transport latency seen."""

from __future__ import annotations

import numpy as np

from reconstruction.pose_feeder import ClockMap


def test_a_fixed_offset_maps_exactly() -> None:
    m = ClockMap(2.5)
    assert m.robot_time(10.0, 99.0) == 12.5  # arrival time ignored


def test_the_estimated_offset_is_the_smallest_delay() -> None:
    rng = np.random.default_rng(0)
    true_offset = 1234.5  # robot clock - camera clock
    m = ClockMap(None)
    lat = rng.uniform(0.005, 0.04, 200)  # capture -> arrival
    cam_t = np.cumsum(np.full(200, 1 / 30))
    mapped = np.array(
        [m.robot_time(t, t + true_offset + d) for t, d in zip(cam_t, lat, strict=True)]
    )
    true_capture = cam_t + true_offset
    # never earlier than the true capture (ages are not overstated)...
    assert np.all(mapped >= true_capture - 1e-9)
    # ...and, once the fastest frame was seen, late by exactly the smallest latency
    k = int(np.argmin(lat))
    np.testing.assert_allclose(mapped[k:] - true_capture[k:], lat.min(), atol=1e-9)
    assert abs(m.offset_s - (true_offset + lat.min())) < 1e-9
