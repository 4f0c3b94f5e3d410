"""The Policies page's training setup, in three tabs: the task (from
`policies.tasks.TASKS`, its main settings with units) and the twin; the randomization
(none, by hand per parameter, or a fit's posterior) whose training distribution it draws
in a `DistributionView`; the trainer and its budget. `train_argv()` turns the choices
into `main.py train` arguments."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from app.controller import AppController
from app.workflows import fit as fit_workflow
from app.workflows import train as train_flow
from app.workflows.twin import load_twin
from policies.tasks import TASKS
from resources.errors import TwinbenchError
from widgets.artifact_combo import ArtifactCombo
from widgets.policies_views import DistributionView, knob_rows

log = logging.getLogger(__name__)
DR_LABELS = {
    "none": "none (the twin as it is)",
    "manual": "by hand, per parameter",
    "posterior": "from a fit's posterior",
}


class _FixedLines(QtWidgets.QLabel):
    """A word-wrapped label of a fixed number of lines whose height does not depend on its
    width (a height-for-width label would make the page's scroll area stretch the page
    taller than the window)."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt name)
        return False


def wrapped_label(lines: int) -> QtWidgets.QLabel:
    lbl = _FixedLines("")
    lbl.setWordWrap(True)
    lbl.setFixedHeight(lbl.fontMetrics().lineSpacing() * lines + 4)
    lbl.setAlignment(QtCore.Qt.AlignmentFlag.AlignTop | QtCore.Qt.AlignmentFlag.AlignLeft)
    return lbl


class TrainSetup(QtWidgets.QTabWidget):
    """Task & twin · Randomization · Trainer; `refresh()` re-reads the open project."""

    sig_message = QtCore.Signal(str)  # something the user should read (a broken twin)

    def __init__(
        self,
        controller: AppController,
        dist_view: DistributionView,
        parent: QtWidgets.QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._distribution_stale = False
        self.controller = controller
        self.dist_view = dist_view
        self._spec_of: tuple[str, Any] | None = None
        self._build_task_tab()
        self._build_dr_tab()
        self._build_trainer_tab()

    def refresh(self) -> None:
        proj = self.controller.project
        if proj is None or proj.latest("twin") is None:
            return
        if not self.twin_combo.set_artifacts(proj.artifacts("twin")):
            self._fill_fits()  # a new fit of the same twin (a new twin refills them itself)

    def check(self) -> str | None:
        """Why Train cannot start with these choices (None: it can)."""
        if self.dr_combo.currentData() == "manual" and not self.manual_params():
            return "Tick at least one parameter to randomize (Randomization tab)."
        if self.dr_combo.currentData() == "posterior" and self.fit_combo.currentData() is None:
            return "This twin has no fit: fit it on the Calibrate page first."
        return None

    # -- tabs ----------------------------------------------------------------------
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
        self.task_doc = wrapped_label(2)
        form.addRow(self.task_doc)
        self.knob_form = QtWidgets.QFormLayout()
        form.addRow(self.knob_form)
        self.knobs: dict[str, QtWidgets.QDoubleSpinBox] = {}
        self.twin_combo = ArtifactCombo(what="the twin the policy is trained in")
        self.twin_combo.currentIndexChanged.connect(self._twin_changed)
        form.addRow("twin", self.twin_combo)
        self.addTab(w, "Task && twin")
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
        self.fit_combo = ArtifactCombo(  # the twin's newest fit unless one was chosen
            what="the fit whose posterior samples are drawn, one per episode"
        )
        self.fit_combo.currentIndexChanged.connect(self._update_distribution)
        form.addRow("fit", self.fit_combo)
        self.noise_check = QtWidgets.QCheckBox("typical sensor noise, latency and dropouts")
        self.noise_check.toggled.connect(self._update_distribution)
        form.addRow(self.noise_check)
        lay.addLayout(form)
        self.param_table = QtWidgets.QTableWidget(0, 3)
        self.param_table.setHorizontalHeaderLabels(["parameter", "unit", "distribution"])
        hdr = self.param_table.horizontalHeader()
        hdr.setSectionResizeMode(0, QtWidgets.QHeaderView.ResizeMode.Stretch)
        hdr.setSectionResizeMode(1, QtWidgets.QHeaderView.ResizeMode.ResizeToContents)
        hdr.setSectionResizeMode(2, QtWidgets.QHeaderView.ResizeMode.Fixed)
        self.param_table.setColumnWidth(2, 120)
        self.param_table.setTextElideMode(QtCore.Qt.TextElideMode.ElideLeft)
        self.param_table.verticalHeader().setVisible(False)
        self.param_table.setToolTip(
            "tick a parameter to randomize it; distribution: prior (its own range), "
            "uniform:LO:HI, normal:MEAN:STD, loguniform:LO:HI, lognormal:MEDIAN:SIGMA, fixed:V"
        )
        self.param_table.itemChanged.connect(lambda _it: self._update_distribution())
        lay.addWidget(self.param_table, 1)
        self.addTab(w, "Randomization")
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
        self.addTab(w, "Trainer")
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
        self.fit_combo.setEnabled(mode != "none")  # by hand: its posterior for comparison
        self.param_table.setEnabled(mode == "manual")
        self._update_distribution()

    def _fill_fits(self) -> None:
        proj, tid = self.controller.project, self.twin_combo.currentData()
        if proj is None or tid is None:
            return
        twin = proj.artifact(tid)
        fits = [
            a
            for a in proj.artifacts("fit")
            if (a.settings.get("twin") == tid or a.id in twin.inputs)
            and a.settings.get("status") != "cancelled"
        ]
        self.fit_combo.set_artifacts(fits)

    def _twin_spec(self) -> Any:
        proj, tid = self.controller.project, self.twin_combo.currentData()
        if proj is None or tid is None:
            return None
        if self._spec_of is None or self._spec_of[0] != tid:
            try:
                self._spec_of = (tid, load_twin(proj, tid)[1])
            except TwinbenchError as exc:  # a broken twin: say so, keep the page
                self.sig_message.emit(f"Cannot read twin {tid}: {exc}")
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
        self.param_table.blockSignals(False)
        self._update_distribution()

    def manual_params(self) -> list[str]:
        out = []
        for r in range(self.param_table.rowCount()):
            it, dist = self.param_table.item(r, 0), self.param_table.item(r, 2)
            if it is not None and it.checkState() == QtCore.Qt.CheckState.Checked:
                out.append(f"{it.text()}={dist.text().strip() if dist else 'prior'}")
        return out

    def showEvent(self, event: QtGui.QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if self._distribution_stale:
            self._update_distribution()

    def _update_distribution(self) -> None:
        """Redraw the training distribution (and the fit's posterior, when there is one);
        while the window shows another page, when this one is next shown (a fit or refit
        made on another page redrew it here: 400 draws and a histogram per parameter on the
        window's thread, 120 ms of bench loop's worst stalls on a loaded machine)."""
        if self.window().isVisible() and not self.isVisible():
            self._distribution_stale = True
            return
        self._distribution_stale = False
        proj, spec = self.controller.project, self._twin_spec()
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
                pnames, x, _d = fit_workflow.fit_samples(proj, fit)
                post = (list(pnames), x)
            except Exception as exc:  # an old fit without samples: show training only
                log.info("no posterior for %s: %s", fit, exc)
        units = {n: spec.params[n].unit for n in spec.params}
        self.dist_view.show(names, draws, post, units, mode)

    def _noise(self) -> str:
        return "typical" if self.noise_check.isChecked() else "none"

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
