"""Deploy page (workflow step: deploy): a policy onto the connected robot, predicted first.

1. Predict: the policy's spec is checked against the robot (refused naming what differs)
   and the twin runs it from the robot's measured state (app.workflows.deploy_plan.plan_deploy,
   off the GUI thread): predicted success, final error and joint curves (dashed).
2. Run on robot: upload and run inside the robot's envelope with the start ramp; measured
   joints (solid) and the commands the envelope let through (dotted) are drawn live over
   the prediction; the big STOP stops the robot at once and the run is still saved.
3. Send to Real2Sim: the saved run is added to the recordings of the twin's fit and the
   twin is fitted again (a fit job; its result opens on the Calibrate page). A refit that
   did not fit (its replays failed: app.workflows.close_loop.RefitError) is shown in red
   under the button, nothing is saved, and 4. Retrain stays off.

See widgets/pages.py for the page contract.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from app.workflows.close_loop import refit_job, retrain_argv
from app.workflows.deploy import deploy_job
from app.workflows.deploy_plan import plan_deploy, policy_object_source
from app.workflows.train import load_policy, train_subprocess_job
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress
from widgets.artifact_combo import ArtifactCombo
from widgets.file_field import FileField
from widgets.jobs import JobTask, Throttled
from widgets.pages import StatusLine, WorkflowPage, preview, spin_box
from widgets.record_panel import PALETTE

log = logging.getLogger(__name__)

STOP_STYLE = (
    "QPushButton { background: #c62828; color: white; font-size: 22px; font-weight: bold; "
    "border-radius: 6px; } QPushButton:disabled { background: #e0a0a0; }"
)


class DeployPage(WorkflowPage):
    """Workflow page for the 'deploy' step; constructed as `DeployPage(controller, parent=None, runner=None)`."""

    step = "deploy"
    sig_run_saved = QtCore.Signal(object)  # DeployResult
    sig_refit_done = QtCore.Signal(str)  # fit artifact id
    sig_refit_failed = QtCore.Signal(str)  # why
    sig_retrained = QtCore.Signal(str)  # policy artifact id

    def build_body(self, layout: QtWidgets.QVBoxLayout) -> None:
        self.plan: Any = None  # app.workflows.deploy_plan.DeployPlan of the last prediction
        self.result: Any = None  # DeployResult of the last run
        self._task: JobTask | None = None  # the run on the robot, while it runs
        self._bar_task: JobTask | None = None  # the job the progress bar shows: the newest
        self._show_progress = Throttled(self._progress_shown, parent=self)
        self._stop = threading.Event()
        self._live: dict[str, list[Any]] | None = None
        self._curves: dict[str, Any] = {}
        row = QtWidgets.QHBoxLayout()
        layout.addLayout(row, 1)
        side_box = QtWidgets.QWidget()
        side_box.setMaximumWidth(460)
        side = QtWidgets.QVBoxLayout(side_box)
        side.setContentsMargins(0, 0, 0, 0)
        row.addWidget(side_box, 0)
        side.addLayout(self._build_form())
        self._build_steps(side)
        self._build_plots(row)
        self.timer = QtCore.QTimer(self)
        self.timer.setInterval(100)
        self.timer.timeout.connect(self._draw_live)
        self.policy_box.currentIndexChanged.connect(self._invalidate)
        self.policy_box.currentIndexChanged.connect(self._show_camera_row)

    def _build_form(self) -> QtWidgets.QFormLayout:
        """What to deploy and how: the policy, the robot it goes to, the task's goal, the
        camera that sees the object (push policies), the start ramp and how long it runs."""
        form = QtWidgets.QFormLayout()
        self.policy_box = ArtifactCombo(  # the newest policy unless one was chosen
            min_chars=24, what="a trained policy of the open project (Policies page)"
        )
        self.robot_label = QtWidgets.QLabel("")
        self.robot_label.setWordWrap(True)
        self.goal_seed = QtWidgets.QSpinBox()
        self.goal_seed.setRange(0, 1_000_000)
        self.goal_seed.setPrefix("task goal no. ")
        self.goal_seed.setToolTip(
            "which goal: drawn from the task's goal distribution (as in training), by number"
        )
        self.ramp = spin_box(
            0.0, 10.0, 0.5, 0.1, "blend from the current pose into the policy", " s"
        )
        self.duration = spin_box(0.0, 60.0, 0.0, 0.5, "0: the task's episode plus the ramp", " s")
        self.duration.setSpecialValueText("episode + ramp")
        form.addRow("Policy", self.policy_box)
        form.addRow("Robot", self.robot_label)
        form.addRow("Goal", self.goal_seed)
        self.camera_pose = FileField(
            "Camera pose (calibrate --out JSON)", "JSON (*.json)", "the scan's calibration"
        )
        self.camera_pose.setToolTip(
            "push policies: the pose of the camera that sees the object (T_base_camera, "
            "a `calibrate --out` JSON); by default the fixed camera calibrated with the scan"
        )
        self.camera_pose.sig_changed.connect(self._invalidate)
        form.addRow("Camera pose", self.camera_pose)
        self._form = form
        form.addRow("Start ramp", self.ramp)
        form.addRow("Run for", self.duration)
        return form

    def _build_steps(self, side: QtWidgets.QVBoxLayout) -> None:
        """The four steps as numbered buttons (predict, run, refit, retrain) with what each
        said under it, the STOP button, the progress bar and the status line."""
        self.predict_button = QtWidgets.QPushButton("1. Check and predict in the twin")
        self.predict_button.setToolTip(
            "Check the policy against the robot, then run it in its twin from the robot's "
            "current pose; nothing moves"
        )
        self.predict_button.clicked.connect(self.predict)
        side.addWidget(self.predict_button)
        self.prediction = QtWidgets.QLabel("Press 1 to see what the twin predicts.")
        self.prediction.setWordWrap(True)
        self.prediction.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.prediction.setMinimumHeight(60)
        side.addWidget(self.prediction)
        self.run_button = QtWidgets.QPushButton("2. Run on the robot")
        self.run_button.setEnabled(False)
        self.run_button.setToolTip("Upload the policy and run it inside the robot's envelope")
        self.run_button.clicked.connect(self.run)
        side.addWidget(self.run_button)
        self.stop_button = QtWidgets.QPushButton("STOP")
        self.stop_button.setMinimumHeight(64)
        self.stop_button.setStyleSheet(STOP_STYLE)
        self.stop_button.setToolTip("Stop the robot now (held in place); the run is saved")
        self.stop_button.clicked.connect(self.stop)
        side.addWidget(self.stop_button)
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1000)
        side.addWidget(self.progress)
        self.outcome = QtWidgets.QLabel("")
        self.outcome.setWordWrap(True)
        self.outcome.setTextFormat(QtCore.Qt.TextFormat.RichText)
        side.addWidget(self.outcome)
        self.refit_button = QtWidgets.QPushButton("3. Send to Real2Sim (refit the twin)")
        self.refit_button.setEnabled(False)
        self.refit_button.setToolTip(
            "Add this run's recording to the recordings of the twin's fit and fit it again"
        )
        self.refit_button.clicked.connect(self.refit)
        side.addWidget(self.refit_button)
        self.refit_note = QtWidgets.QLabel("")
        self.refit_note.setWordWrap(True)
        self.refit_note.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.refit_note.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        side.addWidget(self.refit_note)
        self.retrain_button = QtWidgets.QPushButton("4. Retrain from the refit")
        self.retrain_button.setEnabled(False)
        self.retrain_button.setToolTip(
            "Train the policy again under the refit's posterior (same task, trainer and "
            "budget), with the starts of its failed real runs replayed in training; then "
            "pick the new policy above and predict"
        )
        self.retrain_button.clicked.connect(self.retrain)
        side.addWidget(self.retrain_button)
        self.refit_id: str | None = None
        side.addStretch(1)
        self.status = StatusLine("")
        side.addWidget(self.status)

    def _build_plots(self, row: QtWidgets.QHBoxLayout) -> None:
        """The joint plot (prediction dashed, measured solid, commands dotted) and its key."""
        plots = QtWidgets.QVBoxLayout()
        row.addLayout(plots, 1)
        self.plot = pg.PlotWidget()
        self.plot.setBackground("w")
        self.plot.setLabel("bottom", "time since the policy started", units="s")
        self.plot.setLabel("left", "joint position (rad)")
        self.plot.addLegend(offset=(-5, -5), brush=(255, 255, 255, 210))  # bottom right
        self.plot.setMinimumWidth(420)
        plots.addWidget(self.plot, 1)
        self.key = QtWidgets.QLabel(
            "dashed: twin prediction · solid: measured on the robot · dotted: command sent "
            "(after the envelope) · grey line: goal"
        )
        self.key.setWordWrap(True)
        plots.addWidget(self.key)

    # -- state ---------------------------------------------------------------------------
    def has_content(self) -> bool:
        p = self.controller.project
        return p is not None and p.latest("policy") is not None

    def refresh(self) -> None:
        super().refresh()
        if not hasattr(self, "policy_box") or not self.has_content():
            return
        project = self.controller.project
        assert project is not None
        if self._task is None or self._task.done:  # a run's policy stays shown while it runs
            self.policy_box.set_artifacts(project.artifacts("policy"))
        info = self.controller.robot_info
        link = self.controller.robot_link
        client = link.protocol_client() if link is not None else None
        if info is None or client is None:
            self.robot_label.setText("<span style='color:#c62828'>no robot connected</span>")
        else:
            self.robot_label.setText(
                f"{info.name} at {client.address}, {len(info.joint_names)} joints, "
                f"{info.control_rate_hz:g} Hz"
            )
        busy = self._task is not None and not self._task.done
        self.predict_button.setEnabled(not busy and client is not None)

    def _client(self) -> Any:
        link = self.controller.robot_link
        client = link.protocol_client() if link is not None else None
        if client is None:
            raise TwinbenchError(
                "no robot connected (Devices ▸ Start virtual lab, or Add robot… in the "
                "Devices panel)"
            )
        return client

    def _show_camera_row(self, *_: Any) -> None:
        """The camera pose row only for a policy that observes an object's pose."""
        project, pid = self.controller.project, self.policy_box.currentData()
        wants = False
        if project is not None and pid is not None:
            try:
                wants = "object_pose" in load_policy(project, pid).spec.observation
            except TwinbenchError:
                wants = True  # unreadable: predict says why; keep every field in view
        self._form.setRowVisible(self.camera_pose, wants)

    def _invalidate(self, *_: Any) -> None:
        if self._task is not None and not self._task.done:
            return
        if self.plan is not None:  # the prediction shown was for other choices
            self.prediction.setText("The choices changed: press 1 to predict again.")
            self._say("")
            self.plot.clear()  # its dashed curves too
            self._curves = {}
        self.plan = None
        self.run_button.setEnabled(False)

    # -- the progress bar: the newest job of the page, from 0 ------------------------------
    def _follow(self, task: JobTask, prefix: str = "") -> None:
        """Show `task` in the progress bar (reset to 0 now) and its messages in the status
        line (after `prefix`); full when it finished."""
        self._bar_task = task
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        task.sig_progress.connect(lambda p, t=task: self._on_progress(t, p, prefix))
        task.sig_finished.connect(lambda _r, t=task: self._bar_done(t, True))
        task.sig_failed.connect(lambda _m, t=task: self._bar_done(t, False))
        task.sig_cancelled.connect(lambda t=task: self._bar_done(t, False))

    def _on_progress(self, task: JobTask, p: Progress, prefix: str = "") -> None:
        if isinstance(p.partial, dict) and "measured" in p.partial:
            self._live = p.partial  # drawn by the page's own timer
        self._show_progress(task, p, prefix)

    def _progress_shown(self, task: JobTask, p: Progress, prefix: str) -> None:
        if task.done:  # its outcome is shown already: no older progress after it
            return
        if task is self._bar_task:
            if p.fraction is None:
                self.progress.setRange(0, 0)  # busy, no fraction known
            else:
                self.progress.setRange(0, 1000)
                self.progress.setValue(int(1000 * min(max(p.fraction, 0.0), 1.0)))
        if p.message:
            self._say(prefix + p.message)

    def _bar_done(self, task: JobTask, finished: bool) -> None:
        if task is not self._bar_task:
            return
        self._show_progress.cancel()
        busy = self.progress.maximum() == 0
        self.progress.setRange(0, 1000)
        if finished:
            self.progress.setValue(1000)
        elif busy:
            self.progress.setValue(0)  # a failed job with no fraction: nothing done to show

    # -- 1. predict ------------------------------------------------------------------------
    def predict(self) -> None:
        project, pid = self.controller.project, self.policy_box.currentData()
        try:
            client = self._client()
        except TwinbenchError as exc:
            self._say(str(exc), error=True)
            return
        if project is None or pid is None:
            return
        seed, cam_pose = self.goal_seed.value(), self.camera_pose.path

        def job() -> Job[Any]:
            yield Progress(None, f"checking {pid} against the robot and predicting…")
            objects = None
            if cam_pose is not None and "object_pose" in load_policy(project, pid).spec.observation:
                objects = policy_object_source(project, pid, client, None, cam_pose)
            return plan_deploy(project, client, pid, goal_seed=seed, objects=objects)

        self._invalidate()
        self.predict_button.setEnabled(False)
        self.prediction.setText("checking the policy against the robot and predicting…")
        self.outcome.setText("")
        self._say("predicting in the twin (nothing moves)…")
        task = self.runner.start("Predict deployment", job())
        self._follow(task)
        task.sig_finished.connect(self._predicted)
        task.sig_failed.connect(self._refused)
        task.sig_done.connect(lambda: self.predict_button.setEnabled(True))

    def _refused(self, msg: str) -> None:
        self.prediction.setText(f"<span style='color:#c62828'><b>Refused.</b> {_esc(msg)}</span>")
        self._say("nothing was uploaded", error=True)

    def _predicted(self, plan: Any) -> None:
        self.plan = plan
        s = plan.shadow
        verdict = (
            "<span style='color:#2e7d32'><b>SUCCESS</b></span>"
            if s.success
            else "<span style='color:#c62828'><b>FAILURE</b></span>"
        )
        tol = float(getattr(plan.config, "success_tol", 0.05))
        unit = getattr(s, "unit", "rad")
        obj = getattr(plan, "object_start", None)
        if obj is not None:  # a push: the goal is where the object should end up
            d = float(np.linalg.norm(np.asarray(plan.goal)[:2] - np.asarray(obj)[:2]))
            goal = (
                f"Goal: {_esc(str(plan.spec.object))} to ({plan.goal[0]:.3f}, "
                f"{plan.goal[1]:.3f}) m, {100 * d:.1f} cm from where the camera sees it now."
            )
        else:
            move = np.abs(plan.goal - plan.start)
            goal = (
                f"Goal: {int(np.sum(move > 1e-3))} joints move, up to {float(move.max()):.2f} "
                "rad from the robot's pose now."
            )
        self.prediction.setText(
            f"Spec fits <b>{_esc(plan.robot)}</b> (joints, rate, observations).<br>"
            f"{goal}<br>"
            f"Twin {_esc(plan.twin_id)} predicts {verdict}: final error "
            f"<b>{s.final_error:.3f} {unit}</b> (success below {tol:g}) after "
            f"{float(s.t[-1]):.1f} s." + (f" Stopped: {_esc(s.stopped)}." if s.stopped else "")
        )
        self._draw_prediction()
        self.run_button.setEnabled(True)
        self.outcome.setText("")
        self._say("prediction ready: Run on the robot, or predict again")

    def _draw_prediction(self) -> None:
        self.plot.clear()
        self._curves = {}
        plan = self.plan
        if plan is None:
            return
        s = plan.shadow
        moved = np.flatnonzero(np.abs(plan.goal - plan.start) > 1e-3)
        for k, j in enumerate(moved):
            name = plan.spec.joints[j]
            col = PALETTE[k % len(PALETTE)]
            self.plot.plot(
                s.t,
                s.joint_pos[:, j],
                pen=pg.mkPen(col, width=2, style=QtCore.Qt.PenStyle.DashLine),
                name=name,
            )
            self._curves[name] = (
                self.plot.plot([], [], pen=pg.mkPen(col, width=2)),
                self.plot.plot(
                    [], [], pen=pg.mkPen(col, width=1, style=QtCore.Qt.PenStyle.DotLine)
                ),
                j,
            )
            line = pg.InfiniteLine(pos=float(plan.goal[j]), angle=0, pen=pg.mkPen("#9e9e9e"))
            self.plot.addItem(line)

    # -- 2. run ----------------------------------------------------------------------------
    def run(self) -> None:
        project, plan = self.controller.project, self.plan
        if project is None or plan is None:
            return
        try:
            client = self._client()
        except TwinbenchError as exc:
            self._say(str(exc), error=True)
            return
        self._stop.clear()
        job = deploy_job(
            project,
            client,
            plan,
            duration_s=self.duration.value() or None,
            ramp_s=self.ramp.value(),
            stop_event=self._stop,
        )
        self._task = task = self.runner.start(f"Deploy {plan.policy_id}", job)
        for w in (self.run_button, self.predict_button, self.refit_button, self.retrain_button,
                  self.policy_box):  # fmt: skip
            w.setEnabled(False)
        self.outcome.setText("running on the robot…")
        self._follow(task)
        task.sig_finished.connect(self._ran)
        task.sig_failed.connect(lambda msg: self._say(msg, error=True))
        task.sig_done.connect(self._ended)
        self.timer.start()

    def _draw_live(self) -> None:
        live = self._live
        if not live:
            return
        k = min(len(live["t"]), len(live["measured"]), len(live["command"]))
        if k == 0:
            return
        t = np.asarray(live["t"][:k], float)
        q = np.asarray(live["measured"][:k], float)
        nan = [np.nan] * q.shape[1]
        c = np.asarray([x if x is not None else nan for x in live["command"][:k]], float)
        for solid, dotted, j in self._curves.values():
            solid.setData(t, q[:, j])
            dotted.setData(t, c[:, j], connect="finite")

    def curves(self) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """Drawn curves per joint: {"predicted"|"measured"|"command": (t, y)} (tests read it)."""
        out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        items = {id(it): it for it in self.plot.getPlotItem().listDataItems()}
        for name, (solid, dotted, _) in self._curves.items():
            pred = [it for it in items.values() if it.name() == name]
            d = {"measured": solid.getData(), "command": dotted.getData()}
            if pred:
                d["predicted"] = pred[0].getData()
            out[name] = {k: (np.asarray(v[0]), np.asarray(v[1])) for k, v in d.items()}
        return out

    def _ran(self, res: Any) -> None:
        self.result = res
        self._draw_live()
        o = res.outcome
        ok = "<span style='color:#2e7d32'><b>SUCCESS</b></span>"
        bad = "<span style='color:#c62828'><b>FAILURE</b></span>"
        self.outcome.setText(
            f"Robot: {ok if o['success'] else bad} ({_esc(o['ended'])}), final error "
            f"<b>{o['final_error']:.3f} {o.get('unit', 'rad')}</b>; twin predicted "
            f"{o['predicted_final_error']:.3f}."
            f"<br>Saved trajectory {res.trajectory_id} and run {res.run_id}."
        )
        self.refit_note.setText("")
        self._say("run saved: next, 3. Send to Real2Sim")
        self.refit_button.setEnabled(True)
        self.controller.notify_project_changed()
        self.sig_run_saved.emit(res)

    def _ended(self) -> None:
        self._task = None
        self.timer.stop()
        self.plan = None  # the robot moved: predict again from where it is now
        self.predict_button.setEnabled(True)
        self.policy_box.setEnabled(True)
        self.run_button.setEnabled(False)
        self.refresh()  # policies saved during the run are listed now

    def stop(self) -> None:
        """Stop now: the robot is held; the run (if one is going) is saved as it happened."""
        self._stop.set()
        try:
            self._client().stop("STOP pressed on the Deploy page")
        except TwinbenchError as exc:
            log.warning("stop: %s", exc)
        self._say("stopped: the robot holds its position")

    # -- 3. close the loop ------------------------------------------------------------------
    def refit(self) -> None:
        project, res = self.controller.project, self.result
        if project is None or res is None:
            return
        self.refit_button.setEnabled(False)
        self.retrain_button.setEnabled(False)  # only a refit that fitted is retrained from
        self.refit_id = None
        self.refit_note.setText("refitting the twin with this run…")
        # replays in a worker process: in this one they hold the GIL and stall the window
        job = refit_job(project, res.trajectory_id, isolated=True)
        task = self.runner.start("Refit with the real run", job)
        self._follow(task, "refit: ")
        task.sig_finished.connect(self._refitted)
        task.sig_failed.connect(self._refit_failed)

    def _refit_failed(self, msg: str) -> None:
        self.refit_id = None
        self.retrain_button.setEnabled(False)
        self.refit_button.setEnabled(self.result is not None)
        self.refit_note.setText(
            f"<span style='color:#c62828'><b>Refit failed.</b> {_esc(msg)}<br>Nothing was "
            "saved; 4. Retrain stays off until a refit fits.</span>"
        )
        self._say(f"refit failed: {msg}", error=True)
        self.sig_refit_failed.emit(msg)

    def _refitted(self, fit_id: str) -> None:
        self._say(f"refit {fit_id} saved (see the Calibrate page); 4. retrains from it")
        self.refit_note.setText(f"Refit {_esc(fit_id)} saved: the twin fitted with this run.")
        self.refit_id = fit_id
        self.retrain_button.setEnabled(True)
        self.controller.notify_project_changed()
        self.sig_refit_done.emit(fit_id)

    def retrain(self) -> None:
        project, res = self.controller.project, self.result
        if project is None or res is None or self.refit_id is None:
            return
        policy_id = project.artifact(res.run_id).inputs[0]
        try:
            argv = retrain_argv(project, policy_id, self.refit_id)
        except TwinbenchError as exc:
            self._say(f"retrain: {exc}", error=True)
            return
        self.retrain_button.setEnabled(False)
        job = train_subprocess_job(project.root, argv[3:])  # without "train --project P"
        task = self.runner.start(f"Retrain {policy_id}", job)
        self._follow(task, "retrain: ")
        task.sig_finished.connect(self._retrained)
        task.sig_failed.connect(lambda msg: self._say(f"retrain: {msg}", error=True))

    def _retrained(self, policy_id: str) -> None:
        if self.controller.project is not None:
            self.controller.project.refresh()  # the training process wrote the policy
        self.controller.notify_project_changed()
        self.refresh()
        self.policy_box.select(policy_id)
        self._say(f"retrained: policy {policy_id}; press 1. Predict to see what it will do")
        self.sig_retrained.emit(policy_id)

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet("color: #c62828;" if error else "")
        self.status.setText(text)

    def detach(self) -> None:
        if hasattr(self, "timer"):
            self.timer.stop()
        super().detach()


def _esc(text: str) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


if __name__ == "__main__":
    raise SystemExit(preview(DeployPage))
