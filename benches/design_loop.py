"""Does the suggested next recording pay off? The identification loop, run against a known
truth: record (simulate at the truth, add sensor noise), fit, choose the next motion, until
every parameter is identifiable and within `tol` of the truth.

`recordings_needed(..., policy="suggested")` picks each next motion by D-optimal gain at the
current estimate (twins/fit/design.py); `policy="random"` picks a random library motion. Both
fit with the same least-squares + Laplace fit (twins/fit/steps.py) after each recording, so the
number of recordings each needs is an honest comparison (the issue's
`suggested_vs_random_recordings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from devices.robots.motion import Motion
from devices.trajectory import Trajectory
from twins.executor import Executor
from twins.fit import FitConfig, fit
from twins.fit.design import information, rank, simulate_motion
from twins.spec import TwinSpec


@dataclass(frozen=True)
class LoopResult:
    """How many recordings the loop needed (None: not within `max_recordings`), which
    motions it chose, and the largest relative error after each fit."""

    recordings: int | None
    chosen: tuple[str, ...]
    max_rel_err: tuple[float, ...]
    estimates: tuple[Mapping[str, float], ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "recordings": self.recordings,
            "chosen": list(self.chosen),
            "max_rel_err": [round(e, 4) for e in self.max_rel_err],
        }


def noisy_recording(
    spec: TwinSpec, truth: Mapping[str, float], motion: Motion, noise: float, seed: int
) -> Trajectory:
    """The twin at `truth` playing `motion`, with Gaussian joint-position noise (rad)."""
    sim = simulate_motion(spec, truth, motion)
    rng = np.random.default_rng(seed)
    q = sim["robot/joint_pos"] + noise * rng.standard_normal(sim["robot/joint_pos"].shape)
    return sim.with_channels(
        channels={**dict(sim.channels), "robot/joint_pos": q},
        source="real",
        meta={**dict(sim.meta), "name": f"{motion.name}-{seed}"},
    )


def recordings_needed(
    spec: TwinSpec,
    truth: Mapping[str, float],
    start: Mapping[str, float],
    candidates: Mapping[str, Motion],
    policy: Literal["suggested", "random"],
    seed: int = 0,
    noise: float = 1e-3,
    tol: float = 0.1,
    max_recordings: int = 8,
    fit_rounds: int = 2,
    executor: Executor | None = None,
) -> LoopResult:
    """Run the loop from the estimate `start` (see the module docstring)."""
    params: Sequence[str] = tuple(start)
    rng = np.random.default_rng(seed)
    estimate = dict(start)
    recs: list[Trajectory] = []
    chosen: list[str] = []
    errs: list[float] = []
    ests: list[Mapping[str, float]] = []
    keys = list(candidates)
    sigma = {"robot/joint_pos": noise}
    for k in range(max_recordings):
        if policy == "suggested":
            have = information(spec, estimate, params, recs, sigma, executor=executor)
            ranked = rank(spec, estimate, params, candidates, have, sigma, executor=executor)
            name = ranked[0].name
        else:
            name = keys[int(rng.integers(len(keys)))]
        chosen.append(name)
        recs.append(noisy_recording(spec, truth, candidates[name], noise, 1000 * seed + k))
        cfg = FitConfig(
            params=tuple(params), window_s=1.0, budget=0, polish_rounds=fit_rounds, validation=0.0
        )
        res = fit(spec.with_values(estimate), recs, cfg, executor)
        estimate = dict(res.estimate)
        ests.append(estimate)
        rel = max(abs(estimate[p] - truth[p]) / abs(truth[p]) for p in params)
        errs.append(float(rel))
        if rel <= tol and all(res.posterior.identifiable[p] for p in params):
            return LoopResult(k + 1, tuple(chosen), tuple(errs), tuple(ests))
    return LoopResult(None, tuple(chosen), tuple(errs), tuple(ests))
