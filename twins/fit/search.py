"""The fit's search, stage by stage (twins/fit/steps.py `fit_steps` runs them in this order):

1. `start`: score the start (the twin's own values) on the training windows;
2. `global_stage` (optional): scrambled-Sobol points over the whole box, the best kept;
3. `cmaes`: CMA-ES in u-space, with a checkpoint every generation and an early stop when
   the best loss stalls;
4. `latency_scan`: the basins of the latency (twins/fit/latency.py);
5. `polish`: least squares (trust region) in rounds, so the job can yield and be
   cancelled, with a central-difference Jacobian computed in parallel;
6. `uncertainty`: the Jacobian at the optimum and the curvature probes for the Laplace
   posterior (twins/fit/posterior.py).

`FitSearch` keeps what the stages share: the problem, the executor, the counters of
replays and failures, the best point so far and the history. Each stage is a job
(resources/jobs.py): it yields `Progress`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from devices.trajectory import Trajectory
from resources.jobs import Job, Progress
from twins.executor import Executor
from twins.fit.latency import latency_candidates
from twins.fit.objective import (
    FAILED_RESIDUAL,
    Outcome,
    Problem,
    Space,
    evaluate,
    residual_size,
)
from twins.fit.posterior import curvature_probes, curvature_scale, laplace_covariance

if TYPE_CHECKING:
    from twins.fit.steps import FitConfig

FD_STEP = 0.01  # central-difference step in normalised units (1 % of the range)
STALL_TOL = 0.01  # CMA-ES stalls when its best loss improves less than this share

Stage = Job[None]


class FitSearch:
    """One fit's search state. `run(us)` replays candidates (normalised u) through the
    executor and counts them; the stages move `best_u`/`best_loss` and append `history`."""

    def __init__(
        self,
        space: Space,
        train: Problem,
        config: FitConfig,
        executor: Executor,
        notes: list[str],
        resume: Mapping[str, Any] | None = None,
    ) -> None:
        self.space, self.train, self.config, self.ex = space, train, config, executor
        self.notes = notes
        self.resume = resume
        self.n = len(space.names)
        self.evals = 0
        self.failed = 0
        self.last_error = ""
        self.history: list[dict[str, Any]] = list(resume.get("history", [])) if resume else []
        self.u0 = space.to_u(np.array([train.spec.params[n].nominal for n in space.names]))
        self.best_u, self.best_loss = self.u0.copy(), math.inf
        self.mean_u, self.sigma = self.u0, config.sigma0
        self.done_before = 0  # evaluations a resumed fit had already spent
        self.global_evals = 0
        self.total = 1
        self.m = residual_size(train)
        self._J: dict[bytes, NDArray[np.float64]] = {}

    # -- replays ----------------------------------------------------------------------------
    def run(self, us: Sequence[NDArray[np.float64]], prob: Problem | None = None) -> list[Outcome]:
        """Replay each candidate on `prob` (the training windows unless told); training
        replays are counted, and a failed one's message kept."""
        p = self.train if prob is None else prob
        outs = list(self.ex.map(evaluate, [(p, np.asarray(u, dtype=float)) for u in us]))
        if p is self.train:
            self.evals += len(outs)
            bad = [o for o in outs if o.residuals is None]
            self.failed += len(bad)
            if bad:
                self.last_error = bad[-1].error
        return outs

    def residuals(self, o: Outcome) -> NDArray[np.float64]:
        """A replay's residuals; a failed one (or one of the wrong size) as the penalty."""
        r = o.residuals
        if r is None or r.size != self.m or not np.all(np.isfinite(r)):
            return np.full(self.m, FAILED_RESIDUAL)
        return r

    def jacobian(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        """Central differences in u (2n replays in one batch); NaN where a side failed."""
        pts, steps = [], []
        for i in range(self.n):
            hi, lo = min(u[i] + FD_STEP, 1.0), max(u[i] - FD_STEP, 0.0)
            up, dn = u.copy(), u.copy()
            up[i], dn[i] = hi, lo
            pts += [up, dn]
            steps.append(hi - lo)
        outs = self.run(pts)
        J = np.empty((self.m, self.n))
        for i in range(self.n):
            a, b = outs[2 * i], outs[2 * i + 1]
            if a.residuals is None or b.residuals is None:
                J[:, i] = np.nan
            else:
                J[:, i] = (self.residuals(a) - self.residuals(b)) / steps[i]
        return J

    def cached_jacobian(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        """The Jacobian at `u`, computed once per point (least squares asks twice)."""
        key = np.asarray(u).tobytes()
        if key not in self._J:
            self._J.clear()
            self._J[key] = self.jacobian(np.asarray(u, dtype=float))
        return self._J[key]

    def fraction(self) -> float:
        return min((self.evals - self.done_before - 1) / self.total, 0.99)

    def _record(self, stage: str, **extra: Any) -> dict[str, Any]:
        rec = {"stage": stage, **extra, "evals": self.evals, "best_loss": self.best_loss}
        return rec

    def _keep(self, u: NDArray[np.float64], loss: float) -> None:
        if loss < self.best_loss:
            self.best_u, self.best_loss = np.asarray(u, dtype=float), loss

    # -- stages -----------------------------------------------------------------------------
    def start(self, n_windows: int) -> Job[Outcome]:
        """Score the start; take up a resumed fit's CMA-ES state."""
        yield Progress(0.0, f"scoring the start on {n_windows} windows")
        out = self.run([self.u0])[0]
        self.best_loss = out.loss
        if self.resume:
            r = self.resume
            self.mean_u = np.asarray(r["mean_u"], dtype=float)
            self.sigma = float(r["sigma"])
            self.best_u = np.asarray(r["best_u"], dtype=float)
            self.best_loss = float(r["best_loss"])
            self.done_before = int(r.get("evals", 0))
            self.evals += self.done_before
        return out

    @property
    def budget(self) -> int:
        return max(self.config.budget - self.done_before, 0)

    def global_stage(self) -> Stage:
        """A coarse global stage: a local search from the start can settle in the wrong
        basin (restitution and friction trade off against each other in a bounce)."""
        k_pts = self.config.global_samples
        if k_pts <= 0 or self.resume:
            return
        from scipy.stats import qmc  # scipy.stats takes ~0.3 s to import; most fits skip it

        m2 = 1 << max(int(math.ceil(math.log2(k_pts))), 0)
        pts = qmc.Sobol(self.n, scramble=True, seed=self.config.seed).random(m2)[:k_pts]
        outs = self.run(list(pts))
        self.global_evals = len(outs)
        losses = [o.loss for o in outs]
        k = int(np.argmin(losses))
        if losses[k] < self.best_loss:
            self._keep(pts[k], losses[k])
            self.mean_u = self.best_u.copy()
        rec = {
            **self._record("global"),
            "failed": self.failed,
            "best": self.space.values(self.best_u),
        }
        self.history.append(rec)
        yield Progress(None, f"global stage ({len(pts)} points): loss {self.best_loss:.4g}", rec)

    def plan_total(self) -> None:
        """The progress bar's length in replays, the polish included: a round takes up to
        6 (2n + 1) evaluations, usually about a third of that; + the curvature probes."""
        polish = self.config.polish_rounds * 2 * (2 * self.n + 1)
        self.total = self.global_evals + self.budget + polish + 1 + 2 * self.n

    def cmaes(self) -> Stage:
        """CMA-ES in u-space within the budget; every generation yields a checkpoint."""
        import warnings

        with warnings.catch_warnings():  # cma warns that matplotlib (for its plots) is missing
            warnings.simplefilter("ignore", UserWarning)
            import cma  # 170 modules: loaded when a fit runs, not when the CLI starts

        cfg, n = self.config, self.n
        if self.budget <= 0:
            return
        opts: dict[str, Any] = {
            "bounds": [0.0, 1.0],
            "seed": cfg.seed + 1 + self.done_before,
            "verbose": -9,
            "maxfevals": self.budget,
            "tolfun": 1e-9,
        }
        if cfg.popsize:
            opts["popsize"] = cfg.popsize
        # cma needs two dimensions; a one-parameter fit carries a dummy coordinate that the
        # objective ignores
        start = list(self.mean_u) + [0.5] * (1 if n == 1 else 0)
        es = cma.CMAEvolutionStrategy(start, self.sigma, opts)
        gen = 0
        bests: list[float] = []
        while not es.stop():
            raw = es.ask()
            X = [np.clip(np.asarray(x)[:n], 0.0, 1.0) for x in raw]
            losses = [o.loss for o in self.run(X)]
            es.tell(raw, losses)
            k = int(np.argmin(losses))
            if losses[k] < self.best_loss:
                self.best_u, self.best_loss = X[k].copy(), losses[k]
            gen += 1
            rec = {
                **self._record("cmaes", generation=gen),
                "gen_best_loss": losses[k],
                "sigma": float(es.sigma),
                "failed": self.failed,
                "best": self.space.values(self.best_u),
            }
            self.history.append(rec)
            yield Progress(
                self.fraction(),
                f"CMA-ES gen {gen}: loss {self.best_loss:.4g} ({self.failed} failed)",
                {**rec, "checkpoint": self._checkpoint(es), "last_error": self.last_error[:300]},
            )
            bests.append(self.best_loss)
            k_ago = cfg.stall_generations
            if (
                k_ago
                and len(bests) > k_ago
                and self.best_loss > (1 - STALL_TOL) * bests[-1 - k_ago]
            ):
                self.notes.append(
                    f"CMA-ES stopped after generation {gen}: the best loss improved less than "
                    f"{STALL_TOL:.0%} over {k_ago} generations (the polish takes over)"
                )
                break

    def _checkpoint(self, es: Any) -> dict[str, Any]:
        n = self.n
        return {
            "mean_u": [float(v) for v in es.mean[:n]],
            "sigma": float(es.sigma),
            "best_u": [float(v) for v in self.best_u],
            "best_loss": self.best_loss,
            # the start's and the global stage's evaluations are not CMA budget
            "evals": self.evals - 1 - self.global_evals,
            "history": self.history,
        }

    def latency_scan(self, train_windows: Sequence[Trajectory]) -> None:
        """The basins of the latency (twins/fit/latency.py): each candidate is replayed."""
        scan = latency_candidates(self.space, train_windows, self.best_u)
        for u, o in zip(scan, self.run(scan) if scan else [], strict=True):
            if o.loss < self.best_loss:
                self.best_u, self.best_loss = u, o.loss

    def polish(self) -> Stage:
        """Least squares from the best point, in rounds of at most 6 evaluations, until a
        round no longer improves the loss."""
        from scipy.optimize import least_squares

        for rnd in range(self.config.polish_rounds):
            try:
                sol = least_squares(
                    lambda u: self.residuals(self.run([u])[0]),
                    np.clip(self.best_u, 1e-9, 1 - 1e-9),
                    jac=lambda u: np.nan_to_num(self.cached_jacobian(u)),
                    bounds=(0.0, 1.0),
                    max_nfev=6,
                    method="trf",
                    x_scale="jac",
                )
            except (ValueError, np.linalg.LinAlgError) as exc:
                self.notes.append(f"least-squares polish stopped: {exc}")
                break
            new_loss = float(np.mean(sol.fun**2)) if sol.fun.size else 0.0
            improved = new_loss < self.best_loss * (1 - 1e-5)
            if new_loss < self.best_loss:
                self.best_u, self.best_loss = np.asarray(sol.x, dtype=float), new_loss
            rec = {
                **self._record("polish", round=rnd + 1),
                "failed": self.failed,
                "best": self.space.values(self.best_u),
            }
            self.history.append(rec)
            yield Progress(
                self.fraction(),
                f"least-squares polish {rnd + 1}: loss {self.best_loss:.4g}",
                rec,
            )
            if not improved:
                break

    def uncertainty(
        self,
        r_final: NDArray[np.float64],
        blocks: Sequence[slice],
        masks: Any,
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(J, var_scale) at the optimum: the Gauss-Newton curvature checked at the
        interval's own scale (2n replays); a loss flatter or more jagged there than its
        local slope says gets a wider interval (noted)."""
        J = self._J.get(self.best_u.tobytes())
        if J is None:
            J = self.jacobian(self.best_u)
        cov_u = laplace_covariance(np.nan_to_num(J), r_final, blocks, masks)[0]
        probes, steps = curvature_probes(self.best_u, np.sqrt(np.clip(np.diag(cov_u), 0.0, None)))
        outs = self.run(probes)
        probe_loss = np.array(
            [o.loss if o.residuals is not None else np.nan for o in outs], dtype=float
        ).reshape(self.n, 2)
        var_scale = curvature_scale(np.nan_to_num(J), r_final, steps, probe_loss)
        for name, k in zip(self.space.names, var_scale, strict=True):
            if k > 2.0:
                self.notes.append(
                    f"{name}: the loss is flatter at its interval's scale than its local "
                    f"slope says; interval widened x{math.sqrt(k):.1f}"
                )
        return J, var_scale
