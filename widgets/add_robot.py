"""The "Add robot…" dialog: driver, address, token, calibration; connect, watch the live joint
readout, run a slow test motion inside the envelope, stop it, add the robot to the session.
A thin view of app/robot_check.py and app/robot_link.py (which do all the talking to the
robot); the drivers offered are the agent's own (`devices.robots.agent.drivers.DRIVER_NAMES`)."""

from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets

from app import robot_check, robot_link
from app.controller import AppController
from devices.robots.agent.drivers import DRIVER_NAMES
from resources.errors import TwinbenchError


class AddRobotDialog(QtWidgets.QDialog):
    sig_robot_added = QtCore.Signal(object)  # the AgentLink attached to the session

    def __init__(self, controller: AppController, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add robot")
        self.controller = controller
        self.link: robot_link.AgentLink | None = None
        self.motion: robot_check.TestMotion | None = None
        form = QtWidgets.QFormLayout()
        self.driver = QtWidgets.QComboBox()
        self.driver.addItems(list(DRIVER_NAMES))
        self.address = QtWidgets.QLineEdit("127.0.0.1:7700")
        self.token = QtWidgets.QLineEdit()
        self.token.setEchoMode(QtWidgets.QLineEdit.EchoMode.Password)
        self.fingerprint = QtWidgets.QLineEdit()
        self.fingerprint.setPlaceholderText("sha256:… (TLS, for a robot on the network)")
        self.calibration = QtWidgets.QLineEdit()
        self.calibration.setPlaceholderText("servo arms: the calibration JSON (optional check)")
        browse = QtWidgets.QPushButton("…")
        browse.clicked.connect(self._browse)
        cal_row = QtWidgets.QHBoxLayout()
        cal_row.addWidget(self.calibration, 1)
        cal_row.addWidget(browse)
        form.addRow("Driver", self.driver)
        form.addRow("Address", self.address)
        form.addRow("Token", self.token)
        form.addRow("Certificate", self.fingerprint)
        form.addRow("Calibration", cal_row)
        self.hint = QtWidgets.QLabel()
        self.hint.setWordWrap(True)
        self.hint.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status = QtWidgets.QLabel("Not connected.")
        self.status.setWordWrap(True)
        self.table = QtWidgets.QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["joint", "pos (rad)", "range (rad)"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.connect_button = QtWidgets.QPushButton("Connect")
        self.test_button = QtWidgets.QPushButton("Test motion (slow)")
        self.test_button.setToolTip(
            "A slow sine of ±0.15 rad at most on every joint, inside limits"
        )
        self.stop_button = QtWidgets.QPushButton("Stop")
        self.stop_button.setStyleSheet("font-weight: bold; color: #b00020;")
        self.add_button = QtWidgets.QPushButton("Add robot")
        for b in (self.test_button, self.stop_button, self.add_button):
            b.setEnabled(False)
        self.connect_button.clicked.connect(self._connect)
        self.test_button.clicked.connect(self._test)
        self.stop_button.clicked.connect(self._stop)
        self.add_button.clicked.connect(self._add)
        self.driver.currentTextChanged.connect(self._update_hint)
        self.calibration.editingFinished.connect(self._check_calibration)
        buttons = QtWidgets.QHBoxLayout()
        for b in (self.connect_button, self.test_button, self.stop_button, self.add_button):
            buttons.addWidget(b)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.hint)
        lay.addLayout(buttons)
        lay.addWidget(self.status)
        lay.addWidget(self.table, 1)
        self.timer = QtCore.QTimer(self)
        self.timer.setInterval(100)
        self.timer.timeout.connect(self._refresh)
        self._update_hint()

    # -- actions ---------------------------------------------------------------------------
    def _update_hint(self) -> None:
        cmd = robot_check.serve_command(
            self.driver.currentText(), calibration=self.calibration.text()
        )
        self.hint.setText(f"On the robot's computer run:\n{cmd}")

    def _browse(self) -> None:
        path, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Calibration", "", "JSON (*.json)")
        if path:
            self.calibration.setText(path)
            self._check_calibration()

    def _check_calibration(self) -> None:
        self._update_hint()
        text = self.calibration.text().strip()
        if not text:
            return
        try:
            self.status.setText(f"Calibration: {robot_check.check_calibration(Path(text))}")
        except TwinbenchError as exc:
            self.status.setText(f"Calibration problem: {exc}")

    def _connect(self) -> None:
        self._disconnect()
        try:
            self.link = robot_link.connect_agent(
                self.address.text(), self.token.text(), self.fingerprint.text().strip() or None
            )
        except TwinbenchError as exc:
            self.status.setText(f"Could not connect: {exc}")
            return
        info = self.link.info()
        bundle = self.link.bundle()
        extra = " — robot description received (URDF, limits" + (
            ", calibration)" if bundle and bundle.get("calibration") else ")"
        )
        self.status.setText(
            f"Connected to {info.name} at {self.link.address}: {len(info.joint_names)} joints, "
            f"{info.control_rate_hz:g} Hz" + (extra if bundle else "")
        )
        self.table.setRowCount(len(info.joint_names))
        for i, name in enumerate(info.joint_names):
            self.table.setItem(i, 0, QtWidgets.QTableWidgetItem(name))
            rng = f"[{info.limits.lower[i]:+.2f}, {info.limits.upper[i]:+.2f}]"
            self.table.setItem(i, 2, QtWidgets.QTableWidgetItem(rng))
            self.table.setItem(i, 1, QtWidgets.QTableWidgetItem(""))
        for b in (self.test_button, self.stop_button, self.add_button):
            b.setEnabled(True)
        self.timer.start()
        self._refresh()

    def _test(self) -> None:
        if self.link is None:
            return
        self.motion = robot_check.TestMotion(self.link)
        try:
            self.motion.start()
        except TwinbenchError as exc:
            self.status.setText(f"Test motion refused: {exc}")
            return
        self.status.setText("Test motion running (Stop holds the robot)…")

    def _stop(self) -> None:
        if self.motion is not None:
            self.motion.stop()
        elif self.link is not None:
            self.link.stop("stop pressed")
        self.status.setText("Stopped: the robot holds its position.")

    def _add(self) -> None:
        if self.link is None:
            return
        if self.motion is not None:
            self.motion.stop()
        link, self.link = self.link, None
        self.timer.stop()
        self.controller.attach_robot(link, detail=f"{link.info().name} at {link.address}")
        self.sig_robot_added.emit(link)
        self.accept()

    def _refresh(self) -> None:
        if self.link is None:
            return
        st = self.link.latest_state()
        if st is not None:
            for i, q in enumerate(st.joint_pos):
                item = self.table.item(i, 1)
                if item is not None:
                    item.setText(f"{q:+.4f}")
        if self.motion is not None and not self.motion.running and self.motion.error:
            self.status.setText(f"Test motion stopped: {self.motion.error}")

    def _disconnect(self) -> None:
        if self.motion is not None:
            self.motion.stop()
            self.motion = None
        if self.link is not None:
            self.link.close()
            self.link = None
        self.timer.stop()

    def done(self, result: int) -> None:  # accept/reject/close: never leave a link or motion
        if result != QtWidgets.QDialog.DialogCode.Accepted:
            self._disconnect()
        self.timer.stop()
        super().done(result)


if __name__ == "__main__":  # preview: python -m widgets.add_robot (an emulated Feetech arm)
    import sys

    qapp = QtWidgets.QApplication(sys.argv)
    agent = robot_check.start_emulated_agent("feetech")
    try:
        dlg = AddRobotDialog(AppController())
        dlg.driver.setCurrentText("feetech")
        dlg.address.setText(f"{agent.host}:{agent.port}")
        dlg.token.setText(agent.token)
        dlg.show()
        qapp.exec()
    finally:
        agent.terminate()
