"""Identifiability report: what the recordings can and cannot pin down.

From the Jacobian J (m, n) of the fit's normalised residuals with respect to the
normalised parameters u in [0, 1] at an estimate:

- **sensitivity** of a parameter: RMS change of the residuals per full range of it
  (||J_i|| / sqrt(m)); a parameter the recordings do not excite has none.
- **correlation**: of the Gauss-Newton covariance (JᵀJ)⁻¹; pairs beyond `CORR_STRONG`
  trade off (reported); beyond `CORR_MAX` the data see only a combination of them.
- **weak directions**: eigenvectors of the scaled information matrix whose eigenvalue is
  a tiny share of the largest; parameters that load on them are not pinned down.

A parameter is flagged unidentifiable when its sensitivity is below `SENS_MIN` of the
largest, when it is correlated beyond `CORR_MAX` with another, or when it loads on a weak
direction. `identifiability(problem, u, executor)` computes J by central differences
through the executor (2n simulations; a failed one makes that column unknown, flagged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from twins.fit.objective import evaluate, residual_size

SENS_MIN = 1e-3  # share of the largest sensitivity below which a parameter is not excited
CORR_MAX = 0.999  # |correlation| beyond which two parameters cannot be told apart
CORR_STRONG = 0.95  # |correlation| reported as a trade-off (still identifiable)
EIG_MIN = 1e-8  # share of the largest eigenvalue of the scaled information matrix
STEP = 0.01  # central-difference step in normalised units


@dataclass(frozen=True)
class Identifiability:
    """Per-parameter sensitivity, flags and reasons; correlation matrix; strongly
    correlated pairs (name, name, correlation); condition number of the information."""

    names: tuple[str, ...]
    sensitivity: Mapping[str, float]
    correlation: NDArray[np.float64]
    identifiable: Mapping[str, bool]
    why: Mapping[str, str]
    strong_pairs: tuple[tuple[str, str, float], ...]
    condition: float

    def to_json(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "sensitivity": dict(self.sensitivity),
            "identifiable": dict(self.identifiable),
            "why": dict(self.why),
            "correlation": np.nan_to_num(self.correlation).round(4).tolist(),
            "strong_pairs": [list(p) for p in self.strong_pairs],
            "condition": self.condition if np.isfinite(self.condition) else None,
        }


def from_jacobian(names: Sequence[str], J: NDArray[np.float64]) -> Identifiability:
    """The report for residual Jacobian `J` (m, n); NaN columns are failed simulations."""
    names = tuple(names)
    n = len(names)
    J = np.asarray(J, dtype=float).reshape(-1, n)
    m = max(J.shape[0], 1)
    ok = np.all(np.isfinite(J), axis=0)
    sens = np.where(ok, np.linalg.norm(np.nan_to_num(J), axis=0) / np.sqrt(m), 0.0)
    top = float(sens.max()) if n else 0.0
    reasons: list[list[str]] = [[] for _ in range(n)]
    for i in range(n):
        if not ok[i]:
            reasons[i].append("simulations failed around the estimate")
        elif sens[i] <= SENS_MIN * top or sens[i] == 0.0:
            reasons[i].append("the recordings do not excite it (no sensitivity)")
    live = np.flatnonzero(ok & (sens > SENS_MIN * top) & (sens > 0))
    corr = np.full((n, n), np.nan)
    pairs: list[tuple[str, str, float]] = []
    cond = float("inf")
    if live.size:
        Jk = J[:, live] / sens[live]  # scaled: every column has rms 1
        H = Jk.T @ Jk
        w, V = np.linalg.eigh(H)
        cond = float(w.max() / w.min()) if w.min() > 0 else float("inf")
        cov = np.linalg.pinv(H, rcond=1e-14, hermitian=True)
        d = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
        corr[np.ix_(live, live)] = cov / np.outer(d, d)
        for a in range(live.size):
            for b in range(a + 1, live.size):
                c = float(corr[live[a], live[b]])
                if abs(c) > CORR_STRONG:
                    pairs.append((names[live[a]], names[live[b]], round(c, 4)))
                if abs(c) > CORR_MAX:
                    for i, j in ((live[a], live[b]), (live[b], live[a])):
                        reasons[i].append(f"cannot be told apart from {names[j]} (corr {c:.3f})")
        weak = w < EIG_MIN * max(float(w.max()), 1e-300)
        for k in np.flatnonzero(weak):
            for i in live[np.abs(V[:, k]) > 0.3]:
                reasons[i].append("on a direction the recordings do not constrain")
    for i in range(n):
        corr[i, i] = 1.0
    return Identifiability(
        names,
        {nm: float(s) for nm, s in zip(names, sens, strict=True)},
        corr,
        {nm: not reasons[i] for i, nm in enumerate(names)},
        {nm: "; ".join(reasons[i]) for i, nm in enumerate(names)},
        tuple(pairs),
        cond,
    )


def jacobian(problem: Any, u: NDArray[np.float64], executor: Any = None) -> NDArray[np.float64]:
    """Central-difference Jacobian of `problem`'s residuals at normalised `u` (NaN columns
    where a simulation failed), evaluated through `executor` (serial when None)."""

    u = np.asarray(u, dtype=float)
    n = u.size
    pts, steps = [], []
    for i in range(n):
        up, dn = u.copy(), u.copy()
        up[i], dn[i] = min(u[i] + STEP, 1.0), max(u[i] - STEP, 0.0)
        pts += [up, dn]
        steps.append(up[i] - dn[i])
    tasks = [(problem, p) for p in pts]
    outs = list(executor.map(evaluate, tasks)) if executor is not None else map(evaluate, tasks)
    outs = list(outs)
    cols = []
    size = residual_size(problem)
    for i in range(n):
        a, b = outs[2 * i].residuals, outs[2 * i + 1].residuals
        if a is None or b is None or a.size != size or b.size != size:
            cols.append(np.full(size, np.nan))
        else:
            cols.append((a - b) / steps[i])
    return np.stack(cols, axis=1) if cols else np.zeros((size, 0))


def identifiability(problem: Any, u: NDArray[np.float64], executor: Any = None) -> Identifiability:
    """The report for `problem` (twins.fit.objective.Problem) at normalised `u`."""
    return from_jacobian(problem.space.names, jacobian(problem, u, executor))
