"""Policies page (workflow step: policies): train a policy in the twin, watch it learn,
see how it does.

Left, in three tabs: the task (from `policies.tasks.TASKS`, its main settings with units)
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

from app.project import Project
from app.workflows import calibrate_live
from app.workflows import train as train_flow
from app.workflows.twin import load_twin
from policies.tasks import TASKS
from resources.errors import TwinbenchError
from widgets.pages import StatusLine, WorkflowPage, preview
from widgets.policies_views import DistributionView, PolicyTable, knob_rows

log = logging.getLogger(__name__)
DR_LABELS = {
    "none": "none (the twin as it is)",
    "manual": "by hand, per parameter",
    "posterior": "from a fit's posterior",
}


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
        self._spec_of: tuple[str, Any] | None = None
        top = QtWidgets.QHBoxLayout()
        layout.addLayout(top, 3)
        left = QtWidgets.QVBoxLayout()
        top.addLayout(left, 2)
        self.setup = QtWidgets.QTabWidget()
        left.addWidget(self.setup, 1)
        self._build_task_tab()
        self._build_dr_tab()
        self._build_trainer_tab()
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
        self.status = StatusLine("Choose a task, a twin and a trainer, then press Train.")
        left.addWidget(self.status)
        self.views = QtWidgets.QTabWidget()
        top.addWidget(self.views, 3)
        self.curve_plot = pg.PlotWidget(background="w")
        self.curve_plot.setLabel("left", "success (fraction of episodes)")
        self.curve_plot.setLabel("bottom", "episodes simulated")
        for ax in ("left", "bottom"):
            self.curve_plot.getAxis(ax).enableAutoSIPrefix(False)
        self.curve_plot.showGrid(x=True, y=True, alpha=0.25)
        self.curve_plot.setYRange(0.0, 1.0)
        self.curve_plot.addLegend(offset=(8, 8))
        self.curve_best = self.curve_plot.plot(
            [], [], pen=pg.mkPen("#1f77b4", width=2), symbol="o", symbolSize=5, name="best"
        )
        self.curve_mean = self.curve_plot.plot(
            [],
            [],
            pen=pg.mkPen("#ff7f0e", width=2, style=QtCore.Qt.PenStyle.DashLine),
            name="current policy",
        )
        self.curve_x: list[float] = []
        self.curve_y: list[float] = []
        self.curve_y2: list[float] = []
        self.views.addTab(self.curve_plot, "Learning curve")
        self.dist_view = DistributionView()
        self.views.addTab(self.dist_view, "Training distribution")
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
        self.lineage = _wrapped(6)
        self.lineage.setFixedWidth(230)
        side.addWidget(self.lineage)
        side.addStretch(1)
        bottom.addLayout(side)
        self.sig_progress.connect(self._on_progress, QtCore.Qt.ConnectionType.QueuedConnection)

    # -- setup tabs ----------------------------------------------------------------------
    def _build_task_tab(self) -> None:
        w = QtWidgets.QWidget()
        form = QtWidgets.QFormLayout(w)
        self.task_combo = QtWidgets.QComboBox()
        for name, task in TASKS.items():
            self.task_combo.addItem(name, name)
            self.task_combo.setItemData(
                self.task_combo.count() - 1, task.description, QtCore.Qt.ItemDataRole.ToolTipRole
            )
        self.task_combo.currentIndexChanged.connect(self._task_changed)
        form.addRow("task", self.task_combo)
        self.task_doc = _wrapped(2)
        form.addRow(self.task_doc)
        self.knob_form = QtWidgets.QFormLayout()
        form.addRow(self.knob_form)
        self.knobs: dict[str, QtWidgets.QDoubleSpinBox] = {}
        self.twin_combo = QtWidgets.QComboBox()
        self.twin_combo.currentIndexChanged.connect(self._twin_changed)
        form.addRow("twin", self.twin_combo)
        self.setup.addTab(w, "Task && twin")
        self._task_changed()

    def _build_dr_tab(self) -> None:
        w = QtWidgets.QWidget()
        lay = QtWidgets.QVBoxLayout(w)
        form = QtWidgets.QFormLayout()
        self.dr_combo = QtWidgets.QComboBox()
        for key, label in DR_LABELS.items():
            self.dr_combo.addItem(label, key)
        self.dr_combo.setToolTip(
            "what changes from episode to episode in training, so the policy copes with "
            "a robot that is not exactly the twin"
        )
        self.dr_combo.currentIndexChanged.connect(self._dr_changed)
        form.addRow("randomize", self.dr_combo)
        self.fit_combo = QtWidgets.QComboBox()
        self.fit_combo.setToolTip("the fit whose posterior samples are drawn, one per episode")
        self.fit_combo.currentIndexChanged.connect(self._update_distribution)
        form.addRow("fit", self.fit_combo)
        self.noise_check = QtWidgets.QCheckBox("typical sensor noise, latency and dropouts")
        self.noise_check.toggled.connect(self._update_distribution)
        form.addRow(self.noise_check)
        lay.addLayout(form)
        self.param_table = QtWidgets.QTableWidget(0, 3)
        self.param_table.setHorizontalHeaderLabels(["parameter", "unit", "distribution"])
        self.param_table.horizontalHeader().setStretchLastSection(True)
        self.param_table.verticalHeader().setVisible(False)
        self.param_table.setToolTip(
            "tick a parameter to randomize it; distribution: prior (its own range), "
            "uniform:LO:HI, normal:MEAN:STD, loguniform:LO:HI, lognormal:MEDIAN:SIGMA, fixed:V"
        )
        self.param_table.itemChanged.connect(lambda _it: self._update_distribution())
        lay.addWidget(self.param_table, 1)
        self.setup.addTab(w, "Randomization")
        self._dr_changed()

    def _build_trainer_tab(self) -> None:
        w = QtWidgets.QWidget()
        form = QtWidgets.QFormLayout(w)
        self.trainer_combo = QtWidgets.QComboBox()
        self.trainer_combo.addItem("CEM: tune a motion primitive (minutes)", "cem")
        self.trainer_combo.addItem("PPO: neural network (slow on a laptop)", "ppo")
        self.trainer_combo.currentIndexChanged.connect(self._trainer_changed)
        form.addRow("trainer", self.trainer_combo)
        self.budget = QtWidgets.QSpinBox()
        self.budget.setRange(1, 10_000_000)
        form.addRow("budget", self.budget)
        self.population = QtWidgets.QSpinBox()
        self.population.setRange(4, 256)
        self.population.setValue(16)
        self.population.setSuffix(" candidates")
        self.population.setToolTip("CEM: primitive settings tried per generation")
        form.addRow("per generation", self.population)
        self.episodes = QtWidgets.QSpinBox()
        self.episodes.setRange(1, 64)
        self.episodes.setValue(4)
        self.episodes.setSuffix(" episodes")
        self.episodes.setToolTip("CEM: episodes each candidate is scored on")
        form.addRow("per candidate", self.episodes)
        self.after_eval = QtWidgets.QSpinBox()
        self.after_eval.setRange(0, 1000)
        self.after_eval.setValue(20)
        self.after_eval.setSuffix(" episodes")
        self.after_eval.setToolTip("twin episodes to score the finished policy on")
        form.addRow("evaluate after", self.after_eval)
        self.setup.addTab(w, "Trainer")
        self._trainer_changed()

    def _task_changed(self) -> None:
        name = str(self.task_combo.currentData())
        self.task_doc.setText(TASKS[name].description)
        while self.knob_form.rowCount():
            self.knob_form.removeRow(0)
        self.knobs = {}
        for key, label, unit, value, tip in knob_rows(name):
            spin = QtWidgets.QDoubleSpinBox()
            spin.setDecimals(3)
            spin.setRange(0.0, 100.0)
            spin.setSingleStep(0.01 if value < 1 else 0.5)
            spin.setValue(value)
            spin.setSuffix(f" {unit}")
            spin.setToolTip(tip)
            self.knob_form.addRow(label, spin)
            self.knobs[key] = spin

    def _trainer_changed(self) -> None:
        cem = self.trainer_combo.currentData() == "cem"
        self.budget.setSuffix(" generations" if cem else " steps")
        self.budget.setValue(10 if cem else 200_000)
        self.budget.setToolTip(
            "CEM generations (each tries every candidate)" if cem else "PPO environment steps"
        )
        self.population.setEnabled(cem)
        self.episodes.setEnabled(cem)

    def _dr_changed(self) -> None:
        mode = self.dr_combo.currentData()
        self.fit_combo.setEnabled(mode == "posterior")
        self.param_table.setEnabled(mode == "manual")
        self._update_distribution()

    # -- model ---------------------------------------------------------------------------
    def has_content(self) -> bool:
        proj = self.controller.project
        return proj is not None and proj.latest("twin") is not None

    def refresh(self) -> None:
        super().refresh()
        proj = self.controller.project
        if proj is None or not self.has_content():
            return
        self._fill_combo(
            self.twin_combo, [(a.id, a.summary or a.id) for a in proj.artifacts("twin")]
        )
        self._fill_fits()
        self.table.show_policies(proj)
        self._update_resume()

    @staticmethod
    def _fill_combo(combo: QtWidgets.QComboBox, items: list[tuple[str, str]]) -> None:
        keep = combo.currentData()
        if [combo.itemData(i) for i in range(combo.count())] == [i for i, _ in items]:
            return
        combo.blockSignals(True)
        combo.clear()
        for key, text in items:
            combo.addItem(key, key)
            combo.setItemData(combo.count() - 1, text, QtCore.Qt.ItemDataRole.ToolTipRole)
        idx = combo.findData(keep)
        combo.setCurrentIndex(idx if idx >= 0 else combo.count() - 1)
        combo.blockSignals(False)
        if combo.currentData() != keep:
            combo.currentIndexChanged.emit(combo.currentIndex())

    def _fill_fits(self) -> None:
        proj, tid = self.controller.project, self.twin_combo.currentData()
        if proj is None or tid is None:
            return
        twin = proj.artifact(tid)
        fits = [
            (a.id, a.summary or a.id)
            for a in proj.artifacts("fit")
            if (a.settings.get("twin") == tid or a.id in twin.inputs)
            and a.settings.get("status") != "cancelled"
        ]
        self._fill_combo(self.fit_combo, fits)

    def _twin_spec(self) -> Any:
        proj, tid = self.controller.project, self.twin_combo.currentData()
        if proj is None or tid is None:
            return None
        if self._spec_of is None or self._spec_of[0] != tid:
            try:
                self._spec_of = (tid, load_twin(proj, tid)[1])
            except TwinbenchError as exc:  # a broken twin: say so, keep the page
                self.status.setText(f"Cannot read twin {tid}: {exc}")
                self._spec_of = (tid, None)
        return self._spec_of[1]

    def _twin_changed(self) -> None:
        self._fill_fits()
        spec = self._twin_spec()
        self.param_table.blockSignals(True)
        self.param_table.setRowCount(0)
        if spec is not None:
            for name, p in spec.params.items():
                r = self.param_table.rowCount()
                self.param_table.insertRow(r)
                it = QtWidgets.QTableWidgetItem(name)
                it.setFlags(it.flags() & ~QtCore.Qt.ItemFlag.ItemIsEditable)
                it.setFlags(it.flags() | QtCore.Qt.ItemFlag.ItemIsUserCheckable)
                it.setCheckState(QtCore.Qt.CheckState.Unchecked)
                it.setToolTip(f"{p.doc} (nominal {p.nominal:g}, {p.low:g} … {p.high:g} {p.unit})")
                self.param_table.setItem(r, 0, it)
                unit = QtWidgets.QTableWidgetItem(p.unit)
                unit.setFlags(unit.flags() & ~QtCore.Qt.ItemFlag.ItemIsEditable)
                self.param_table.setItem(r, 1, unit)
                self.param_table.setItem(r, 2, QtWidgets.QTableWidgetItem("prior"))
        self.param_table.resizeColumnToContents(0)
        self.param_table.blockSignals(False)
        self._update_distribution()

    def manual_params(self) -> list[str]:
        out = []
        for r in range(self.param_table.rowCount()):
            it, dist = self.param_table.item(r, 0), self.param_table.item(r, 2)
            if it is not None and it.checkState() == QtCore.Qt.CheckState.Checked:
                out.append(f"{it.text()}={dist.text().strip() if dist else 'prior'}")
        return out

    def _update_distribution(self) -> None:
        """Redraw the training distribution (and the fit's posterior, when there is one)."""
        proj, spec = self.controller.project, self._twin_spec() if self.has_content() else None
        if proj is None or spec is None:
            return
        mode = str(self.dr_combo.currentData())
        fit = self.fit_combo.currentData()
        try:
            dr, _ = train_flow.randomization_for(
                proj, self.twin_combo.currentData(), mode, fit, self.manual_params(), self._noise()
            )
            names, draws = dr.draws(spec.params, n=400)
        except Exception as exc:  # a half-typed distribution: say so, keep the page
            self.dist_view.show_message(f"Cannot draw the training distribution: {exc}")
            return
        post: tuple[list[str], np.ndarray] | None = None
        if fit is not None:
            try:
                pnames, x, _d = calibrate_live.fit_samples(proj, fit)
                post = (list(pnames), x)
            except Exception as exc:  # an old fit without samples: show training only
                log.info("no posterior for %s: %s", fit, exc)
        units = {n: spec.params[n].unit for n in spec.params}
        self.dist_view.show(names, draws, post, units, mode)

    def _noise(self) -> str:
        return "typical" if self.noise_check.isChecked() else "none"

    # -- training ------------------------------------------------------------------------
    def train_argv(self) -> list[str]:
        """The `main.py train` arguments for the current choices."""
        task = str(self.task_combo.currentData())
        argv = ["--task", task, "--twin", str(self.twin_combo.currentData())]
        mode = str(self.dr_combo.currentData())
        argv += ["--dr", mode, "--noise", self._noise()]
        if mode == "posterior" and self.fit_combo.currentData():
            argv += ["--fit", str(self.fit_combo.currentData())]
        if mode == "manual":
            argv += ["--param", *self.manual_params()]
        trainer = str(self.trainer_combo.currentData())
        argv += ["--trainer", trainer, "--budget", str(self.budget.value())]
        if trainer == "cem":
            argv += ["--population", str(self.population.value())]
            argv += ["--episodes", str(self.episodes.value())]
        sets = [f"{k}={s.value():g}" for k, s in self.knobs.items()]
        if sets:
            argv += ["--set", *sets]
        argv += ["--eval-episodes", str(self.after_eval.value())]
        return argv

    def start_training(self) -> None:
        if self.controller.project is None or self._running:
            return
        if self.dr_combo.currentData() == "manual" and not self.manual_params():
            self.status.setText("Tick at least one parameter to randomize (Randomization tab).")
            return
        if self.dr_combo.currentData() == "posterior" and self.fit_combo.currentData() is None:
            self.status.setText("This twin has no fit: fit it on the Calibrate page first.")
            return
        self._launch(self.train_argv(), None)

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
            self.curve_x, self.curve_y, self.curve_y2 = [], [], []
            self._draw_curve()
        self._shown_run = resume
        self.curve_plot.setTitle(f"resuming {resume}" if resume else "training (live)", size="9pt")
        self.curve_plot.setLabel(
            "bottom", "episodes simulated" if "cem" in argv else "environment steps"
        )
        self.views.setCurrentWidget(self.curve_plot)
        self._stop.clear()
        self._set_running(True)
        self.status.setText("starting the training process…")
        job = train_flow.train_subprocess_job(
            proj.root, [*argv, *(["--resume", resume] if resume else [])]
        )
        tapped = calibrate_live.tap_progress(job, self._from_job, self._stop)
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
        x = row.get("episodes") if "generation" in row else row.get("timesteps")
        y = row.get("success_best", row.get("success"))
        if x is None or y is None:
            return False
        self.curve_x.append(float(x))
        self.curve_y.append(float(y))
        y2 = row.get("success_mean_params")
        self.curve_y2.append(float(y2) if y2 is not None else float("nan"))
        return True

    def _draw_curve(self) -> None:
        self.curve_best.setData(self.curve_x, self.curve_y)
        y2 = np.asarray(self.curve_y2, float)
        ok = np.isfinite(y2)
        self.curve_mean.setData(np.asarray(self.curve_x)[ok], y2[ok])

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
        self.curve_x, self.curve_y, self.curve_y2 = [], [], []
        for row in rows:
            self._add_curve_row(row)
        self._draw_curve()
        self.curve_plot.setLabel("bottom", "episodes simulated" if cem else "environment steps")
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


class _FixedLines(QtWidgets.QLabel):
    """A word-wrapped label of a fixed number of lines whose height does not depend on its
    width (a height-for-width label would make the page's scroll area stretch the page
    taller than the window)."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt name)
        return False


def _wrapped(lines: int) -> QtWidgets.QLabel:
    lbl = _FixedLines("")
    lbl.setWordWrap(True)
    lbl.setFixedHeight(lbl.fontMetrics().lineSpacing() * lines + 4)
    lbl.setAlignment(QtCore.Qt.AlignmentFlag.AlignTop | QtCore.Qt.AlignmentFlag.AlignLeft)
    return lbl


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
