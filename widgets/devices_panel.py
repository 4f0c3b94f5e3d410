"""Devices panel: camera and robot connection status, and the robot's live state.

While a robot is connected a QTimer pulls the newest state from the controller (20 Hz; the
robot's client owns its read thread) and fills the joint table and the 3D view (end effector
frame and its recent path). The same timer asks the controller to bring the rows up to date
(`poll_devices`, 4 Hz): a robot or camera that sent nothing for 2 s reads "stale", a dropped
link "reconnecting…" (the table and 3D view keep the last state and go on after it), then
"connected" again; the rate line counts states of the last 2 s only, so it is right again
within a few seconds of a reconnect or a restarted lab.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque

import numpy as np
from PySide6 import QtCore, QtWidgets

from app import demo
from app.controller import AppController, DeviceStatus
from app.robot_link import AgentLink
from devices.robots.wire.robot_types import RobotState
from devices.trajectory import Trajectory
from resources.errors import TwinbenchError
from widgets.add_robot import AddRobotDialog
from widgets.jobs import JobRunner
from widgets.record_panel import RecordDialog
from widgets.scene_view import SceneView

log = logging.getLogger(__name__)

REFRESH_MS = 50  # 20 Hz pull of the newest state; drawing happens only on change
TRAIL_S = 3.0
REDRAW_RAD = 1e-3  # 3D arm redrawn when a joint moved more than this (0.06°, below a pixel)
RATE_LABEL_S = 1.0
RATE_WINDOW_S = 2.0  # the state-stream rate is measured over this much robot time
POLL_S = 0.25  # device rows brought up to date this often (controller.poll_devices)
LIVE = ("connected", "reconnecting", "stale")  # robot states that keep the live view
# Any repaint makes Qt recompose the whole window through OpenGL (the 3D views are
# QOpenGLWidgets); with Mesa's software renderer that costs ~25 ms of CPU, so numbers are
# shown at 4 Hz while the arm moves and at 1 Hz while it holds still (sensor noise only),
# not at the 20 Hz pull rate.
TABLE_S = 0.25
TABLE_IDLE_S = 1.0
MOVING_RAD_S = 0.02
DOT = {
    "connected": "#2e7d32",
    "connecting": "#f9a825",
    "reconnecting": "#f9a825",
    "stale": "#ef6c00",
    "error": "#c62828",
    "unavailable": "#9e9e9e",
    "disconnected": "#9e9e9e",
}


class DeviceRow(QtWidgets.QWidget):
    """● Robot — connected — panda @ 127.0.0.1:7001"""

    def __init__(self, title: str, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = title
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        self.dot = QtWidgets.QLabel("●")
        self.label = QtWidgets.QLabel("")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.dot)
        lay.addWidget(self.label, 1)

    def set_status(self, st: DeviceStatus) -> None:
        self.dot.setStyleSheet(f"color: {DOT.get(st.state, '#9e9e9e')}; font-size: 16px;")
        self.label.setText(f"<b>{self.title}</b> — {st.state}<br><small>{st.detail}</small>")
        self.setToolTip(f"{self.title}: {st.state}\n{st.detail}")


class DevicesPanel(QtWidgets.QWidget):
    """Connection status of camera and robot; joint table and 3D view of the live robot."""

    sig_devices_changed = QtCore.Signal(object)  # dict[str, DeviceStatus], on the GUI thread

    def __init__(
        self,
        controller: AppController,
        parent: QtWidgets.QWidget | None = None,
        with_3d: bool = True,
        runner: JobRunner | None = None,
    ) -> None:
        super().__init__(parent)
        self.controller = controller
        self.runner = runner  # the window's (the record dialog's jobs run there), or None
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.rows = {"robot": DeviceRow("Robot"), "camera": DeviceRow("Camera")}
        for r in self.rows.values():
            lay.addWidget(r)
        self.rate = QtWidgets.QLabel("")
        self.rate.setStyleSheet("color: #6b6b6b;")
        lay.addWidget(self.rate)
        self._build_buttons(lay)
        lay.addWidget(self._build_robot_view(with_3d), 1)
        self._trail: deque[tuple[float, np.ndarray]] = deque()
        self._last_seq: int | None = None
        self._cells: dict[tuple[int, int], str] = {}
        self._drawn_q: np.ndarray | None = None
        self._rate_shown = 0.0
        self._table_shown = 0.0
        self._rate_window: deque[tuple[float, int]] = deque()
        self._shown_info: object | None = None
        self._polled = 0.0
        self.refreshes = 0  # timer ticks that drew a new state (tests read it)
        self.timer = QtCore.QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.refresh_state)
        self.sig_devices_changed.connect(
            self._on_devices, QtCore.Qt.ConnectionType.QueuedConnection
        )
        controller.devices_changed.connect(self._from_model)
        self._on_devices(controller.devices())

    def _build_buttons(self, lay: QtWidgets.QVBoxLayout) -> None:
        """Move arm (demo) and Record 5 s (shown for the lab), Record motion (shown for a robot
        reached through the protocol), all hidden until then, and Add robot."""
        self.move_button = QtWidgets.QPushButton("Move arm (demo motion, 12 s)")
        self.move_button.setToolTip(
            "Command a slow sine motion on three joints through the "
            "robot protocol, then hold. Cancel it in the status bar."
        )
        self.move_button.clicked.connect(self._demo_motion)
        self.record_seconds = 5.0
        self.record_button = QtWidgets.QPushButton("Record 5 s")
        self.record_button.setToolTip(
            "Record 5 s of the robot's measured state into the open "
            "project as a real trajectory (see the Calibrate page)."
        )
        self.record_button.clicked.connect(self._record)
        self.motion_button = QtWidgets.QPushButton("Record motion…")
        self.motion_button.setToolTip(
            "Choose an excitation motion (chirp, multisine, steps, push), see what will move, "
            "record it into the project (any connected robot)."
        )
        self.motion_button.clicked.connect(self._record_motion)
        self.motion_button.hide()
        buttons = QtWidgets.QHBoxLayout()
        buttons.addWidget(self.move_button, 2)
        buttons.addWidget(self.record_button, 1)
        lay.addLayout(buttons)
        lay.addWidget(self.motion_button)
        self.add_robot_button = QtWidgets.QPushButton("Add robot…")
        self.add_robot_button.setToolTip(
            "Connect to a robot agent (Franka, Dynamixel or Feetech arm, lab), check it with "
            "a live readout and a slow test motion, and add it."
        )
        self.add_robot_button.clicked.connect(self._add_robot)
        lay.addWidget(self.add_robot_button)
        for b in (self.move_button, self.record_button):
            b.hide()

    def _build_robot_view(self, with_3d: bool) -> QtWidgets.QSplitter:
        """The live robot: the joint table and end effector (or, with no robot, how to get
        one) above its 3D view when `with_3d`."""
        self.table = QtWidgets.QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["joint", "pos (rad)", "vel (rad/s)", "effort (N·m)"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QtWidgets.QHeaderView.ResizeMode.Stretch)
        self.setMinimumWidth(260)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.setMinimumHeight(7 * 22 + 30)
        self.ee = QtWidgets.QLabel("")
        self.ee.setWordWrap(True)
        self.no_robot = QtWidgets.QLabel(
            "Connect a robot to see its joint state and end "
            "effector here. No hardware? Devices ▸ Start virtual "
            "lab (or run python main.py demo)."
        )
        self.no_robot.setWordWrap(True)
        self.no_robot.setStyleSheet("color: #6b6b6b; padding: 8px;")
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Vertical)
        top = QtWidgets.QWidget()
        tl = QtWidgets.QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.no_robot)
        tl.addWidget(self.table)
        tl.addWidget(self.ee)
        split.addWidget(top)
        self.scene: SceneView | None = SceneView(native_window=True) if with_3d else None
        if self.scene is not None:
            box = QtWidgets.QWidget()
            bl = QtWidgets.QVBoxLayout(box)
            bl.setContentsMargins(0, 4, 0, 0)
            caption = QtWidgets.QLabel(
                "<b>Robot, live 3D</b> <small>(base frame, 10 cm grid: "
                "arm in orange, end effector path in yellow; drag to "
                "orbit, wheel to zoom)</small>"
            )
            caption.setWordWrap(True)
            bl.addWidget(caption)
            bl.addWidget(self.scene, 1)
            split.addWidget(box)
            split.setSizes([220, 280])
        return split

    def _from_model(self, devs: dict[str, DeviceStatus]) -> None:
        try:
            self.sig_devices_changed.emit(devs)
        except RuntimeError:  # panel already destroyed
            self.controller.devices_changed.disconnect(self._from_model)

    def detach(self) -> None:
        """Stop the refresh timer and stop observing the controller."""
        self.timer.stop()
        self.controller.devices_changed.disconnect(self._from_model)

    def _on_devices(self, devs: dict[str, DeviceStatus]) -> None:
        for name, row in self.rows.items():
            row.set_status(devs.get(name, DeviceStatus(name, "disconnected", "")))
        info = self.controller.robot_info
        robot = devs.get("robot", DeviceStatus("robot", "disconnected"))
        if info is not None and robot.state in LIVE:
            if robot.state != "connected":
                self._set_text(self.rate, f"state stream: {robot.state} ({robot.detail})")
                self._rate_window.clear()
            if info is self._shown_info and self.timer.isActive():
                return  # the same robot: its view goes on (after a reconnect too)
            self._shown_info = info
            self.table.setRowCount(len(info.joint_names))
            prefix = (
                os.path.commonprefix(list(info.joint_names)) if len(info.joint_names) > 1 else ""
            )
            prefix = prefix[: prefix.rfind("_") + 1]  # "panda_joint1" -> "joint1"
            for i, jn in enumerate(info.joint_names):
                cell = QtWidgets.QTableWidgetItem(jn[len(prefix) :] or jn)
                cell.setToolTip(jn)
                self.table.setItem(i, 0, cell)
                for c in (1, 2, 3):
                    self.table.setItem(i, c, QtWidgets.QTableWidgetItem("—"))
            self._trail.clear()
            self._last_seq = None
            self._cells.clear()
            self._drawn_q = None
            self._rate_window.clear()
            self.table.show()
            self.no_robot.hide()
            is_lab = bool(getattr(self.controller.robot_link, "is_lab", False))
            for b in (self.move_button, self.record_button):
                b.setVisible(is_lab)
                b.setEnabled(True)
            link = self.controller.robot_link
            self.motion_button.setVisible(link is not None and link.protocol_client() is not None)
            self.timer.start()
        else:
            self._shown_info = None
            self.timer.stop()
            self.table.setRowCount(0)
            self.table.hide()
            self.no_robot.show()
            self.move_button.hide()
            self.record_button.hide()
            self.motion_button.hide()
            self.ee.setText("")
            self.rate.setText("")
            if self.scene is not None:
                for name in ("ee", "ee_path", "arm", "joints"):
                    self.scene.remove(name)

    def _demo_motion(self) -> None:
        link = self.controller.robot_link
        if not isinstance(link, AgentLink) or not link.is_lab:
            return
        self.move_button.setEnabled(False)
        enable = lambda *_: self.move_button.setEnabled(True)  # noqa: E731
        self.controller.submit_job(
            "Demo motion", demo.motion_job(link), on_done=enable, on_failed=enable
        )

    def _record(self) -> None:
        link = self.controller.robot_link
        if not isinstance(link, AgentLink) or not link.is_lab:
            return
        self.record_button.setEnabled(False)

        def done(traj: Trajectory) -> None:
            self.record_button.setEnabled(True)
            try:
                self.controller.save_trajectory(
                    traj,
                    summary=f"{self.record_seconds:g} s from the virtual lab at "
                    + time.strftime("%H:%M:%S"),
                )
            except TwinbenchError as exc:
                log.error("could not save the recording: %s", exc)

        self.controller.submit_job(
            "Record",
            demo.record_job(link, self.record_seconds),
            on_done=done,
            on_failed=lambda _: self.record_button.setEnabled(True),
        )

    def _add_robot(self) -> None:
        AddRobotDialog(self.controller, self).open()

    def _record_motion(self) -> None:
        self.record_dialog = RecordDialog(self.controller, self, runner=self.runner)
        self.record_dialog.show()

    def refresh_state(self, force: bool = False) -> None:
        """Pull the newest robot state and draw what changed (called by the timer).

        Text is set only when the shown digits change and the 3D arm is redrawn only when a
        joint moved by more than `REDRAW_RAD`, so a robot holding still (sensor noise
        included) costs next to nothing; `force` draws regardless (tests, soaks)."""
        now = time.monotonic()
        if now - self._polled >= POLL_S:
            self._polled = now
            self.controller.poll_devices()  # stale / reconnecting / connected rows
        st = self.controller.robot_state()
        if st is None or (st.seq == self._last_seq and not force):
            return
        self._last_seq = st.seq
        self.refreshes += 1
        self._note_rate(st)
        self._draw_state(st, force)

    def _note_rate(self, st: RobotState) -> None:
        """Keep (t, seq) of every new state over the last `RATE_WINDOW_S` of robot time; a
        clock or counter that went back (a restarted lab) starts the window afresh."""
        w = self._rate_window
        if w and (st.t <= w[-1][0] or st.seq <= w[-1][1]):
            w.clear()
        w.append((st.t, st.seq))
        while len(w) > 2 and st.t - w[0][0] > RATE_WINDOW_S:
            w.popleft()

    def _set_text(self, label: QtWidgets.QLabel, text: str) -> None:
        if label.text() != text:
            label.setText(text)

    def _draw_state(self, st: RobotState, force: bool = False) -> None:
        now = time.monotonic()
        moving = float(np.max(np.abs(st.joint_vel), initial=0.0)) > MOVING_RAD_S
        if not force and now - self._table_shown < (TABLE_S if moving else TABLE_IDLE_S):
            return
        self._table_shown = now
        n = min(self.table.rowCount(), len(st.joint_pos))
        for i in range(n):
            for c, arr in ((1, st.joint_pos), (2, st.joint_vel), (3, st.joint_effort)):
                text = f"{float(arr[i]):+.3f}" if i < len(arr) else "—"
                if self._cells.get((i, c)) == text and not force:
                    continue
                self._cells[(i, c)] = text
                item = self.table.item(i, c)
                if item is None:
                    self.table.setItem(i, c, QtWidgets.QTableWidgetItem(text))
                else:
                    item.setText(text)
        if len(self._rate_window) > 1 and (force or now - self._rate_shown >= RATE_LABEL_S):
            self._rate_shown = now
            (t0, s0), (t1, s1) = self._rate_window[0], self._rate_window[-1]
            hz = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
            self._set_text(self.rate, f"state stream {hz:.0f} Hz · seq {st.seq} · t = {st.t:.1f} s")
        q = np.asarray(st.joint_pos, dtype=float)
        moved = (
            self._drawn_q is None
            or self._drawn_q.shape != q.shape
            or float(np.max(np.abs(q - self._drawn_q))) > REDRAW_RAD
        )
        if st.ee_pos is not None:
            p = np.asarray(st.ee_pos, dtype=float)
            self._set_text(
                self.ee, f"end effector (base frame): x {p[0]:+.3f}  y {p[1]:+.3f}  z {p[2]:+.3f} m"
            )
            if moved or not self._trail or force:
                self._trail.append((now, p))
        trail_expired = False
        while self._trail and now - self._trail[0][0] > TRAIL_S:
            self._trail.popleft()
            trail_expired = True
        if self.scene is None or not (moved or trail_expired or force):
            return
        self._drawn_q = q
        pts = self.controller.robot_links(q)
        if pts is not None:
            self.scene.set_polyline("arm", pts, color=(0.95, 0.6, 0.15, 1.0), width=5.0)
            self.scene.set_points("joints", pts[:-1], (1.0, 0.85, 0.6, 1.0), size_px=8.0)
        if st.ee_pos is not None:
            T = np.eye(4)
            T[:3, 3] = np.asarray(st.ee_pos, dtype=float)
            self.scene.set_frame("ee", T, size=0.08)
        if len(self._trail) > 1:
            self.scene.set_polyline("ee_path", np.array([p for _, p in self._trail]))
        else:
            self.scene.remove("ee_path")
