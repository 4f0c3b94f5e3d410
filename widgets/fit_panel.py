"""The Calibrate page's "Fit…" window: choose parameters, run the fit job
(app.workflows.fit.fit_job) with a live convergence plot (best objective vs rollouts), then
the posterior as a pair plot (corner plot of its samples) and "Apply" (a new twin version
whose parent is the fitted twin).

The job runs on the main window's job pool (progress and Cancel also in the status bar);
its progress records reach this window through a queued signal, so the GUI thread only draws.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from app.controller import AppController
from app.workflows import fit as fit_flow
from resources.jobs import Progress, tap_progress
from twins.fit import FitConfig

log = logging.getLogger(__name__)
MAX_PAIR = 5  # parameters in the pair plot (the most sensitive first)


def _short(name: str) -> str:
    """The last two parts of a dotted name ("pendulum.damping")."""
    return ".".join(name.split(".")[-2:])


def _apply_job(project: Any, fit_id: str) -> Any:
    yield Progress(None, f"saving {fit_id} as a new twin version")
    return fit_flow.apply_fit(project, fit_id)


class PairPlot(pg.GraphicsLayoutWidget):
    """Corner plot: histograms on the diagonal, sample scatter below it, the estimate in red."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setBackground("w")
        self.shown: list[str] = []

    def show_samples(
        self, names: Sequence[str], x: np.ndarray, estimate: dict[str, float] | None = None
    ) -> None:
        self.clear()
        self.shown = list(names)
        n = len(names)
        if n == 0 or x.shape[0] < 2:
            self.addLabel("no posterior samples to show", row=0, col=0, color="#555")
            return
        est = estimate or {}
        for i in range(n):
            for j in range(i + 1):
                p = self.addPlot(row=i, col=j)
                p.getAxis("left").enableAutoSIPrefix(False)
                p.getAxis("bottom").enableAutoSIPrefix(False)
                p.getAxis("left").setStyle(showValues=j == 0 and i > 0)
                p.getAxis("bottom").setStyle(showValues=i == n - 1)
                if i == n - 1:
                    p.setLabel("bottom", _short(names[j]))
                if i == j:  # the parameter's name over its histogram; rows share it
                    p.setTitle(_short(names[i]), size="8pt")
                if i == j:
                    y, edges = np.histogram(x[:, i], bins=20)
                    p.plot(edges, y, stepMode="center", fillLevel=0, brush=(31, 119, 180, 120))
                    if names[i] in est:
                        p.addItem(pg.InfiniteLine(est[names[i]], pen=pg.mkPen("#d62728")))
                else:
                    p.plot(
                        x[:, j],
                        x[:, i],
                        pen=None,
                        symbol="o",
                        symbolSize=3,
                        symbolPen=None,
                        symbolBrush=(31, 119, 180, 90),
                    )
                    if names[i] in est and names[j] in est:
                        p.plot(
                            [est[names[j]]],
                            [est[names[i]]],
                            pen=None,
                            symbol="+",
                            symbolSize=12,
                            symbolPen=pg.mkPen("#d62728", width=2),
                        )


class FitDialog(QtWidgets.QDialog):
    """Choose parameters, fit, watch it converge, see the posterior, apply."""

    sig_progress = QtCore.Signal(object)  # Progress (from the job's thread, queued)
    sig_applied = QtCore.Signal(str)  # the new twin's id

    def __init__(
        self,
        controller: AppController,
        twin_id: str,
        trajectory_ids: Sequence[str],
        params: Any,
        preselected: Sequence[str] = (),
        parent: QtWidgets.QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Fit {twin_id} to {len(trajectory_ids)} recording(s)")
        self.controller = controller
        self.twin_id = twin_id
        self.trajectory_ids = list(trajectory_ids)
        self.fit_id: str | None = None
        self._stop = threading.Event()
        self._running = False
        self.evals: list[float] = []
        self.best: list[float] = []
        lay = QtWidgets.QHBoxLayout(self)
        left = QtWidgets.QVBoxLayout()
        left.addWidget(QtWidgets.QLabel("<b>Parameters to fit</b> (tick)"))
        self.param_list = QtWidgets.QListWidget()
        for name, p in params.items():
            it = QtWidgets.QListWidgetItem(name)
            it.setToolTip(f"{p.low:g} … {p.high:g} {p.unit}, prior {p.prior}")
            it.setFlags(it.flags() | QtCore.Qt.ItemFlag.ItemIsUserCheckable)
            it.setCheckState(
                QtCore.Qt.CheckState.Checked
                if name in preselected
                else QtCore.Qt.CheckState.Unchecked
            )
            self.param_list.addItem(it)
        left.addWidget(self.param_list, 1)
        form = QtWidgets.QFormLayout()
        self.budget = QtWidgets.QSpinBox()
        self.budget.setRange(4, 5000)
        self.budget.setValue(60)
        self.budget.setToolTip("CMA-ES simulations (each replays every training window once)")
        form.addRow("budget (simulations)", self.budget)
        self.window_s = QtWidgets.QDoubleSpinBox()
        self.window_s.setRange(0.1, 60.0)
        self.window_s.setValue(1.0)
        self.window_s.setSuffix(" s")
        self.window_s.setToolTip("each recording is replayed in windows of this length")
        form.addRow("replay window", self.window_s)
        self.posterior = QtWidgets.QComboBox()
        self.posterior.addItem("Laplace (at the estimate)", "laplace")
        self.posterior.addItem("SMC samples (≈ 10x the replays)", "smc")
        self.posterior.setToolTip(
            "how the uncertainty is found: a Gaussian at the estimate (no extra replays), or "
            "64 particles moved by sequential Monte Carlo (skewed, curved or bound-pressed "
            "posteriors come out as they are)"
        )
        form.addRow("posterior", self.posterior)
        left.addLayout(form)
        buttons = QtWidgets.QHBoxLayout()
        self.start_btn = QtWidgets.QPushButton("Start fit")
        self.start_btn.clicked.connect(self.start)
        self.stop_btn = QtWidgets.QPushButton("Stop")
        self.stop_btn.setToolTip("stop at the next step; the fit is saved as resumable")
        self.stop_btn.setEnabled(False)
        self.stop_btn.clicked.connect(self._stop.set)
        buttons.addWidget(self.start_btn)
        buttons.addWidget(self.stop_btn)
        left.addLayout(buttons)
        lay.addLayout(left, 2)
        right = QtWidgets.QVBoxLayout()
        self.curve_plot = pg.PlotWidget(background="w")
        self.curve_plot.setTitle("best objective so far vs simulations run", size="9pt")
        self.curve_plot.setLabel("bottom", "simulations (each replays every training window)")
        # log10 on a plain axis: pyqtgraph's log axis crowds its minor labels
        self.curve_plot.setLabel("left", "log10 objective")
        for ax in ("left", "bottom"):
            self.curve_plot.getAxis(ax).enableAutoSIPrefix(False)
        self.curve_plot.showGrid(x=True, y=True, alpha=0.25)
        self.curve = self.curve_plot.plot(
            [], [], pen=pg.mkPen("#1f77b4", width=2), symbol="o", symbolSize=4
        )
        right.addWidget(self.curve_plot, 2)
        right.addWidget(QtWidgets.QLabel("<b>Posterior</b> (samples; red: the estimate)"))
        self.pair = PairPlot()
        right.addWidget(self.pair, 3)
        self.summary = QtWidgets.QLabel("Tick the parameters to fit and press Start fit.")
        self.summary.setWordWrap(True)
        right.addWidget(self.summary)
        self.apply_btn = QtWidgets.QPushButton("Apply (new twin version)")
        self.apply_btn.setToolTip(
            "save the fitted values as a new twin whose parent is the fitted twin and whose "
            "inputs are the recordings"
        )
        self.apply_btn.setEnabled(False)
        self.apply_btn.clicked.connect(self.apply)
        right.addWidget(self.apply_btn)
        lay.addLayout(right, 5)
        self.sig_progress.connect(self._on_progress, QtCore.Qt.ConnectionType.QueuedConnection)
        self.resize(980, 640)
        self._show_latest_fit()

    def _show_latest_fit(self) -> None:
        """A finished fit of this twin already in the project is shown (posterior, Apply)."""
        proj = self.controller.project
        if proj is None:
            return
        for art in reversed(proj.artifacts("fit")):
            if art.settings.get("twin") != self.twin_id or art.settings.get("status"):
                continue  # another twin's, or cancelled
            try:
                self.show_fit(art.id)
            except Exception as exc:  # an unreadable old fit must not stop a new one
                log.warning("cannot show %s: %s", art.id, exc)
                continue
            self.summary.setText("Latest fit of this twin: " + self.summary.text())
            return

    def chosen(self) -> list[str]:
        return [
            self.param_list.item(i).text()
            for i in range(self.param_list.count())
            if self.param_list.item(i).checkState() == QtCore.Qt.CheckState.Checked
        ]

    def start(self) -> None:
        proj = self.controller.project
        names = self.chosen()
        if proj is None or not names or self._running:
            self.summary.setText("Tick at least one parameter to fit.")
            return
        config = FitConfig(
            params=tuple(names),
            budget=self.budget.value(),
            window_s=self.window_s.value(),
            posterior=str(self.posterior.currentData()),
        )
        try:
            # replays in a worker process: in this one they hold the GIL (window stalls)
            job = fit_flow.fit_job(proj, self.twin_id, self.trajectory_ids, config, isolated=True)
        except Exception as exc:  # bad choice: the job raises before its first yield
            self.summary.setText(f"Cannot fit: {exc}")
            return
        self._stop.clear()
        self.evals, self.best = [], []
        self.curve.setData([], [])
        self._running = True
        self.start_btn.setEnabled(False)
        self.stop_btn.setEnabled(True)
        self.apply_btn.setEnabled(False)
        self.summary.setText(f"fitting {len(names)} parameters…")
        tapped = tap_progress(job, self._from_job, self._stop)
        self.controller.submit_job(
            f"Fit {self.twin_id}",
            tapped,
            lambda fid: QtCore.QTimer.singleShot(0, self, lambda: self._done(fid)),
            lambda msg: QtCore.QTimer.singleShot(0, self, lambda: self._failed(msg)),
        )

    def _from_job(self, p: Any) -> None:
        try:
            self.sig_progress.emit(p)
        except RuntimeError:  # the window is gone
            pass

    def _on_progress(self, p: Any) -> None:
        part = p.partial
        if isinstance(part, dict) and "best_loss" in part and "evals" in part:
            self.evals.append(float(part["evals"]))
            self.best.append(max(float(part["best_loss"]), 1e-12))
            self.curve.setData(self.evals, np.log10(self.best))
        self.summary.setText(p.message)

    def _failed(self, msg: str) -> None:
        self._running = False
        self.start_btn.setEnabled(True)
        self.stop_btn.setEnabled(False)
        self.summary.setText(f"Fit failed: {msg}")

    def _done(self, fit_id: str | None) -> None:
        self._running = False
        self.start_btn.setEnabled(True)
        self.stop_btn.setEnabled(False)
        self.controller.notify_project_changed()
        if fit_id is None:
            self.summary.setText("Fit stopped; it is saved as a resumable fit artifact.")
            return
        self.show_fit(fit_id)

    def show_fit(self, fit_id: str) -> None:
        """Draw a finished fit's posterior and offer Apply."""
        proj = self.controller.project
        if proj is None:
            return
        names, x, d = fit_flow.fit_samples(proj, fit_id)
        self.fit_id = fit_id
        post = d.get("posterior", {}).get("params", {})
        order = sorted(names, key=lambda n: -float(post.get(n, {}).get("sensitivity", 0.0)))
        shown = order[:MAX_PAIR]
        cols = [names.index(n) for n in shown]
        self.pair.show_samples(shown, x[:, cols] if x.size else x, dict(d.get("estimate", {})))
        lines = []
        for n in names:
            p = post.get(n, {})
            lo, hi = p.get("interval90", [float("nan")] * 2)
            ok = "" if p.get("identifiable", True) else "  (not pinned down)"
            lines.append(f"{n} = {d['estimate'][n]:.4g}  [90 %: {lo:.4g} … {hi:.4g}]{ok}")
        val = d.get("validation_rmse_after") or d.get("train_rmse_after") or {}
        errs = ", ".join(f"{k} {v:.4g}" for k, v in val.items() if v is not None)
        self.summary.setText(
            f"{fit_id}: " + "; ".join(lines) + (f". RMSE after: {errs}" if errs else "")
        )
        self.apply_btn.setEnabled(d.get("status") == "done")

    def apply(self) -> None:
        """Save the fit as a new twin version (a job: it copies the twin's files)."""
        proj = self.controller.project
        if proj is None or self.fit_id is None:
            return
        self.apply_btn.setEnabled(False)
        self.summary.setText(f"applying {self.fit_id}…")
        self.controller.submit_job(
            f"Apply {self.fit_id}",
            _apply_job(proj, self.fit_id),
            lambda tid: QtCore.QTimer.singleShot(0, self, lambda: self._applied(tid)),
            lambda msg: QtCore.QTimer.singleShot(0, self, lambda: self._failed(msg)),
        )

    def _applied(self, new_id: str) -> None:
        log.info("applied %s: new twin %s", self.fit_id, new_id)
        self.summary.setText(f"Applied: new twin {new_id} (parent {self.twin_id}).")
        self.controller.notify_project_changed()
        self.sig_applied.emit(new_id)

    def closeEvent(self, event: Any) -> None:  # noqa: N802 (Qt name)
        self._stop.set()  # a running fit stops at its next step (saved, resumable)
        super().closeEvent(event)
