"""The demo against the real virtual lab process: the devices panel shows the robot live
(>= 10 Hz), the 3D view draws the arm, the demo motion moves it through the protocol, and
closing the window stops the lab."""

from __future__ import annotations

import numpy as np
import pytest

from app import demo, robot_link
from app.robot_link import AgentLink

pytestmark = [pytest.mark.gui, pytest.mark.slow]


@pytest.fixture
def lab_window(window, controller, qtbot):  # type: ignore[no-untyped-def]
    if robot_link.lab_problem() is not None:
        pytest.fail(str(robot_link.lab_problem()))
    window.act_start_lab.trigger()  # Devices ▸ Start virtual lab
    assert controller.devices()["robot"].state == "connecting"
    qtbot.waitUntil(lambda: controller.devices()["robot"].state != "connecting", timeout=60000)
    assert controller.devices()["robot"].state == "connected", controller.devices()["robot"]
    return window


def test_devices_panel_shows_lab_robot_live(lab_window, controller, qtbot) -> None:
    panel = lab_window.devices_panel
    link = controller.robot_link
    assert isinstance(link, AgentLink) and link.is_lab and link.process.alive
    qtbot.waitUntil(lambda: panel.refreshes > 2, timeout=5000)
    assert "connected" in panel.rows["robot"].label.text()
    assert "virtual lab" in panel.rows["robot"].label.text()
    assert panel.table.rowCount() == 7
    assert panel.table.item(0, 0).text() == "joint1"  # common prefix "panda_" dropped
    assert panel.table.item(0, 0).toolTip() == "panda_joint1"
    n0 = panel.refreshes
    qtbot.waitUntil(lambda: panel.refreshes >= n0 + 5, timeout=10000)  # keeps drawing
    qtbot.waitUntil(lambda: "Hz" in panel.rate.text(), timeout=5000)
    # the table shows the state the robot reports
    panel.refresh_state(force=True)
    st = controller.robot_state()
    shown = float(panel.table.item(3, 1).text())
    assert shown == pytest.approx(st.joint_pos[3], abs=0.01)
    # the drawn arm ends at the end effector the lab reports (independent kinematics)
    arm = panel.scene.items()["arm"].data["xyz"]
    assert arm.shape == (10, 3)
    assert np.allclose(arm[-1], st.ee_pos, atol=0.005)
    assert "end effector" in panel.ee.text()
    assert "fixed" in controller.devices()["camera"].detail


def test_demo_motion_moves_arm_and_cancel_holds(lab_window, controller, qtbot) -> None:
    link = controller.robot_link
    q0 = controller.robot_state().joint_pos.copy()
    task = lab_window.runner.start("Demo motion", demo.motion_job(link, duration_s=30.0))
    qtbot.waitUntil(
        lambda: abs(controller.robot_state().joint_pos[0] - q0[0]) > 0.05, timeout=10000
    )
    with qtbot.waitSignal(task.sig_cancelled, timeout=5000):
        task.cancel()
    qtbot.wait(300)
    q1 = controller.robot_state().joint_pos.copy()
    qtbot.wait(300)
    q2 = controller.robot_state().joint_pos.copy()
    assert np.max(np.abs(q2 - q1)) < 0.02  # held after the stop
    assert link.client.latest_status()["mode"] in ("stopped", "idle")


def test_closing_window_stops_lab(lab_window, controller, qtbot) -> None:
    link = controller.robot_link
    lab_window.close()
    assert not link.process.alive
    assert link.process.proc.returncode is not None
    assert controller.devices()["robot"].state == "disconnected"
    assert not lab_window.devices_panel.timer.isActive()


def test_record_button_saves_trajectory_shown_on_calibrate(
    lab_window, controller, tmp_path, qtbot
) -> None:
    controller.new_project(tmp_path / "rec")
    panel = lab_window.devices_panel
    panel.record_seconds = 0.5
    assert panel.record_button.isVisible()
    panel.record_button.click()
    qtbot.waitUntil(lambda: bool(controller.project.artifacts("trajectory")), timeout=10000)
    traj = controller.load_trajectory(controller.project.artifacts("trajectory")[0].id)
    assert traj.source == "real" and 0.4 < traj.duration < 0.6
    assert traj.meta["rate_hz"] == pytest.approx(250.0, rel=0.1)
    page = lab_window.show_step("calibrate")
    qtbot.waitUntil(lambda: not page.showing_empty_state())
    assert "real/joint_pos/panda_joint1" in page.plot.series()


def _lab_children() -> list[int]:
    """PIDs of `lab serve` processes started by this test process."""
    import os
    from pathlib import Path

    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and (b"lab serve" in cmd or b"--driver lab" in cmd):
            out.append(int(d.name))
    return out


def test_cancelling_lab_start_leaves_no_lab_process(window, qtbot) -> None:
    assert _lab_children() == []
    task = window.runner.start("Start virtual lab", robot_link.lab_job())
    with qtbot.waitSignal(task.sig_progress, timeout=5000):
        pass
    task.cancel()  # lands while the lab is starting, or at its next yield
    qtbot.waitUntil(lambda: task.done, timeout=60000)
    assert task.state == "cancelled"
    qtbot.waitUntil(lambda: _lab_children() == [], timeout=5000)


def test_lab_crash_shows_connection_lost(lab_window, controller, qtbot) -> None:
    link = controller.robot_link
    panel = lab_window.devices_panel
    qtbot.waitUntil(lambda: panel.refreshes > 0, timeout=5000)
    link.process.proc.kill()  # the robot vanishes mid-stream
    qtbot.waitUntil(lambda: controller.devices()["robot"].state == "error", timeout=5000)
    detail = controller.devices()["robot"].detail
    assert "connection lost" in detail and str(link.process.port) in detail
    qtbot.waitUntil(lambda: "error" in panel.rows["robot"].label.text(), timeout=2000)
    assert not panel.timer.isActive() and panel.no_robot.isVisible()
    assert controller.robot_link is None
    assert any("robot connection lost" in t for t, _ in lab_window.log_panel.rows())
