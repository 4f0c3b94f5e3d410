"""The record panel against the virtual lab process (any robot over the protocol): the
preview draws exactly the planned joint curves before anything moves, Record saves the
motion into the project, and the big Stop button stops the robot at once and saves
nothing."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from app.robot_link import AgentLink
from devices.robots.agent.launch import start_lab_process
from devices.robots.client import RobotClient
from widgets.record_panel import RecordPanel

pytestmark = [pytest.mark.gui, pytest.mark.slow]


@pytest.fixture
def lab_controller(controller, tmp_path) -> Iterator[object]:  # type: ignore[no-untyped-def]
    lab = start_lab_process("panda_table", extra_args=["--no-cameras"])
    client = RobotClient(lab.host, lab.port, lab.token, name="test-gui")
    client.connect()
    client.latest_state(timeout_s=5.0)
    controller.attach_robot(
        AgentLink(client, f"{lab.host}:{lab.port}", process=lab, is_lab=True), detail="lab"
    )
    controller.new_project(tmp_path / "p")
    yield controller
    controller.detach_robot()


def _panel(qtbot, controller) -> RecordPanel:  # type: ignore[no-untyped-def]
    panel = RecordPanel(controller)
    qtbot.addWidget(panel)
    return panel


def test_preview_shows_the_plan_then_record_saves_it(lab_controller, qtbot) -> None:  # type: ignore[no-untyped-def]
    controller = lab_controller
    panel = _panel(qtbot, controller)
    q_before = controller.robot_state().joint_pos.copy()
    panel.motion_box.setCurrentText("chirp")
    panel.duration.setValue(2.0)
    panel.joints.setText("panda_joint2,panda_joint4")
    assert not panel.record_button.isEnabled()  # nothing to record before a preview
    panel.preview_button.click()
    qtbot.waitUntil(lambda: panel.record_button.isEnabled(), timeout=10000)
    m = panel.motion
    assert m is not None and m.moved_joints() == ["panda_joint2", "panda_joint4"]
    curves = panel.curves()
    assert set(curves) == {"panda_joint2", "panda_joint4"}
    t, y = curves["panda_joint4"]
    np.testing.assert_allclose(t, m.t)
    np.testing.assert_allclose(y, m.command[:, 3] - m.command[0, 3])
    # the preview moved nothing
    assert np.max(np.abs(controller.robot_state().joint_pos - q_before)) < 2e-3
    with qtbot.waitSignal(panel.sig_recorded, timeout=20000) as sig:
        panel.record_button.click()
    tid = sig.args[0]
    traj = controller.load_trajectory(tid)
    assert traj.meta["motion"] == "chirp" and traj.meta["motion_params"]["joints"] == (
        "panda_joint2,panda_joint4"
    )
    span = np.ptp(traj["robot/joint_pos"], axis=0)
    assert span[1] > 0.5 * np.ptp(m.command[:, 1]) and span[0] < 0.01
    assert panel.progress.value() == 1000
    assert not panel.record_button.isEnabled()  # the robot moved: preview again first
    qtbot.waitUntil(lambda: not panel.runner.running(), timeout=5000)


def test_stop_button_stops_the_robot_and_saves_nothing(lab_controller, qtbot) -> None:  # type: ignore[no-untyped-def]
    controller = lab_controller
    panel = _panel(qtbot, controller)
    panel.motion_box.setCurrentText("multisine")
    panel.duration.setValue(8.0)
    panel.preview_button.click()
    qtbot.waitUntil(lambda: panel.record_button.isEnabled(), timeout=10000)
    panel.record_button.click()
    qtbot.waitUntil(lambda: panel.progress.value() > 250, timeout=10000)
    assert np.max(np.abs(controller.robot_state().joint_vel)) > 0.01  # it is moving
    panel.stop_button.click()
    qtbot.waitUntil(lambda: not panel.runner.running(), timeout=5000)
    client = controller.robot_link.protocol_client()
    assert client.latest_status()["mode"] == "stopped"
    qtbot.wait(600)  # the hold brings it to rest
    q1 = controller.robot_state().joint_pos.copy()
    qtbot.wait(300)
    assert np.max(np.abs(controller.robot_state().joint_pos - q1)) < 2e-3
    assert controller.project.artifacts("trajectory") == []
    assert "stopped" in panel.summary.text()


def test_devices_panel_opens_the_record_panel_for_the_connected_robot(
    lab_controller, qtbot
) -> None:  # type: ignore[no-untyped-def]
    from widgets.devices_panel import DevicesPanel

    panel = DevicesPanel(lab_controller, with_3d=False)
    qtbot.addWidget(panel)
    panel.show()
    assert panel.motion_button.isVisible()
    panel.motion_button.click()
    dialog = panel.record_dialog
    assert dialog.isVisible() and dialog.panel.motion_box.count() >= 4
    dialog.close()
    lab_controller.detach_robot()
    qtbot.waitUntil(lambda: not panel.motion_button.isVisible(), timeout=2000)
    panel.detach()


def test_suggest_fills_in_the_most_informative_motion(controller, tmp_path, qtbot) -> None:  # type: ignore[no-untyped-def]
    from app.workflows.twin import build_twin, load_twin
    from devices.robots.excitation import plan
    from resources import atomic
    from resources.jobs import run_to_end
    from twins.fit.design import robot_info_for, simulate_motion, start_pose

    proj = controller.new_project(tmp_path / "p")
    panel = _panel(qtbot, controller)
    panel.suggest_button.click()  # no fit yet: said, nothing runs
    assert "fit the twin first" in panel.summary.text()
    twin_id = run_to_end(build_twin(proj, None, procedural=True, name="demo"))
    _, spec = load_twin(proj, twin_id)
    info = robot_info_for(spec)
    m = plan(
        "chirp", info, start_pose(spec, info), amplitude=0.1, duration=2.0, joints="panda_joint1"
    )
    with proj.new_artifact("trajectory", summary="joint 1 only") as folder:
        simulate_motion(spec, {}, m).with_channels(source="real").save(folder)
    rid = proj.artifacts("trajectory")[-1].id
    bw = ["robot.actuators.panda_joint1.bandwidth", "robot.actuators.panda_joint4.bandwidth"]
    with proj.new_artifact("fit", inputs=[twin_id, rid], summary="a fit") as folder:
        atomic.write_json(
            folder / "fit.json",
            {
                "status": "done",
                "twin": twin_id,
                "trajectories": [rid],
                "estimate": {bw[0]: 30.0, bw[1]: 30.0},
            },
        )
    panel.suggest_only = ["chirp:panda_joint1", "steps:panda_joint2", "chirp:panda_joint4"]
    panel.suggest_button.click()
    qtbot.waitUntil(lambda: panel.suggestion is not None, timeout=120000)
    assert panel.suggestion.name == "chirp:panda_joint4"
    assert panel.motion_box.currentText() == "chirp"
    assert panel.joints.text() == "panda_joint4"
    assert "suggested: chirp:panda_joint4" in panel.summary.text()
    qtbot.waitUntil(lambda: not panel.runner.running(), timeout=5000)
