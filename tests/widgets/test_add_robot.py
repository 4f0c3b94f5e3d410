"""The Add-robot dialog against a real agent (protocol server, envelope) in front of an
emulated Feetech arm: connect, live readout equals the servos, a slow test motion moves the
arm inside the envelope, Stop holds it, Add attaches it to the session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PySide6 import QtCore

from app.controller import AppController
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers import DRIVER_NAMES
from devices.robots.agent.drivers.arm_calibration import default_calibration
from devices.robots.agent.drivers.feetech import make_driver
from devices.robots.agent.emulators.feetech_bus import FeetechBus
from devices.robots.agent.emulators.judge import unsafe_goals
from devices.robots.agent.server import RobotServer
from devices.robots.wire.auth import new_token
from widgets.add_robot import AddRobotDialog

pytestmark = pytest.mark.gui


@pytest.fixture
def arm() -> Iterator[dict[str, Any]]:
    cal = default_calibration("feetech")
    q0 = np.array([0.2, -0.1, 0.0, 0.3, 0.0, 0.1])
    bus = FeetechBus(cal.ids, positions=[float(t) for t in cal.to_ticks(q0)]).start()
    agent = Agent(make_driver(bus.port, cal, rate_hz=100.0))
    token = new_token()
    server = RobotServer(agent, token, port=0)
    agent.start()
    server.start()
    yield {"bus": bus, "cal": cal, "q0": q0, "token": token, "port": server.port}
    server.close()
    agent.close()
    bus.close()


def test_add_robot_connect_test_motion_stop_add(
    qtbot: Any, controller: AppController, arm: dict[str, Any], tmp_path: Path
) -> None:
    dlg = AddRobotDialog(controller)
    qtbot.addWidget(dlg)
    dlg.driver.setCurrentText("feetech")
    cal_file = tmp_path / "so101.json"
    cal_file.write_text(json.dumps(arm["cal"].to_dict()))
    dlg.calibration.setText(str(cal_file))
    dlg._check_calibration()
    assert "6 joints" in dlg.status.text()
    assert "--driver feetech" in dlg.hint.text() and str(cal_file) in dlg.hint.text()
    dlg.token.setText("wrong-token-" + "x" * 20)
    dlg.address.setText(f"127.0.0.1:{arm['port']}")
    qtbot.mouseClick(dlg.connect_button, QtCore.Qt.MouseButton.LeftButton)
    assert "Could not connect" in dlg.status.text()
    dlg.token.setText(arm["token"])
    qtbot.mouseClick(dlg.connect_button, QtCore.Qt.MouseButton.LeftButton)
    assert "Connected to so101" in dlg.status.text(), dlg.status.text()
    assert "robot description received" in dlg.status.text()

    def readout() -> np.ndarray:
        items = [dlg.table.item(i, 1) for i in range(6)]
        return np.array([float(it.text() or "nan") if it else np.nan for it in items])

    qtbot.waitUntil(lambda: np.allclose(readout(), arm["q0"], atol=2e-3), timeout=3000)
    bus, cal = arm["bus"], arm["cal"]
    start = {i: int(t) for i, t in zip(cal.ids, cal.to_ticks(arm["q0"]), strict=True)}
    qtbot.mouseClick(dlg.test_button, QtCore.Qt.MouseButton.LeftButton)

    def moved() -> bool:
        q = cal.to_rad(np.array([bus.servo(i).position for i in cal.ids]))
        return bool(np.abs(q - arm["q0"]).max() > 0.08)

    qtbot.waitUntil(moved, timeout=5000)
    qtbot.mouseClick(dlg.stop_button, QtCore.Qt.MouseButton.LeftButton)
    assert "Stopped" in dlg.status.text()
    qtbot.wait(300)
    p1 = [bus.servo(i).position for i in cal.ids]
    qtbot.wait(300)
    np.testing.assert_allclose([bus.servo(i).position for i in cal.ids], p1, atol=1.0)
    assert unsafe_goals(bus.goals, cal, 100.0, start) == []
    # the test motion stays within its 0.15 rad amplitude of the start (inside the range)
    dev = [
        abs(float(cal.to_rad(np.array([raw] * 6))[k]) - arm["q0"][k])
        for _, sid, raw in bus.goals
        for k in [cal.ids.index(sid)]
    ]
    assert len(dev) > 50 and max(dev) <= 0.15 + 2e-3
    qtbot.mouseClick(dlg.add_button, QtCore.Qt.MouseButton.LeftButton)
    assert controller.robot_link is not None
    assert controller.robot_info is not None and controller.robot_info.name == "so101"


def test_devices_panel_opens_the_dialog(qtbot: Any, controller: AppController) -> None:
    from widgets.devices_panel import DevicesPanel

    panel = DevicesPanel(controller, with_3d=False)
    qtbot.addWidget(panel)
    qtbot.mouseClick(panel.add_robot_button, QtCore.Qt.MouseButton.LeftButton)
    dialogs = panel.findChildren(AddRobotDialog)
    assert len(dialogs) == 1 and dialogs[0].isVisible()
    assert dialogs[0].driver.count() == len(DRIVER_NAMES)  # the agent's own driver list
    dialogs[0].reject()
