"""Guided wrist scan of a connected robot: the virtual lab as its own process, reached only
through the robot protocol; objects checked against the lab's true geometry."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.workflows.scan_frames import ScanOptions
from app.workflows.scan_robot import RobotScanError, RobotScanPlan, scan_robot
from devices.robots.agent.launch import LabProcess, start_lab_process
from devices.robots.client import RobotClient
from resources.jobs import run_to_end

pytestmark = [pytest.mark.slow, pytest.mark.realtime]


@pytest.fixture(scope="module")
def lab() -> Iterator[LabProcess]:
    with start_lab_process("panda_table", camera_size="424x240", camera_fps=15) as lab:
        yield lab


def _still(robot: RobotClient, window_s: float = 0.3) -> float:
    """Largest joint motion (rad) over `window_s` of the state stream."""
    traj = robot.stream(window_s)
    q = traj.channels["robot/joint_pos"]
    return float(np.max(np.abs(q - q[0])))


def _status_after_stop(robot: RobotClient, timeout_s: float = 1.0) -> dict[str, object]:
    """The streamed status once it reports the stop (the next state after the reply)."""
    end = time.monotonic() + timeout_s
    while (st := robot.latest_status())["mode"] != "stopped" and time.monotonic() < end:
        time.sleep(0.01)
    return st


def test_guided_scan_finds_objects_where_they_are(lab: LabProcess, tmp_path: Path) -> None:
    from devices.lab.scenes import panda_table_config
    from devices.lab.truth import truth_meshes

    rec = tmp_path / "robot.db3"
    with RobotClient(lab.host, lab.port, lab.token) as robot:
        # the TRUE hand-eye (tests only): isolates FK + frame/state pairing from calibration
        res = run_to_end(
            scan_robot(
                robot,
                ScanOptions(),
                record=rec,
                plan=RobotScanPlan.quick(views=7, object_views=0),
                calibration={"T_hand_camera": _true_hand_camera()},
            )
        )
        st = _status_after_stop(robot)
        assert st["mode"] == "stopped" and not st["estop"]
        assert _still(robot) < 2e-3
    truth = {k: m for k, m in truth_meshes(panda_table_config()).items() if k != "table"}
    assert len(res.objects) == 3, [o.stats for o in res.objects]
    matched = set()
    for o in res.objects:
        m = o.mesh_in_base()
        c = m.bounds.mean(axis=0)
        name = min(truth, key=lambda k: float(np.linalg.norm(truth[k].bounds.mean(axis=0) - c)))
        matched.add(name)
        # bounding-box centre: robust to how the unseen back of an object is closed
        err = np.linalg.norm(truth[name].bounds.mean(axis=0) - c)
        print(f"{name}: centre error {err * 1000:.1f} mm")
        assert err < 0.01, (name, c, truth[name].bounds.mean(axis=0))
    assert matched == set(truth)
    assert res.capture["source"] == "robot" and res.capture["views"] >= 6
    # every frame was paired with the joint state at its own timestamp
    assert all(len(p["joint_pos"]) == 7 for p in res.capture["paired_states"])
    assert rec.is_file() and rec.stat().st_size > 0
    assert res.calibration["hand_camera_source"] == "hand-eye"


def _true_hand_camera() -> np.ndarray:
    from devices.lab.scenes import panda_table_config
    from devices.poses import pose_to_matrix

    (wrist,) = [c for c in panda_table_config().cameras if c.kind == "wrist"]
    return pose_to_matrix(wrist.pose)


def test_hand_eye_over_the_protocol_recovers_the_true_mount() -> None:
    from app.workflows.scan_robot import calibrate_robot

    with (
        start_lab_process("panda_calib", camera_size="424x240", camera_fps=15) as calib_lab,
        RobotClient(calib_lab.host, calib_lab.port, calib_lab.token) as robot,
    ):
        cal = run_to_end(calibrate_robot(robot))
        assert _status_after_stop(robot)["mode"] == "stopped"
    X, Xt = cal["T_hand_camera"], _true_hand_camera()
    d_mm = np.linalg.norm(X[:3, 3] - Xt[:3, 3]) * 1000
    d_deg = np.degrees(np.arccos(np.clip((np.trace(X[:3, :3].T @ Xt[:3, :3]) - 1) / 2, -1, 1)))
    print(f"hand-eye vs truth: {d_mm:.2f} mm, {d_deg:.3f} deg")
    assert d_mm < 3.0 and d_deg < 0.5, (d_mm, d_deg, cal["hand_eye"])


def test_cancel_mid_scan_leaves_robot_stopped(lab: LabProcess) -> None:
    with RobotClient(lab.host, lab.port, lab.token) as robot:
        q_start = robot.latest_state().joint_pos
        job = scan_robot(robot, ScanOptions(), plan=RobotScanPlan.quick(views=6, object_views=0))
        moved = 0.0
        for _ in range(60):  # progress until the arm is on its way (views may be skipped)
            next(job)
            moved = float(np.max(np.abs(robot.latest_state().joint_pos - q_start)))
            if moved > 0.05:
                break
        assert moved > 0.05  # it moved
        job.close()
        st = _status_after_stop(robot)
        assert st["mode"] == "stopped" and st["stop_reason"] == "scan finished"
        assert _still(robot) < 2e-3


def test_robot_without_wrist_camera_is_refused(lab: LabProcess) -> None:
    with RobotClient(lab.host, lab.port, lab.token) as robot:
        with pytest.raises(RobotScanError, match="camera 'fixed' has no mount pose"):
            next(scan_robot(robot, plan=RobotScanPlan(camera="fixed")))
