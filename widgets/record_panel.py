"""Record panel: choose a library motion, see what will move, record it, stop it.

The panel plans the motion from the connected robot's current pose (app.workflows.record,
off the GUI thread), draws the planned joint curves (offset from the start pose, one per
moving joint) before anything moves, and only then enables Record. Record plays the plan
through the robot protocol on a worker thread and saves the recording into the open
project; the big Stop button stops the robot at once (no further command is sent, the robot
is held) and saves nothing. Works with any connected robot that has a protocol client.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from app.controller import AppController
from app.workflows.design import latest_fit, suggest_job
from app.workflows.record import plan_motion, record_job
from devices.robots.excitation import EXCITATIONS
from devices.robots.motion import Motion
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress
from widgets.jobs import JobRunner, JobTask
from widgets.pages import spin_box

log = logging.getLogger(__name__)

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


class RecordPanel(QtWidgets.QWidget):
    """Motion choice and parameters, planned-curve preview, Record, Stop, progress."""

    sig_recorded = QtCore.Signal(str)  # trajectory artifact id

    def __init__(
        self,
        controller: AppController,
        runner: JobRunner | None = None,
        parent: QtWidgets.QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.controller = controller
        self.runner = runner or JobRunner(self)
        self.motion: Motion | None = None
        self.suggestion: Any = None  # the last design suggestion applied to the form
        self._task: JobTask | None = None
        self._stop = threading.Event()
        lay = QtWidgets.QVBoxLayout(self)
        lay.addLayout(self._build_motion_form(controller))
        self._build_plan_view(lay)
        self._build_record_row(lay)
        self.motion_box.currentTextChanged.connect(self._motion_changed)
        for w in (
            self.amplitude,
            self.velocity,
            self.duration,
            self.target_x,
            self.target_y,
            self.direction,
            self.speed,
        ):
            w.valueChanged.connect(self._invalidate)
        self.joints.textChanged.connect(self._invalidate)
        self._motion_changed(self.motion_box.currentText())

    def _build_motion_form(self, controller: AppController) -> QtWidgets.QFormLayout:
        """The motion and its parameters: amplitude, speed share, duration and joints for the
        excitations; target, direction and speed for a push; a camera to record beside it."""
        form = QtWidgets.QFormLayout()
        self.motion_box = QtWidgets.QComboBox()
        for name, ex in EXCITATIONS.items():
            self.motion_box.addItem(name)
            self.motion_box.setItemData(
                self.motion_box.count() - 1, ex.description, QtCore.Qt.ItemDataRole.ToolTipRole
            )
        self.motion_box.addItem("push")
        self.amplitude = spin_box(0.01, 1.0, 0.1, 0.01, "fraction of each joint's half range")
        self.velocity = spin_box(0.05, 1.0, 0.3, 0.05, "fraction of each joint's speed limit")
        self.duration = spin_box(0.5, 55.0, 6.0, 0.5, "seconds (chirp, multisine)", " s")
        self.joints = QtWidgets.QLineEdit("all")
        self.joints.setToolTip("joints to move: names or 0-based indices, comma separated")
        self.target_x = spin_box(-2.0, 2.0, 0.56, 0.01, "object centre x (robot base frame)", " m")
        self.target_y = spin_box(-2.0, 2.0, -0.2, 0.01, "object centre y (robot base frame)", " m")
        self.direction = spin_box(-180.0, 180.0, 0.0, 15.0, "push direction from +x", " °")
        self.speed = spin_box(0.01, 0.5, 0.05, 0.01, "tool speed while pushing", " m/s")
        self.camera_box = QtWidgets.QComboBox()
        self.camera_box.setToolTip("also record this camera (for object poses from depth)")
        self.camera_box.addItem("none")
        link = controller.robot_link
        client = link.protocol_client() if link is not None else None
        for cam in getattr(client, "cameras", []) or []:
            self.camera_box.addItem(str(cam))
        form.addRow("Motion", self.motion_box)
        form.addRow("Amplitude", self.amplitude)
        form.addRow("Speed limit share", self.velocity)
        form.addRow("Duration", self.duration)
        form.addRow("Joints", self.joints)
        form.addRow("Push target x", self.target_x)
        form.addRow("Push target y", self.target_y)
        form.addRow("Push direction", self.direction)
        form.addRow("Push speed", self.speed)
        form.addRow("Camera", self.camera_box)
        return form

    def _build_plan_view(self, lay: QtWidgets.QVBoxLayout) -> None:
        """Suggest (D-optimal) and Preview plan, the planned curves with the time line that
        follows a recording, the plan's summary and the progress bar."""
        self.suggest_button = QtWidgets.QPushButton("Suggest the next motion (D-optimal)")
        self.suggest_button.setToolTip(
            "Rank the library by expected information gain about the latest fit's parameters "
            "at its estimate, and fill in the best motion"
        )
        self.suggest_button.clicked.connect(self.suggest)
        self.suggest_only: list[str] = []  # candidate keys to score (all when empty)
        lay.addWidget(self.suggest_button)
        self.preview_button = QtWidgets.QPushButton("Preview plan")
        self.preview_button.setToolTip("Plan from the robot's current pose; nothing moves")
        self.preview_button.clicked.connect(self.preview)
        lay.addWidget(self.preview_button)
        self.plot = pg.PlotWidget()
        self.plot.setBackground("w")
        self.plot.setLabel("bottom", "time", units="s")
        self.plot.setLabel("left", "offset", units="rad")
        self.plot.addLegend(offset=(5, 5))
        self.plot.setMinimumHeight(180)
        self.time_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#c62828", width=2))
        self.time_line.hide()
        self.plot.addItem(self.time_line)
        lay.addWidget(self.plot, 1)
        self.summary = QtWidgets.QLabel("Choose a motion and press Preview plan.")
        self.summary.setWordWrap(True)
        lay.addWidget(self.summary)
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        lay.addWidget(self.progress)

    def _build_record_row(self, lay: QtWidgets.QVBoxLayout) -> None:
        """Record beside the big STOP."""
        row = QtWidgets.QHBoxLayout()
        self.record_button = QtWidgets.QPushButton("Record")
        self.record_button.setEnabled(False)
        self.record_button.setToolTip("Play the previewed plan on the robot and save it")
        self.record_button.clicked.connect(self.record)
        self.stop_button = QtWidgets.QPushButton("STOP")
        self.stop_button.setMinimumHeight(56)
        self.stop_button.setStyleSheet(
            "QPushButton { background: #c62828; color: white; font-size: 20px; "
            "font-weight: bold; border-radius: 6px; }"
        )
        self.stop_button.setToolTip("Stop the robot now (held in place); nothing is saved")
        self.stop_button.clicked.connect(self.stop)
        row.addWidget(self.record_button, 1)
        row.addWidget(self.stop_button, 2)
        lay.addLayout(row)

    # -- state ---------------------------------------------------------------------------
    def _client(self) -> Any:
        link = self.controller.robot_link
        client = link.protocol_client() if link is not None else None
        if client is None:
            raise TwinbenchError(
                "no robot connected (Devices ▸ Start virtual lab, or Add robot… in the "
                "Devices panel)"
            )
        return client

    def _motion_changed(self, name: str) -> None:
        push = name == "push"
        for w in (self.target_x, self.target_y, self.direction, self.speed):
            w.setEnabled(push)
        self.amplitude.setEnabled(not push)
        self.joints.setEnabled(not push)
        self.duration.setEnabled(name in ("chirp", "multisine"))
        self._invalidate()

    def _invalidate(self, *_: Any) -> None:
        """Any change of the parameters needs a new preview before recording."""
        if self._task is not None and not self._task.done:
            return
        self.motion = None
        self.record_button.setEnabled(False)

    def params(self) -> dict[str, Any]:
        """The motion parameters as the library takes them."""
        name = self.motion_box.currentText()
        if name == "push":
            return {
                "target_xy": (self.target_x.value(), self.target_y.value()),
                "direction": self.direction.value(),
                "speed": self.speed.value(),
                "velocity": self.velocity.value(),
            }
        out: dict[str, Any] = {"amplitude": self.amplitude.value()}
        if "velocity" in EXCITATIONS[name].defaults:
            out["velocity"] = self.velocity.value()
        if name in ("chirp", "multisine"):
            out["duration"] = self.duration.value()
        joints = self.joints.text().strip()
        if joints and joints != "all" and "joints" in EXCITATIONS[name].defaults:
            out["joints"] = joints
        return out

    # -- actions -------------------------------------------------------------------------
    def preview(self) -> None:
        """Plan on a worker thread; draw the planned curves when it arrives."""
        try:
            client = self._client()
        except TwinbenchError as exc:
            self._say(str(exc), error=True)
            return
        name, params = self.motion_box.currentText(), self.params()

        def job() -> Job[Motion]:
            yield Progress(None, f"planning {name}…")
            return plan_motion(client, name, **params)

        self.preview_button.setEnabled(False)
        self._say(f"planning {name} from the robot's current pose…")
        task = self.runner.start(f"Plan {name}", job())
        task.sig_finished.connect(self._planned)
        task.sig_failed.connect(lambda msg: self._say(f"cannot plan: {msg}", error=True))
        task.sig_done.connect(lambda: self.preview_button.setEnabled(True))

    def suggest(self) -> None:
        """Run the design job for the latest fit; fill the form with the best motion."""
        project = self.controller.project
        fit_id = latest_fit(project) if project is not None else None
        if project is None or fit_id is None:
            self._say(
                "no finished fit in the project: fit the twin first (python main.py fit)",
                error=True,
            )
            return
        self.suggest_button.setEnabled(False)
        job = suggest_job(project, None, (), fit_id, only=self.suggest_only)
        task = self.runner.start("Suggest next motion", job)
        task.sig_progress.connect(lambda p: self._say(p.message))
        task.sig_finished.connect(self._suggested)
        task.sig_failed.connect(lambda msg: self._say(f"cannot suggest: {msg}", error=True))
        task.sig_done.connect(lambda: self.suggest_button.setEnabled(True))

    def _suggested(self, ranked: list[Any]) -> None:
        if not ranked:
            self._say("no library motion fits this robot", error=True)
            return
        best = ranked[0]
        p = best.motion.params
        self.motion_box.setCurrentText(best.motion.name)
        if best.motion.name == "push":
            self.target_x.setValue(float(p["target_xy"][0]))
            self.target_y.setValue(float(p["target_xy"][1]))
            self.direction.setValue(float(p["direction"]))
            self.speed.setValue(float(p["speed"]))
        else:
            self.amplitude.setValue(float(p.get("amplitude", self.amplitude.value())))
            self.velocity.setValue(float(p.get("velocity", self.velocity.value())))
            if "duration" in p and best.motion.name in ("chirp", "multisine"):
                self.duration.setValue(float(p["duration"]))
            self.joints.setText(str(p.get("joints", "all")))
        gains = ", ".join(f"{s.name} {s.gain:.2f}" for s in ranked[1:4])
        self.suggestion = best
        self._say(
            f"suggested: {best.name} (+{best.gain:.2f} nats of information; next: "
            f"{gains or 'none'}). Preview it, then Record."
        )

    def _planned(self, motion: Motion) -> None:
        self.motion = motion
        self.show_motion(motion)
        self.record_button.setEnabled(self.controller.project is not None)
        note = "" if self.controller.project is not None else " Open a project to record."
        extra = "".join(f" Note: {n}." for n in motion.notes)
        self._say(f"{motion.summary()}.{extra}{note}")

    def show_motion(self, motion: Motion) -> None:
        """Draw the planned joint curves (offset from the start pose)."""
        self.plot.clear()
        self.plot.addItem(self.time_line)
        self.time_line.hide()
        moved = motion.moved_joints()
        for k, name in enumerate(moved):
            j = motion.joint_names.index(name)
            y = motion.command[:, j] - motion.command[0, j]
            self.plot.plot(motion.t, y, pen=pg.mkPen(PALETTE[k % len(PALETTE)], width=2), name=name)
        unit = "rad" if motion.mode == "position" else "N·m"
        what = "offset" if motion.mode == "position" else "torque"  # planned, from the start
        # units= lets the axis pick a prefix (mrad) and say so; plain text would not
        self.plot.setLabel("left", what, units=unit)

    def curves(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The drawn curves by joint name: (t, y) (tests read it)."""
        out = {}
        for item in self.plot.getPlotItem().listDataItems():
            t, y = item.getData()
            out[str(item.name())] = (np.asarray(t), np.asarray(y))
        return out

    def record(self) -> None:
        """Play the previewed plan and save it into the open project."""
        if self.motion is None or self.controller.project is None:
            return
        try:
            client = self._client()
        except TwinbenchError as exc:
            self._say(str(exc), error=True)
            return
        self._stop.clear()
        motion = self.motion
        cam = self.camera_box.currentText()
        job = record_job(
            self.controller.project,
            client,
            motion,
            stop_event=self._stop,
            camera=None if cam == "none" else cam,
        )
        self._task = task = self.runner.start(f"Record {motion.name}", job)
        self.record_button.setEnabled(False)
        self.preview_button.setEnabled(False)
        self.progress.setValue(0)  # not the previous recording's 100 %
        self.time_line.setValue(0.0)
        self.time_line.show()
        task.sig_progress.connect(self._on_progress)
        task.sig_finished.connect(self._recorded)
        task.sig_failed.connect(lambda msg: self._say(msg, error=True))
        task.sig_cancelled.connect(lambda: self._say("recording cancelled; robot stopped"))
        task.sig_done.connect(self._ended)

    def _on_progress(self, p: Progress) -> None:
        if p.fraction is not None:
            self.progress.setValue(int(1000 * p.fraction))
            if self.motion is not None:
                total = self.motion.duration + 0.9  # the recorded hold before and after
                self.time_line.setValue(max(0.0, p.fraction * total - 0.3))
        self._say(p.message)

    def _recorded(self, tid: str) -> None:
        self.progress.setValue(1000)
        self._say(f"saved trajectory {tid} (see the Calibrate page)")
        self.controller.notify_project_changed()
        self.sig_recorded.emit(tid)

    def _ended(self) -> None:
        self._task = None
        self.time_line.hide()
        self.preview_button.setEnabled(True)
        self.motion = None  # the robot moved: plan again from where it is now
        self.record_button.setEnabled(False)

    def stop(self) -> None:
        """Stop now: no further command, the robot held, the recording discarded."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
        try:
            self._client().stop("Stop pressed in the record panel")
        except TwinbenchError as exc:
            log.warning("stop: %s", exc)
        self._say("stopped: the robot holds its position")

    def _say(self, text: str, error: bool = False) -> None:
        self.summary.setStyleSheet("color: #c62828;" if error else "")
        if self.summary.text() != text:
            self.summary.setText(text)


class RecordDialog(QtWidgets.QDialog):
    """The record panel in its own window (opened from the devices panel)."""

    def __init__(
        self,
        controller: AppController,
        parent: QtWidgets.QWidget | None = None,
        runner: JobRunner | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Record a motion")
        self.resize(620, 640)
        lay = QtWidgets.QVBoxLayout(self)
        self._own_runner = runner is None
        self.panel = RecordPanel(controller, runner=runner, parent=self)
        lay.addWidget(self.panel)

    def closeEvent(self, event: Any) -> None:  # noqa: N802 (Qt name)
        if self.panel._task is not None:  # closing mid-motion stops the robot
            self.panel.stop()
        if self._own_runner:  # the window's runner runs other jobs too: they go on
            self.panel.runner.shutdown()
        super().closeEvent(event)


if __name__ == "__main__":  # a preview with a synthetic plan (no robot needed)
    import sys

    from devices.robots.excitation import plan
    from devices.robots.wire.robot_types import JointLimits, RobotInfo

    app = QtWidgets.QApplication(sys.argv)
    panel = RecordPanel(AppController())
    info = RobotInfo(
        "preview",
        ("j1", "j2", "j3"),
        JointLimits(np.full(3, -2.0), np.full(3, 2.0), np.full(3, 2.0), np.full(3, 10.0)),
        250.0,
    )
    panel.show_motion(plan("multisine", info, np.zeros(3), duration=6.0))
    panel.show()
    sys.exit(app.exec())
