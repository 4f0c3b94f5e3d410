"""`ParamPosterior`: a fit's point estimate, its uncertainty and its history (docs/ARCHITECTURE.md §4).

For now the uncertainty is a Laplace approximation at the optimum: the Gauss–Newton
covariance `s² (JᵀJ)⁻¹` of the (normalised) parameters, with `s²` the residual variance
inflated by the residuals' integrated autocorrelation time (batch means within each
replayed window: samples of a trajectory are not independent, and a replay's model
mismatch wanders slowly; without it the intervals are far too narrow). Intervals are taken in the
normalised space (log for log priors) and mapped back, so they respect the bounds and are
asymmetric for log parameters. A model error no data average away — the twin's joint angles
and its efforts pointing at different values — is added as a systematic variance from the
channels' disagreement (`channel_disagreement`). The Gauss–Newton curvature is then checked
at the interval's own scale (`curvature_probes`: 2n replays at u* ± 2σ): where the loss rises
less there than `J` predicts — flat, or a ripple whose local slope is not the trend — that
parameter's variance is widened by the ratio (`curvature_scale`). Samples are drawn from
that Gaussian.
`from_samples` fills the same fields from samples instead: the fit's SMC posterior
(twins/fit/posterior_stage.py, `method` "smc-abc") uses it.

A parameter is flagged not identifiable when its relative std exceeds `REL_STD_MAX`, its
90 % interval spans most of its bounds, or it loads on a direction of `JᵀJ` the data
barely constrain (eigenvalue below `EIG_RATIO_MIN` of the largest).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from resources import atomic

Z90 = 1.6448536269514722  # two-sided 90 % of a normal
REL_STD_MAX = 0.5
SPAN_MAX = 0.8  # 90 % interval wider than this share of the normalised range
EIG_RATIO_MIN = 1e-6


@dataclass(frozen=True)
class ParamPosterior:
    """Estimate, per-parameter std and 90 % interval, correlations, identifiability,
    sensitivities (rms residual change per full normalised range), samples and history."""

    names: tuple[str, ...]
    estimate: Mapping[str, float]
    std: Mapping[str, float]
    interval90: Mapping[str, tuple[float, float]]
    correlation: NDArray[np.float64]
    identifiable: Mapping[str, bool]
    why: Mapping[str, str]
    sensitivity: Mapping[str, float]
    samples: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 0)))
    method: str = "laplace"
    history: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Everything but the samples (those go to samples.npz)."""
        return {
            "method": self.method,
            "names": list(self.names),
            "params": {
                n: {
                    "estimate": _finite(self.estimate[n]),
                    "std": _finite(self.std[n]),
                    "interval90": [_finite(v) for v in self.interval90[n]],
                    "identifiable": self.identifiable[n],
                    "why": self.why[n],
                    "sensitivity": self.sensitivity[n],
                }
                for n in self.names
            },
            "correlation": np.nan_to_num(self.correlation).round(4).tolist(),
            "history": [dict(h) for h in self.history],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], samples: NDArray[np.float64] | None = None) -> Any:
        names = tuple(d["names"])
        p = d["params"]
        return cls(
            names,
            {n: _num(p[n]["estimate"]) for n in names},
            {n: _num(p[n]["std"], float("inf")) for n in names},
            {n: (_num(p[n]["interval90"][0]), _num(p[n]["interval90"][1])) for n in names},
            np.asarray(d["correlation"], dtype=float),
            {n: bool(p[n]["identifiable"]) for n in names},
            {n: str(p[n]["why"]) for n in names},
            {n: float(p[n]["sensitivity"]) for n in names},
            samples if samples is not None else np.zeros((0, len(names))),
            str(d.get("method", "laplace")),
            tuple(d.get("history", ())),
        )

    def save_samples(self, folder: Path) -> Path:
        path = Path(folder) / "samples.npz"

        def write(p: Path) -> None:
            with open(p, "wb") as fh:
                np.savez(fh, names=np.array(self.names), x=self.samples)

        atomic.write_with(path, write)
        return path


def _finite(v: float) -> float | None:
    """JSON has no inf/nan: a number that is not finite is written as null."""
    return float(v) if np.isfinite(v) else None


def _num(v: Any, missing: float = float("nan")) -> float:
    return missing if v is None else float(v)


def lag1_autocorrelation(r: NDArray[np.float64]) -> float:
    """Lag-1 autocorrelation of a residual vector (0 for fewer than 3 samples)."""
    if r.size < 3:
        return 0.0
    a = r - r.mean()
    den = float(a @ a)
    return float(a[1:] @ a[:-1] / den) if den > 0 else 0.0


def correlation_time(r: NDArray[np.float64], blocks: Sequence[slice] = ()) -> float:
    """How many residuals one independent residual is worth (>= 1): the integrated
    autocorrelation time by batch means within each block (one replayed window; the whole
    vector when there are none). Residuals are joints x samples x channels flattened, so a
    sample's neighbour in time sits a stride away and lag-1 sees only its sibling joints;
    batch means see every correlation shorter than a batch, whatever the layout — the slow
    model-mismatch wander of a replay included. The mean of the estimates with batches of
    1/4 and 1/2 of a block, capped at the block length."""
    segs = [r[b] for b in blocks if r[b].size >= 16] or ([r] if r.size >= 16 else [])
    if not segs:
        return 1.0
    var = float(np.mean(np.concatenate(segs) ** 2))
    if var <= 0:
        return 1.0
    est = []
    for frac in (4, 2):
        means, sizes = [], []
        for seg in segs:
            b = max(seg.size // frac, 1)
            k = seg.size // b
            means.append(seg[: k * b].reshape(k, b).mean(axis=1))
            sizes.append(np.full(k, b))
        mu, sz = np.concatenate(means), np.concatenate(sizes)
        if mu.size < 4:
            continue
        est.append(float(np.mean(sz * mu**2)) / var)
    tau = float(np.mean(est)) if est else 1.0
    return float(min(max(tau, 1.0), max(s.size for s in segs)))


def residual_scale(
    r: NDArray[np.float64], n: int, blocks: Sequence[slice] = ()
) -> tuple[float, float]:
    """(s², m_eff): the residual variance at a fit, inflated for the residuals'
    correlation (`correlation_time`; lag-1 for a vector too short for batches), and the
    number of residuals that many independent ones are worth."""
    m = r.size
    rho = min(max(lag1_autocorrelation(r), 0.0), 0.99)
    inflate = max((1 + rho) / (1 - rho), correlation_time(r, blocks))
    return float(r @ r) / max(m - n, 1) * inflate, m / inflate


def channel_disagreement(
    J: NDArray[np.float64], r: NDArray[np.float64], masks: Sequence[NDArray[np.bool_]]
) -> NDArray[np.float64]:
    """Per parameter, the std over channels of the step each channel ALONE would take from
    the optimum (linearised: -(J_cᵀJ_c + λ)⁻¹ J_cᵀ r_c, λ the bounds' prior at that
    channel's residual level). With a right model every channel points at the same values
    up to noise; where they pull apart (joint angles against efforts when a twin's friction
    law or its command timing is not the robot's), no amount of data shrinks the error,
    so the spread is a systematic part of the uncertainty. Zeros with fewer than 2
    channels."""
    n = J.shape[1]
    masks = [m for m in masks if m.any()]
    if len(masks) < 2:
        return np.zeros(n)
    steps = []
    for m in masks:
        Jm, rm = J[m], r[m]
        lam = 12.0 * max(float(np.mean(rm**2)), 1e-300)
        steps.append(-np.linalg.solve(Jm.T @ Jm + lam * np.eye(n), Jm.T @ rm))
    return np.asarray(np.std(np.stack(steps), axis=0), dtype=float)


CURVATURE_STEP_MIN = 0.03  # normalised units: the smallest probe of `curvature_probes`
CURVATURE_SCALE_MAX = 400.0  # a variance is widened at most this much (20x the std)


def curvature_probes(
    u_star: NDArray[np.float64], std_u: NDArray[np.float64]
) -> tuple[list[NDArray[np.float64]], NDArray[np.float64]]:
    """Points u* +- delta_i e_i that check the Laplace curvature at the interval's own scale
    (delta_i = 2 std, at least `CURVATURE_STEP_MIN`, inside the bounds; a side beyond a
    bound is probed at the bound). Returns (2n points: plus and minus per parameter, the
    signed steps (n, 2))."""
    n = len(u_star)
    pts, steps = [], np.zeros((n, 2))
    for i in range(n):
        d = float(np.clip(2.0 * std_u[i], CURVATURE_STEP_MIN, 0.25))
        for side, sign in enumerate((1.0, -1.0)):
            u = np.array(u_star, dtype=float)
            u[i] = float(np.clip(u_star[i] + sign * d, 0.0, 1.0))
            steps[i, side] = u[i] - u_star[i]
            pts.append(u)
    return pts, steps


def curvature_scale(
    J: NDArray[np.float64],
    r: NDArray[np.float64],
    steps: NDArray[np.float64],
    losses: NDArray[np.float64],
) -> NDArray[np.float64]:
    """Per parameter, how much flatter the loss (mean of r^2) really is at the probes of
    `curvature_probes` than the Gauss-Newton model r + J du says: the predicted rise
    (linear term removed) over the measured one, >= 1, at most `CURVATURE_SCALE_MAX`.
    A loss that is jagged or flat at the interval's scale (a contact that barely shows a
    friction: the local slope is the jaggedness) gets its variance widened by that
    factor; a smooth quadratic loss gives 1. `losses` (n, 2): the loss at each probe, NaN
    or inf where it failed (no widening from that side)."""
    m = max(r.size, 1)
    n = J.shape[1]
    loss0 = float(np.mean(r**2))
    out = np.ones(n)
    for i in range(n):
        Ji = np.nan_to_num(J[:, i])
        g = 2.0 * float(r @ Ji) / m  # d loss / du_i
        c = float(Ji @ Ji) / m  # Gauss-Newton curvature / 2
        if c <= 0:
            continue
        d, L = steps[i], losses[i]
        ok = (d != 0.0) & np.isfinite(L)
        if ok.all() and abs(d[0] + d[1]) < 1e-12:
            # both sides at the same distance: their mean rise has no linear term
            pred, got = c * d[0] ** 2, float(L.mean()) - loss0
        elif ok.any():  # one side (the other at a bound or failed): remove the slope
            s = int(np.flatnonzero(ok)[0])
            pred, got = c * d[s] ** 2, float(L[s]) - loss0 - g * float(d[s])
        else:
            continue
        out[i] = float(
            np.clip(pred / max(got, pred / CURVATURE_SCALE_MAX), 1.0, CURVATURE_SCALE_MAX)
        )
    return out


def laplace_covariance(
    J: NDArray[np.float64],
    r: NDArray[np.float64],
    blocks: Sequence[slice] = (),
    channels: Sequence[NDArray[np.bool_]] = (),
) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.bool_], float]:
    """The Laplace covariance of the normalised parameters (see `laplace`): (cov, columns
    with a finite Jacobian, parameters on a direction the data barely constrain, the mean
    variance inflation the window-clustered (sandwich) check applied, ≥ 1). `channels`
    (one mask of `r` per channel) add `channel_disagreement`² to the variances."""
    n = J.shape[1]
    ok_cols = np.all(np.isfinite(J), axis=0)
    s2, _ = residual_scale(r, n, blocks)
    # The bounds' uniform prior, as a Gaussian with its variance (1/12 in normalised units),
    # keeps what the data cannot see at the prior's width: a direction the residuals do not
    # constrain gets a wide interval (and is flagged), never the zero width a truncated
    # pseudo-inverse gives it. Failed columns keep the prior alone, uncorrelated.
    prior_prec = 12.0
    cov_u = np.eye(n) / prior_prec
    eig_flag = np.zeros(n, dtype=bool)
    inflation = 1.0
    if ok_cols.any():
        Jk = J[:, ok_cols]
        H = Jk.T @ Jk
        idx = np.flatnonzero(ok_cols)
        Hinv = np.linalg.inv(H + prior_prec * max(s2, 1e-300) * np.eye(len(idx)))
        cov_k = s2 * Hinv
        if len(blocks) > 1:
            g = np.stack([Jk[b].T @ r[b] for b in blocks])
            B = len(blocks)
            sandwich = Hinv @ (g.T @ g) @ Hinv * (B / (B - 1))
            dl, ds = np.diag(cov_k), np.diag(sandwich)
            with np.errstate(divide="ignore", invalid="ignore"):
                scale = np.sqrt(np.where(dl > 0, np.maximum(ds / dl, 1.0), 1.0))
            cov_k = cov_k * np.outer(scale, scale)
            inflation = float(np.mean(scale**2))
        if channels:
            sys_sd = channel_disagreement(Jk, r, channels)
            cov_k = cov_k + np.diag(sys_sd**2)
        cov_u[np.ix_(idx, idx)] = cov_k
        d = np.sqrt(np.maximum(np.diag(H), 1e-300))
        w, V = np.linalg.eigh(H / np.outer(d, d))
        weak = w < EIG_RATIO_MIN * max(float(w.max()), 1e-300)
        for k in np.flatnonzero(weak):
            eig_flag[idx[np.abs(V[:, k]) > 0.3]] = True
    return cov_u, ok_cols, eig_flag, inflation


def laplace(
    names: Sequence[str],
    u_star: NDArray[np.float64],
    J: NDArray[np.float64],
    r: NDArray[np.float64],
    to_x: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    n_samples: int = 400,
    seed: int = 0,
    history: Sequence[Mapping[str, Any]] = (),
    blocks: Sequence[slice] = (),
    channels: Sequence[NDArray[np.bool_]] = (),
    var_scale: NDArray[np.float64] | None = None,
) -> ParamPosterior:
    """Laplace posterior from residuals `r` (m,) and their Jacobian `J` (m, n) with respect
    to the normalised parameters `u_star` in [0, 1]; `to_x` maps normalised to physical.
    `blocks` (one slice of `r` per replayed window) add a cluster-robust (sandwich) check:
    errors within a window are correlated (the initial state's noise runs through it), and
    when the windows scatter more than the residual variance says, a parameter's variance
    is raised to the cluster-robust one (correlations kept from the Laplace part).
    `channels` (one mask of `r` per recorded channel) add the channels' disagreement as a
    systematic variance (`channel_disagreement`). `var_scale` (n,) multiplies each
    parameter's variance (`curvature_scale`: the loss flatter at the interval's scale than
    its local slope says), correlations kept."""
    n = len(names)
    m = r.size
    cov_u, ok_cols, eig_flag, _ = laplace_covariance(J, r, blocks, channels)
    if var_scale is not None:
        k = np.sqrt(np.maximum(np.asarray(var_scale, dtype=float), 1.0))
        cov_u = cov_u * np.outer(k, k)
    std_u = np.sqrt(np.clip(np.diag(cov_u), 0, None))
    x_star = to_x(u_star)
    est, std, iv, ident, why, sens = {}, {}, {}, {}, {}, {}
    for i, name in enumerate(names):
        est[name] = float(x_star[i])
        sens[name] = float(np.linalg.norm(J[:, i]) / np.sqrt(max(m, 1))) if ok_cols[i] else 0.0
        if not ok_cols[i]:
            lo_b, hi_b = to_x(np.zeros(n))[i], to_x(np.ones(n))[i]
            iv[name] = (float(lo_b), float(hi_b))
            std[name] = float(abs(hi_b - lo_b) / np.sqrt(12.0))
            ident[name] = False
            why[name] = "simulations failed around the estimate; no local sensitivity (prior kept)"
            continue
        lo_u = np.array(u_star, dtype=float)
        hi_u = np.array(u_star, dtype=float)
        lo_u[i] = max(0.0, u_star[i] - Z90 * std_u[i])
        hi_u[i] = min(1.0, u_star[i] + Z90 * std_u[i])
        lo, hi = float(to_x(lo_u)[i]), float(to_x(hi_u)[i])
        iv[name] = (lo, hi)
        # std in physical units from the local slope of the map
        std[name] = float((hi - lo) / (2 * Z90)) if std_u[i] > 0 else 0.0
        reasons = []
        if abs(est[name]) > 0 and std[name] / abs(est[name]) > REL_STD_MAX:
            reasons.append(f"relative std {std[name] / abs(est[name]):.2f} > {REL_STD_MAX}")
        if hi_u[i] - lo_u[i] > SPAN_MAX:
            reasons.append("90 % interval spans most of its bounds")
        if eig_flag[i]:
            reasons.append("on a direction the data do not constrain (correlated with others)")
        if sens[name] == 0.0:
            reasons.append("the residuals do not change with it")
        ident[name] = not reasons
        why[name] = "; ".join(reasons)
    d = np.sqrt(np.clip(np.diag(cov_u), 1e-300, None))
    corr = cov_u / np.outer(d, d)
    samples = np.zeros((0, n))
    if n_samples and np.all(np.isfinite(cov_u)):
        rng = np.random.default_rng(seed)
        U = rng.multivariate_normal(u_star, cov_u, size=n_samples, check_valid="ignore")
        samples = np.stack([to_x(np.clip(u, 0.0, 1.0)) for u in U])
    return ParamPosterior(
        tuple(names), est, std, iv, corr, ident, why, sens, samples, "laplace", tuple(history)
    )


def from_samples(
    base: ParamPosterior,
    U: NDArray[np.float64],
    to_x: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    method: str,
    history: Sequence[Mapping[str, Any]] = (),
) -> ParamPosterior:
    """A posterior whose spread comes from samples `U` (k, n) of the normalised parameters
    (equally weighted), around `base`'s point estimate: 90 % intervals are the samples' 5th
    and 95th percentiles (asymmetric where the posterior is), correlations theirs. The
    identifiability rules are `laplace`'s, judged on the samples; reasons `base` found in
    the Jacobian (a direction the data do not constrain, no sensitivity, failed
    simulations) are kept."""
    names = base.names
    X = np.stack([to_x(u) for u in U])
    lo_u, hi_u = np.quantile(U, [0.05, 0.95], axis=0)
    std, iv, ident, why = {}, {}, {}, {}
    for i, name in enumerate(names):
        lo, hi = np.quantile(X[:, i], [0.05, 0.95])
        iv[name] = (float(lo), float(hi))
        std[name] = float(np.std(X[:, i]))
        est = base.estimate[name]
        reasons = [
            r
            for r in base.why[name].split("; ")
            if r and ("direction" in r or "do not change" in r or "failed" in r)
        ]
        if abs(est) > 0 and std[name] / abs(est) > REL_STD_MAX:
            reasons.insert(0, f"relative std {std[name] / abs(est):.2f} > {REL_STD_MAX}")
        if hi_u[i] - lo_u[i] > SPAN_MAX:
            reasons.insert(0, "90 % interval spans most of its bounds")
        ident[name] = not reasons
        why[name] = "; ".join(reasons)
    corr = np.corrcoef(U.T).reshape(len(names), len(names)) if len(U) > 1 else base.correlation
    corr = np.where(np.isfinite(corr), corr, 0.0)
    return ParamPosterior(
        names,
        dict(base.estimate),
        std,
        iv,
        corr,
        ident,
        why,
        dict(base.sensitivity),
        X,
        method,
        tuple(history) or base.history,
    )
