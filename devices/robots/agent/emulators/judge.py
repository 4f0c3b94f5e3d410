"""Judge what went out on an emulated bus: every goal position the driver wrote, converted
back to joint angles with the arm's calibration, against the safety envelope: inside the
calibrated range, and no larger a step from one goal to the next than the envelope allows:
one control period at the joint's velocity limit, plus the lead a position target may have
over the measured joint (a stop puts the goal back onto the measured joint, up to that lead
behind the last target)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from devices.robots.agent.drivers.arm_calibration import ArmCalibration

RANGE_TOL_RAD = 1e-3
STEP_TOL = 1.05  # x velocity limit x (period + lead), plus one tick of rounding
LEAD_S = 0.08  # SafetyConfig.lead_s


def unsafe_goals(
    goals: Sequence[tuple[float, int, int]],
    cal: ArmCalibration,
    rate_hz: float,
    start_ticks: dict[int, int] | None = None,
) -> list[str]:
    """Descriptions of every goal outside the envelope (empty: all safe). `start_ticks` is
    each servo's position when control began (the first goal's step is measured from it)."""
    k = 2.0 * math.pi / cal.ticks_per_rev
    by_id = {j.id: j for j in cal.joints}
    prev: dict[int, int] = dict(start_ticks or {})
    bad = []
    for t, sid, raw in goals:
        j = by_id.get(sid)
        if j is None:
            bad.append(f"t={t:.3f}: goal {raw} for servo {sid}, not in the arm")
            continue
        q = j.direction * (raw - j.offset) * k
        if not j.min - RANGE_TOL_RAD <= q <= j.max + RANGE_TOL_RAD:
            bad.append(f"t={t:.3f}: {j.name} goal {q:+.4f} rad outside [{j.min}, {j.max}]")
        if sid in prev:
            step = abs(raw - prev[sid]) * k
            limit = j.velocity * (1.0 / rate_hz + LEAD_S) * STEP_TOL + k
            if step > limit:
                bad.append(f"t={t:.3f}: {j.name} goal jumps {step:.4f} rad (> {limit:.4f})")
        prev[sid] = raw
    return bad
