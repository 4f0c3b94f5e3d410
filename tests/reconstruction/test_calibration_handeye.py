"""Robust hand-eye against analytic truth (distortion, an outlier view, eye-to-hand), the
uncertainty it reports, its pose suggestions, board specs and folder captures."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from devices.frames import Intrinsics, RGBDFrame
from devices.poses import invert, matrix_to_pose, rotation_angle_deg
from reconstruction.calib_capture import (
    calibrate_folder,
    load_capture,
    read_flat_yaml,
    read_pose_file,
)
from reconstruction.calibration import (
    BOARD,
    BoardSpec,
    CalibrationError,
    project_points,
    undistort_pixels,
)
from reconstruction.handeye import hand_eye, solve_hand_eye
from tests.reconstruction.synth import INTR, analytic_board_view, look_at, paint_board

# a wide-angle camera with real barrel distortion (k1 k2 p1 p2 k3)
INTR_DIST = Intrinsics(
    1280, 720, 640.0, 640.0, 650.0, 355.0, (-0.28, 0.09, 0.0008, -0.0006, -0.012)
)


def _T(rv: list[float] | np.ndarray, t: list[float] | np.ndarray) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_rotvec(rv).as_matrix()
    T[:3, 3] = t
    return T


X_TRUE = _T([0.02, -0.01, 1.57], [0.06, 0.0, 0.035])  # T_hand_camera
B_TRUE = _T([np.pi, 0, 0], [0.3, 0.07, 0.0])  # T_base_board, board face up
Y_TRUE = _T([2.0, 0.3, -0.4], [1.2, 0.1, 0.6])  # T_base_camera (eye-to-hand)
Z_TRUE = _T([0.1, np.pi / 2, 0.05], [0.02, -0.08, 0.12])  # T_hand_board (eye-to-hand)


def _eye_in_hand_views(
    n: int, noise_px: float, seed: int
) -> tuple[list[np.ndarray], list, np.ndarray]:
    """Wrist camera views of the fixed board from above, tilted and rolled about all axes."""
    rng = np.random.default_rng(seed)
    centre = B_TRUE[:3, 3] + [0.105, -0.075, 0]
    hands, views = [], []
    for i in range(n):
        az = rng.uniform(-np.pi, np.pi)
        eye = centre + [0.3 * np.cos(az), 0.3 * np.sin(az), rng.uniform(0.3, 0.45)]
        T_base_camera = look_at(eye, centre + rng.normal(0, 0.1, 3))  # board off-centre
        T_base_camera = T_base_camera @ _T([0, 0, rng.uniform(-0.6, 0.6)], [0, 0, 0])
        T_camera_board = invert(T_base_camera) @ B_TRUE
        views.append(analytic_board_view(T_camera_board, INTR_DIST, BOARD, noise_px, rng, i))
        hands.append(T_base_camera @ invert(X_TRUE))
    return hands, views, centre


def _eye_to_hand_views(
    wrist_rotvecs: np.ndarray, noise_px: float, seed: int
) -> tuple[list[np.ndarray], list]:
    """Board on the wrist shown to a fixed camera, the wrist turned by `wrist_rotvecs`."""
    rng = np.random.default_rng(seed)
    # the wrist pose that puts the board ~0.9 m in front of the camera, facing it
    T_camera_board0 = _T([np.pi, 0, 0], [-0.1, -0.08, 0.9])
    T_base_hand0 = Y_TRUE @ T_camera_board0 @ invert(Z_TRUE)
    hands, views = [], []
    for i, rv in enumerate(wrist_rotvecs):
        T_base_hand = T_base_hand0 @ _T(rv, rng.normal(0, 0.05, 3))
        T_camera_board = invert(Y_TRUE) @ T_base_hand @ Z_TRUE
        views.append(analytic_board_view(T_camera_board, INTR_DIST, BOARD, noise_px, rng, i))
        hands.append(T_base_hand)
    return hands, views


def _err(T: np.ndarray, T_true: np.ndarray) -> tuple[float, float]:
    return float(np.linalg.norm(T[:3, 3] - T_true[:3, 3]) * 1000), rotation_angle_deg(T, T_true)


def test_projection_applies_brown_conrady_distortion() -> None:
    pts = np.array([[0.1, -0.05, 0.5], [-0.2, 0.1, 0.6], [0.0, 0.0, 1.0]])
    uv = project_points(pts, np.eye(4), INTR_DIST)
    k1, k2, p1, p2, k3 = INTR_DIST.coeffs
    x, y = pts[:, 0] / pts[:, 2], pts[:, 1] / pts[:, 2]
    r2 = x**2 + y**2
    radial = 1 + k1 * r2 + k2 * r2**2 + k3 * r2**3
    xd = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x**2)
    yd = y * radial + p1 * (r2 + 2 * y**2) + 2 * p2 * x * y
    expected = np.column_stack([INTR_DIST.fx * xd + INTR_DIST.cx, INTR_DIST.fy * yd + INTR_DIST.cy])
    assert np.allclose(uv, expected, atol=1e-6)
    pinhole_u = INTR_DIST.fx * x[1] + INTR_DIST.cx
    assert abs(uv[1, 0] - pinhole_u) > 5  # the distortion moved the point


def test_eye_in_hand_with_distortion_recovers_truth() -> None:
    hands, views, _ = _eye_in_hand_views(12, noise_px=0.3, seed=3)
    res = hand_eye(hands, views, INTR_DIST)
    mm, deg = _err(res.T, X_TRUE)
    assert mm < 1.0 and deg < 0.1
    assert _err(res.T_base_board, B_TRUE)[0] < 1.0
    assert np.median(res.reproj_px) < 0.5 and not res.rejected
    # the same views solved with a pinhole model land ~10 mm off: the distortion is used
    pinhole = Intrinsics(1280, 720, 640.0, 640.0, 650.0, 355.0)
    assert _err(hand_eye(hands, views, pinhole).T, X_TRUE)[0] > 5.0
    # the reported spread is honest: the true error lies within a few spreads
    u = res.uncertainty
    assert 0 < u["spread_mm"] < 2.0 and 0 < u["spread_deg"] < 0.2
    assert mm < 4 * u["spread_mm"] + 0.1 and deg < 4 * u["spread_deg"] + 0.01


def test_outlier_view_is_dropped_with_its_reason() -> None:
    hands, views, _ = _eye_in_hand_views(12, noise_px=0.3, seed=5)
    hands[4] = hands[4] @ _T([0.0, 0.03, 0.0], [0.015, 0.0, -0.01])  # a pose from another time
    res = hand_eye(hands, views, INTR_DIST)
    assert [r.index for r in res.rejected] == [4]
    assert res.rejected[0].reason == "residual"
    assert "robot pose disagrees" in res.rejected[0].detail
    assert 4 not in res.views and len(res.views) == 11
    mm, deg = _err(res.T, X_TRUE)
    assert mm < 1.0 and deg < 0.1


def test_eye_to_hand_recovers_camera_and_board_on_wrist() -> None:
    rng = np.random.default_rng(7)
    hands, views = _eye_to_hand_views(rng.uniform(-0.35, 0.35, (12, 3)), noise_px=0.3, seed=7)
    res = solve_hand_eye(hands, views, INTR_DIST, mode="eye_to_hand")
    assert res.mode == "eye_to_hand" and res.T_hand_board is not None
    mm, deg = _err(res.T, Y_TRUE)
    assert mm < 2.0 and deg < 0.1
    mm_board, deg_board = _err(res.T_hand_board, Z_TRUE)
    assert mm_board < 2.0 and deg_board < 0.15
    assert not np.isfinite(res.T_base_board).any() and "T_base_board" not in res.summary()
    assert np.median(res.reproj_px) < 0.5 and not res.rejected
    json.dumps(res.summary(), allow_nan=False)


def test_suggests_the_wrist_axis_the_views_lack() -> None:
    rng = np.random.default_rng(11)
    turns = rng.uniform(-0.4, 0.4, (10, 3))
    turns[:, 2] = rng.uniform(-0.02, 0.02, 10)  # the wrist never turns about its z axis
    hands, views = _eye_to_hand_views(turns, noise_px=0.3, seed=11)
    res = solve_hand_eye(hands, views, INTR_DIST, mode="eye_to_hand")
    assert (
        res.rotation_spread_deg["about wrist z"]
        < 2.0
        < 10
        < res.rotation_spread_deg["about wrist x"]
    )
    assert any("the wrist z axis" in s for s in res.suggestions)


def test_too_few_views_and_bad_mode_are_clear() -> None:
    hands, views, _ = _eye_in_hand_views(3, 0.0, 1)
    with pytest.raises(CalibrationError, match="3 board views"):
        solve_hand_eye(hands[:2], views[:2], INTR_DIST)
    with pytest.raises(CalibrationError, match="eye_to_hand"):
        solve_hand_eye(hands, views, INTR_DIST, mode="sideways")  # type: ignore[arg-type]


def test_board_spec_strings() -> None:
    spec = BoardSpec.parse("charuco:5x7:0.036195:0.018256:DICT_6X6_250")
    assert spec == BoardSpec((5, 7), 0.036195, 0.018256, "DICT_6X6_250")
    assert BoardSpec.parse(spec.to_spec()) == spec
    assert BoardSpec.parse("charuco:5x7:0.036195:0.018256:10").dictionary == "DICT_6X6_250"
    assert BoardSpec.parse("lab") == BOARD and spec.corner_count == 24
    for bad in (
        "charuco:5x7:0.03",
        "aruco:5x7:0.03:0.02:DICT_4X4_50",
        "charuco:5x7:0.02:0.03:DICT_4X4_50",
        "charuco:5x7:0.03:0.02:DICT_NOPE",
    ):
        with pytest.raises(CalibrationError, match="board spec"):
            BoardSpec.parse(bad)


def test_pose_files_and_their_errors(tmp_path: Path) -> None:
    q = Rotation.from_rotvec([0.1, 0.2, 0.3]).as_quat()
    T = _T([0.1, 0.2, 0.3], [0.5, -0.1, 0.7])
    (tmp_path / "a.yaml").write_text(
        f"x: 0.5  # metres\ny: -0.1\nz: 0.7\nqz: {q[2]}\nqx: {q[0]}\nqw: {q[3]}\nqy: {q[1]}\n"
    )
    (tmp_path / "b.json").write_text(json.dumps({"pose": [0.5, -0.1, 0.7, *q.tolist()]}))
    (tmp_path / "c.txt").write_text(" ".join(str(v) for v in T.ravel()))
    for name in ("a.yaml", "b.json", "c.txt"):
        assert np.allclose(read_pose_file(tmp_path / name), T, atol=1e-9)
    (tmp_path / "bad.yaml").write_text("x: 0.5\ny: [unclosed\n")
    with pytest.raises(CalibrationError, match="bad.yaml"):
        read_pose_file(tmp_path / "bad.yaml")
    (tmp_path / "notunit.yaml").write_text("x: 0\ny: 0\nz: 0\nqx: 1\nqy: 1\nqz: 0\nqw: 0\n")
    with pytest.raises(CalibrationError, match="notunit.yaml.*unit quaternion"):
        read_pose_file(tmp_path / "notunit.yaml")
    (tmp_path / "nested.yaml").write_text("intrinsics:\n  fx: 1.0 # px\n  cx: 2\nname: cam\n")
    assert read_flat_yaml(tmp_path / "nested.yaml") == {
        "intrinsics": {"fx": 1.0, "cx": 2.0},
        "name": "cam",
    }


def test_folder_capture_errors_name_the_file(tmp_path: Path) -> None:
    images, poses = tmp_path / "images", tmp_path / "poses"
    images.mkdir()
    poses.mkdir()
    (tmp_path / "intrinsics.json").write_text(
        json.dumps({"fx": 600, "fy": 600, "cx": 320, "cy": 240})
    )
    (images / "0.png").write_bytes(b"not a png at all")
    with pytest.raises(CalibrationError, match=r"0\.png: no pose file"):
        load_capture(images, poses, BOARD)
    (poses / "0.yaml").write_text("x: 0\ny: 0\nz: 0\nqx: 0\nqy: 0\nqz: 0\nqw: 1\n")
    with pytest.raises(CalibrationError, match=r"0\.png: cannot read the image"):
        load_capture(images, poses, BOARD)
    cv2.imwrite(str(images / "0.png"), np.full((480, 640), 200, np.uint8))
    capture = load_capture(images, poses, BOARD)
    assert capture.intrinsics is not None and capture.intrinsics.width == 640
    assert [r.reason for r in capture.rejected] == ["too few corners"]
    with pytest.raises(CalibrationError, match="no_such_dir.*does not exist"):
        load_capture(tmp_path / "no_such_dir", poses, BOARD)


def test_undistort_inverts_the_projection() -> None:
    rng = np.random.default_rng(2)
    pts = np.column_stack([rng.uniform(-0.4, 0.4, (50, 2)), rng.uniform(0.6, 1.5, 50)])
    uv = project_points(pts, np.eye(4), INTR_DIST)
    assert np.allclose(undistort_pixels(uv, INTR_DIST), pts[:, :2] / pts[:, 2:], atol=1e-6)


def test_eye_in_hand_from_a_folder_of_rendered_images(tmp_path: Path) -> None:
    """Board images rendered at known wrist poses, written as PNG + YAML pose files, read
    back through the folder loader: the whole user path of `calibrate --eye-in-hand`."""
    images, poses = tmp_path / "images", tmp_path / "poses"
    images.mkdir()
    poses.mkdir()
    (tmp_path / "intrinsics.json").write_text(json.dumps(INTR.to_dict()))
    rng = np.random.default_rng(4)
    centre = B_TRUE[:3, 3] + [0.105, -0.075, 0]
    for i in range(9):
        az = 2 * np.pi * i / 9
        eye = centre + [0.3 * np.cos(az), 0.3 * np.sin(az), rng.uniform(0.3, 0.4)]
        T_base_camera = look_at(eye, centre) @ _T([0, 0, rng.uniform(-0.5, 0.5)], [0, 0, 0])
        blank = RGBDFrame(
            np.full((INTR.height, INTR.width, 3), 170, np.uint8),
            np.zeros((INTR.height, INTR.width), np.uint16),
            0.001,
            INTR,
            0.0,
            i,
        )
        frame = paint_board(blank, invert(T_base_camera) @ B_TRUE)
        cv2.imwrite(str(images / f"{i}.png"), cv2.cvtColor(frame.color, cv2.COLOR_RGB2BGR))
        x, y, z, qx, qy, qz, qw = matrix_to_pose(T_base_camera @ invert(X_TRUE))
        (poses / f"{i}.yaml").write_text(
            f"x: {x}\ny: {y}\nz: {z}\nqx: {qx}\nqy: {qy}\nqz: {qz}\nqw: {qw}\n"
        )
    res, capture = calibrate_folder(images, poses, BOARD, "eye_in_hand")
    assert capture.intrinsics == INTR and len(res.views) == 9 and not res.rejected
    mm, deg = _err(res.T, X_TRUE)
    assert mm < 1.0 and deg < 0.2  # rendered 640x480 corners: ~0.1 deg of aliasing bias
    assert _err(res.T_base_board, B_TRUE)[0] < 1.0
