"""Policies page (workflow step: policies): train a policy in the twin, watch it learn,
see how it does.

Left, in three tabs (widgets/policy_setup.py): the task (from `policies.tasks.TASKS`, its main settings with units)
and the twin; the randomization (none, by hand per parameter, or a fit's posterior) with
the training distribution drawn next to the posterior; the trainer (CEM over a motion
primitive, or PPO) and its budget. Train runs `main.py train` in a child process
(app.workflows.train.train_subprocess_job) on the main window's job pool: a live learning
curve, a progress bar, Cancel (the run keeps its checkpoint) and Resume. Below: the
project's policies with their twin success rate and 95 % interval (nominal twin and under
their randomization), lineage (twin, fit) and Evaluate (a job writing a `run` artifact).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from app.workflows import train as train_flow
from app.workflows.sim_real import sim_real_table
from resources.jobs import tap_progress
from resources.project import Project
from widgets.pages import StatusLine, WorkflowPage, preview
from widgets.policies_views import DistributionView, PolicyTable
from widgets.policy_setup import TrainSetup, wrapped_label
from widgets.sim_real_view import SimRealView

log = logging.getLogger(__name__)
IDLE = "Choose a task, a twin and a trainer, then press Train."


class PoliciesPage(WorkflowPage):
    """Workflow page for the 'policies' step; constructed as `PoliciesPage(controller, parent=None)`."""

    step = "policies"
    sig_progress = QtCore.Signal(object)  # Progress from the training job's thread (queued)

    def build_body(self, layout: QtWidgets.QVBoxLayout) -> None:
        self._stop = threading.Event()
        self._running = False
        self._argv: list[str] = []
        self._run: str | None = None
        self._run_saved = False
        self._shown_run: str | None = None  # the run whose curve the plot shows
        top = QtWidgets.QHBoxLayout()
        layout.addLayout(top, 3)
        left = QtWidgets.QVBoxLayout()
        top.addLayout(left, 2)
        self.status = StatusLine(IDLE)
        self.dist_view = DistributionView()
        self.setup = TrainSetup(self.controller, self.dist_view)
        self.setup.sig_message.connect(lambda text: self.status.setText(text))
        left.addWidget(self.setup, 1)
        row = QtWidgets.QHBoxLayout()
        self.train_btn = QtWidgets.QPushButton("Train")
        self.train_btn.setToolTip("train in a separate process; the app stays usable")
        self.train_btn.clicked.connect(self.start_training)
        self.cancel_btn = QtWidgets.QPushButton("Cancel")
        self.cancel_btn.setToolTip("stop after the current step; the run keeps a checkpoint")
        self.cancel_btn.setEnabled(False)
        self.cancel_btn.clicked.connect(self.cancel_training)
        self.resume_btn = QtWidgets.QPushButton("Resume")
        self.resume_btn.setToolTip("continue the interrupted run from its checkpoint")
        self.resume_btn.setEnabled(False)
        self.resume_btn.clicked.connect(self.resume_training)
        for b in (self.train_btn, self.cancel_btn, self.resume_btn):
            row.addWidget(b)
        left.addLayout(row)
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setValue(0)
        left.addWidget(self.progress)
        left.addWidget(self.status)
        self.views = QtWidgets.QTabWidget()
        top.addWidget(self.views, 3)
        self.curve_view = pg.GraphicsLayoutWidget()
        self.curve_view.setBackground("w")
        self.curve_plot = self.curve_view.addPlot(row=0, col=0)
        self.curve_plot.setLabel("left", "success")
        self.curve_plot.setYRange(0.0, 1.05, padding=0)
        self.score_plot = self.curve_view.addPlot(row=1, col=0)
        self.score_plot.setLabel("left", "score")
        self.score_plot.setXLink(self.curve_plot)
        for plot in (self.curve_plot, self.score_plot):
            for ax in ("left", "bottom"):
                plot.getAxis(ax).enableAutoSIPrefix(False)
            plot.showGrid(x=True, y=True, alpha=0.25)
        self.curve_plot.getAxis("left").setToolTip("fraction of training episodes that succeeded")
        self.score_plot.getAxis("left").setToolTip(
            "the task's reward summed over an episode (higher is better; it keeps improving "
            "after success saturates)"
        )
        self.curve_plot.addLegend(offset=(-10, -10))
        best = {"pen": pg.mkPen("#1f77b4", width=2), "symbol": "o", "symbolSize": 5}
        mean = {"pen": pg.mkPen("#ff7f0e", width=2, style=QtCore.Qt.PenStyle.DashLine)}
        self.curve_best = self.curve_plot.plot([], [], name="best candidate", **best)
        self.curve_mean = self.curve_plot.plot([], [], name="current policy", **mean)
        self.score_best = self.score_plot.plot([], [], **best)
        self.score_mean = self.score_plot.plot([], [], **mean)
        self.curve_x: list[float] = []
        self.curve_y: list[float] = []
        self.curve_y2: list[float] = []
        self.score_y: list[float] = []
        self.score_y2: list[float] = []
        self.views.addTab(self.curve_view, "Learning curve")
        self.views.addTab(self.dist_view, "Training distribution")
        self.sim_real = SimRealView()
        self.views.addTab(self.sim_real, "Sim vs real")
        self.table = PolicyTable()
        self.table.itemSelectionChanged.connect(self._selection_changed)
        bottom = QtWidgets.QHBoxLayout()
        layout.addLayout(bottom, 2)
        bottom.addWidget(self.table, 1)
        side = QtWidgets.QVBoxLayout()
        self.eval_episodes = QtWidgets.QSpinBox()
        self.eval_episodes.setRange(4, 1000)
        self.eval_episodes.setValue(50)
        self.eval_episodes.setSuffix(" episodes")
        self.eval_episodes.setToolTip("twin episodes per evaluation (more: a narrower interval)")
        self.eval_btn = QtWidgets.QPushButton("Evaluate")
        self.eval_btn.setToolTip(
            "success rate of the selected policy in its twin, nominal and under its "
            "randomization, with a 95 % interval"
        )
        self.eval_btn.setEnabled(False)
        self.eval_btn.clicked.connect(self.evaluate_selected)
        side.addWidget(self.eval_episodes)
        side.addWidget(self.eval_btn)
        self.lineage = wrapped_label(6)
        self.lineage.setFixedWidth(230)
        side.addWidget(self.lineage)
        side.addStretch(1)
        bottom.addLayout(side)
        self.sig_progress.connect(self._on_progress, QtCore.Qt.ConnectionType.QueuedConnection)

    # -- model ---------------------------------------------------------------------------
    def has_content(self) -> bool:
        proj = self.controller.project
        return proj is not None and proj.latest("twin") is not None

    def refresh(self) -> None:
        super().refresh()
        proj = self.controller.project
        if proj is None or not self.has_content():
            return
        self.setup.refresh()
        self.table.show_policies(proj)
        self.sim_real.show_table(sim_real_table(proj))
        self._update_resume()

    # -- training ------------------------------------------------------------------------
    def start_training(self) -> None:
        if self.controller.project is None or self._running:
            return
        why = self.setup.check()
        if why is not None:
            self.status.setText(why)
            return
        self._launch(self.setup.train_argv(), None)

    def resume_training(self) -> None:
        proj = self.controller.project
        if proj is None or self._running:
            return
        runs = train_flow.interrupted_runs(proj)
        run = self._run if self._run in runs else next(reversed(runs), None)
        argv = self._argv if run == self._run and self._argv else runs.get(run) if run else None
        if run is None or not argv:
            self.status.setText("No interrupted run whose settings are known to resume.")
            return
        self._launch(list(argv), run)

    def _launch(self, argv: list[str], resume: str | None) -> None:
        proj = self.controller.project
        assert proj is not None
        self._argv, self._run, self._run_saved = argv, resume, resume is not None
        if resume is None or resume != self._shown_run:
            self._clear_curve()
            self._draw_curve()
        self._shown_run = resume
        self.curve_plot.setTitle(f"resuming {resume}" if resume else "training (live)", size="9pt")
        self._set_x_label("cem" in argv)
        self.views.setCurrentWidget(self.curve_view)
        self._stop.clear()
        self._set_running(True)
        self.status.setText("starting the training process…")
        job = train_flow.train_subprocess_job(
            proj.root, [*argv, *(["--resume", resume] if resume else [])]
        )
        tapped = tap_progress(job, self._from_job, self._stop)
        self.controller.submit_job(
            "Resume training" if resume else "Train policy",
            tapped,
            lambda pid: QtCore.QTimer.singleShot(0, self, lambda: self._trained(pid)),
            lambda msg: QtCore.QTimer.singleShot(0, self, lambda: self._train_failed(msg)),
        )

    def cancel_training(self) -> None:
        self._stop.set()
        self.cancel_btn.setEnabled(False)
        self.status.setText("cancelling: the run stops at its next step and keeps a checkpoint…")

    def _from_job(self, p: Any) -> None:
        try:
            self.sig_progress.emit(p)
        except RuntimeError:  # the page is gone
            pass

    def _on_progress(self, p: Any) -> None:
        part = p.partial if isinstance(p.partial, dict) else {}
        if "run" in part:
            self._run = self._shown_run = str(part["run"])
        proj = self.controller.project
        if self._run and not self._run_saved and proj is not None:
            train_flow.remember_run_argv(proj, self._run, self._argv)
            self._run_saved = (proj.root / ".train" / self._run / "argv.json").is_file()
        row = part.get("curve")
        if isinstance(row, dict) and self._add_curve_row(row):
            self._draw_curve()
        if p.fraction is not None:
            self.progress.setValue(int(round(100 * p.fraction)))
        if p.message:
            self.status.setText(p.message)

    def _add_curve_row(self, row: dict[str, Any]) -> bool:
        """CEM rows: best candidate and current mean; PPO rows: the policy's episodes."""
        x = row.get("episodes") if "generation" in row else row.get("timesteps")
        y = row.get("success_best", row.get("success"))
        if x is None or y is None:
            return False

        def num(v: Any) -> float:
            return float(v) if v is not None else float("nan")

        self.curve_x.append(float(x))
        self.curve_y.append(float(y))
        self.curve_y2.append(num(row.get("success_mean_params")))
        self.score_y.append(num(row.get("best_return", row.get("mean_return"))))
        self.score_y2.append(num(row.get("mean_return") if "best_return" in row else None))
        return True

    def _draw_curve(self) -> None:
        x = np.asarray(self.curve_x, float)
        for item, ys in (
            (self.curve_best, self.curve_y),
            (self.curve_mean, self.curve_y2),
            (self.score_best, self.score_y),
            (self.score_mean, self.score_y2),
        ):
            y = np.asarray(ys, float)
            ok = np.isfinite(y)
            item.setData(x[ok], y[ok])

    def _clear_curve(self) -> None:
        for ys in (self.curve_x, self.curve_y, self.curve_y2, self.score_y, self.score_y2):
            ys.clear()

    def _set_x_label(self, cem: bool) -> None:
        self.curve_plot.getAxis("bottom").showLabel(False)
        self.score_plot.setLabel("bottom", "episodes simulated" if cem else "environment steps")

    def curve_points(self) -> int:
        return len(self.curve_x)

    def _set_running(self, on: bool) -> None:
        self._running = on
        self.train_btn.setEnabled(not on)
        self.cancel_btn.setEnabled(on)
        if on:
            self.resume_btn.setEnabled(False)
            self.progress.setValue(0)
        else:
            self._update_resume()

    def _update_resume(self) -> None:
        proj = self.controller.project
        runs = train_flow.interrupted_runs(proj) if proj is not None else {}
        ok = not self._running and any(
            argv or (r == self._run and self._argv) for r, argv in runs.items()
        )
        self.resume_btn.setEnabled(bool(ok))
        if ok:
            last = next(reversed(runs))
            self.resume_btn.setToolTip(f"continue the interrupted run {last} from its checkpoint")
            if self.status.text() == IDLE:  # a run left from an earlier session
                self.status.setText(f"Run {last} was interrupted: Resume continues it.")

    def _reload_project(self) -> None:
        """The child process wrote to the project: read it again."""
        proj = self.controller.project
        if proj is not None:
            self.controller.project = Project.open(proj.root)
            self.refresh()
            self.controller.notify_project_changed()

    def _trained(self, pid: str | None) -> None:
        self._set_running(False)
        if pid is None:
            self.status.setText(
                f"Training cancelled; run {self._run} kept its checkpoint: Resume continues it."
            )
            self._update_resume()
            return
        self.progress.setValue(100)
        self._reload_project()
        self.status.setText(f"Trained {pid}: see its twin success below.")
        self.table.select(pid)

    def _train_failed(self, msg: str) -> None:
        self._set_running(False)
        self.status.setText(f"Training failed: {msg}")

    # -- policies ------------------------------------------------------------------------
    def _selection_changed(self) -> None:
        pid = self.table.selected()
        self.eval_btn.setEnabled(pid is not None and not self._running)
        proj = self.controller.project
        if pid is None or proj is None:
            self.lineage.setText("")
            return
        chain = [f"{a.kind} {a.id}" for a in proj.lineage(pid)]
        self.lineage.setText(f"<b>{pid}</b> was made from:<br>" + "<br>".join(chain))
        if not self._running:  # idle: the curve shown is the selected policy's
            self._show_policy_curve(proj, pid)

    def _show_policy_curve(self, proj: Project, pid: str) -> None:
        rows = train_flow.policy_curve(proj, pid)
        self._shown_run = None
        cem = bool(rows) and "generation" in rows[0]
        self._clear_curve()
        for row in rows:
            self._add_curve_row(row)
        self._draw_curve()
        self._set_x_label(cem)
        self.curve_plot.setTitle(f"learning curve of {pid}", size="9pt")

    def evaluate_selected(self) -> None:
        proj, pid = self.controller.project, self.table.selected()
        if proj is None or pid is None:
            return
        self.eval_btn.setEnabled(False)
        self.status.setText(f"evaluating {pid} in the twin…")
        job = _evaluate_both(proj, pid, self.eval_episodes.value())
        self.controller.submit_job(
            f"Evaluate {pid}",
            job,
            lambda _r: QtCore.QTimer.singleShot(0, self, lambda: self._evaluated(pid)),
            lambda msg: QtCore.QTimer.singleShot(0, self, lambda: self._eval_failed(msg)),
        )

    def _evaluated(self, pid: str) -> None:
        self.controller.notify_project_changed()
        self.status.setText(f"Evaluated {pid}: success rates below.")
        self.table.select(pid)

    def _eval_failed(self, msg: str) -> None:
        self.eval_btn.setEnabled(True)
        self.status.setText(f"Evaluation failed: {msg}")

    def detach(self) -> None:
        self._stop.set()  # a running training stops at its next step (checkpoint kept)
        super().detach()


def _evaluate_both(project: Project, pid: str, episodes: int) -> Any:
    """Job: the policy in its nominal twin, then under the randomization it was trained with."""
    rec = train_flow.policy_overview(project, pid)
    art = project.artifact(pid)
    dr = str(art.settings.get("dr", "none"))
    noise = str(art.settings.get("noise", "none"))
    out = yield from train_flow.evaluate_job(project, pid, episodes=episodes, noise=noise)
    if dr != "none":
        params = [f"{k}={v}" for k, v in rec.get("randomization", {}).get("params", {}).items()]
        out = yield from train_flow.evaluate_job(
            project,
            pid,
            dr=dr,
            fit_id=rec.get("fit_id"),
            params=params,
            noise=noise,
            episodes=episodes,
        )
    return out


if __name__ == "__main__":
    raise SystemExit(preview(PoliciesPage))
