"""The fit's latency scan between CMA-ES and the least-squares polish.

A PD arm's measured efforts jump at every new command (kp times the command's step), so the
effort residuals ripple in the latency with the command period: the objective has a basin
at every command period, and CMA-ES (a few generations, a small population) can settle in
the wrong one, with the dampings shifted to make up the delay (the lab Panda at 250 Hz
commands: the loss at the true dampings is 0.00097 at 0 ms, 0.0024 at 2 ms, 0.00035 at the
true 4 ms). The joint angles alone are smooth in the latency; the basins are a property of
the effort channel. `latency_candidates` puts every fitted latency on a grid of half the
recordings' command period (at most `MAX_GRID` points over its range) with the other
parameters at the CMA-ES best: the polish starts from the best of them (a few evaluations,
one per grid point; each counts in the fit's evaluations and rollouts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from devices.trajectory import Trajectory
from twins.fit.objective import Space

MAX_GRID = 16


def command_period(windows: Sequence[Trajectory]) -> float:
    """Median time between changes of the recorded command (NaN without commands)."""
    # pybullet + trimesh (0.3-0.6 s, importtime): twins.fit itself loads without physics
    from twins.simulate import command_times

    gaps = []
    for w in windows:
        if "robot/command" not in w.channels or len(w) < 3:
            continue
        U = w["robot/command"]
        changed = np.flatnonzero(np.any(np.diff(U, axis=0) != 0, axis=1)) + 1
        gaps.append(np.diff(command_times(w)[changed]))
    d = np.concatenate(gaps) if gaps else np.zeros(0)
    d = d[np.isfinite(d) & (d > 0)]
    return float(np.median(d)) if d.size else float("nan")


def latency_candidates(
    space: Space, windows: Sequence[Trajectory], u: NDArray[np.float64]
) -> list[NDArray[np.float64]]:
    """Points `u` with one fitted latency moved over its grid (see the module docstring);
    empty when no latency is fitted or the recordings carry no commands."""
    idx = [i for i, n in enumerate(space.names) if n.endswith(".latency")]
    period = command_period(windows)
    if not idx or not np.isfinite(period):
        return []
    x0 = space.to_x(u)
    out = []
    for i in idx:
        lo, hi = float(space.low[i]), float(space.high[i])
        k = min(MAX_GRID, int(np.floor((hi - lo) / (period / 2) + 1e-9)) + 1)
        for v in (
            np.linspace(lo, lo + (k - 1) * period / 2, k)
            if k < MAX_GRID
            else np.linspace(lo, hi, k)
        ):
            x = x0.copy()
            x[i] = v
            out.append(space.to_u(x))
    return out
