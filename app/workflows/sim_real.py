"""Sim versus real, per policy and twin version: what the twin said a policy would do and
what the robot did (issue 12 part 5).

For every policy with real deployments (`run` artifacts of kind real-deployment), grouped by
the twin that predicted them: the real success rate over its runs (Wilson 95 % interval),
the twin's prediction for those same runs (the shadow run from the robot's pose before each
deployment: predicted success share and mean |real - predicted| final error), and the twin's
own evaluation of the policy (the newest twin-evaluation run in that twin: success rate over
its randomized episodes). Across policies: the Pearson correlation of twin-predicted and
real success, and the mean absolute gap — the numbers that say whether the twin can be
trusted to rank policies before they reach the robot."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from policies.evaluate import wilson
from resources.project import Project


@dataclass(frozen=True)
class SimRealRow:
    policy: str
    task: str
    twin: str
    robot: str
    runs: int
    real_success: float
    real_ci95: tuple[float, float]
    predicted_success: float  # share of the runs whose shadow run succeeded
    twin_eval_success: float | None  # the twin's own evaluation of the policy (newest)
    twin_eval_episodes: int
    mean_error_gap: float  # mean |real - predicted| final error, in `unit`
    unit: str

    @property
    def twin_success(self) -> float:
        """The twin's word on this policy: its evaluation when there is one (many episodes),
        else the share of shadow runs that succeeded."""
        return self.predicted_success if self.twin_eval_success is None else self.twin_eval_success


@dataclass(frozen=True)
class SimRealTable:
    rows: tuple[SimRealRow, ...]
    pearson: float | None  # across rows; None with fewer than 3 rows or no spread
    abs_gap: float | None  # mean |twin_success - real_success|

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [asdict(r) | {"twin_success": r.twin_success} for r in self.rows],
            "sim_real_pearson": self.pearson,
            "sim_real_abs_gap": self.abs_gap,
        }


def _read(project: Project, art_id: str, name: str) -> dict[str, Any] | None:
    try:
        d = json.loads((project.path_of(art_id) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a run being written or damaged: left out, never a crash
    return d if isinstance(d, dict) else None


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def sim_real_table(project: Project) -> SimRealTable:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    evals: dict[tuple[str, str], dict[str, Any]] = {}
    for art in project.artifacts("run"):
        kind = art.settings.get("kind")
        if kind == "real-deployment":
            out = _read(project, art.id, "run.json")
            if out is None or not art.inputs:
                continue
            groups.setdefault((art.inputs[0], str(out.get("twin", ""))), []).append(out)
        elif kind == "twin-evaluation" and len(art.inputs) >= 2:
            res = _read(project, art.id, "eval.json")
            if res is not None:  # newest wins (artifacts come oldest first)
                evals[(art.inputs[0], art.inputs[1])] = res
    rows = []
    for (policy, twin), outs in groups.items():
        k = sum(bool(o.get("success")) for o in outs)
        gaps = [abs(float(o["error_gap"])) for o in outs if o.get("error_gap") is not None]
        ev = evals.get((policy, twin))
        rows.append(
            SimRealRow(
                policy=policy,
                task=str(outs[-1].get("task", "")),
                twin=twin,
                robot=str(outs[-1].get("robot", "")),
                runs=len(outs),
                real_success=k / len(outs),
                real_ci95=wilson(k, len(outs)),
                predicted_success=sum(bool(o.get("predicted_success")) for o in outs) / len(outs),
                twin_eval_success=None if ev is None else float(ev["success_rate"]),
                twin_eval_episodes=0 if ev is None else int(ev.get("episodes", 0)),
                mean_error_gap=sum(gaps) / len(gaps) if gaps else float("nan"),
                unit=str(outs[-1].get("unit", "")),
            )
        )
    rows.sort(key=lambda r: (r.task, r.policy, r.twin))
    said = [r.twin_success for r in rows]
    did = [r.real_success for r in rows]
    gap = sum(abs(a - b) for a, b in zip(said, did, strict=True)) / len(rows) if rows else None
    return SimRealTable(tuple(rows), pearson(said, did), gap)
