"""The lab's ChArUco board is detectable, and OpenCV's pose of it matches the lab truth:
this checks intrinsics, texture mapping and the camera pose convention end to end."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from devices.lab.board import charuco_board
from devices.lab.camera import LabCamera
from devices.lab.sim import LabSim
from devices.lab.truth import truth_camera_pose
from devices.poses import invert, pose_to_matrix, rotation_angle_deg


def _board_pose(cam: LabCamera, sim: LabSim) -> np.ndarray | None:
    board = charuco_board(sim.config.board)
    gray = cv2.cvtColor(cam.grab().color, cv2.COLOR_RGB2GRAY)
    cc, ci, _, _ = cv2.aruco.CharucoDetector(board).detectBoard(gray)
    if ci is None or len(ci) < 6:
        return None
    obj, img = board.matchImagePoints(cc, ci)
    ok, rvec, tvec = cv2.solvePnP(obj, img, cam.intrinsics.K, None)
    T = np.eye(4)
    T[:3, :3] = cv2.Rodrigues(rvec)[0]
    T[:3, 3] = tvec.ravel()
    return T


# The fixed camera sees the 30 mm-square board from ~0.7 m (~26 px squares): PnP depth
# error of a few mm is what a real D435 gets there too. The wrist camera is ~0.3 m away.
@pytest.mark.parametrize(
    ("camera", "tol_m", "tol_deg"), [("fixed", 5e-3, 0.5), ("wrist", 1e-3, 0.3)]
)
def test_board_pose_from_lab_images_matches_truth(
    camera: str, tol_m: float, tol_deg: float
) -> None:
    sim = LabSim("panda_calib")
    if camera == "wrist":
        q = np.array(sim.config.initial_joint_pos)
        q[[1, 3, 5]] = (0.0, -2.5, 2.5)  # hand above the board
        sim.write_command("position", q)
        sim.run_for(2.0)
    with LabCamera(sim, camera, 640, 480) as cam:
        T_cam_board = _board_pose(cam, sim)
        T_world_cam = cam.truth_pose()
    assert T_cam_board is not None, "board not detected"
    np.testing.assert_allclose(
        T_world_cam, truth_camera_pose(sim.config, camera, sim.truth_joint_pos()), atol=1e-9
    )
    T_true = invert(T_world_cam) @ pose_to_matrix(sim.config.board.pose)
    assert np.linalg.norm(T_cam_board[:3, 3] - T_true[:3, 3]) < tol_m
    assert rotation_angle_deg(T_cam_board, T_true) < tol_deg
