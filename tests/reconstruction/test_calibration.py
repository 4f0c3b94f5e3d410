"""Calibration maths on exact synthetic poses, and clear failures."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from devices.frames import RGBDFrame
from devices.poses import invert, pose_to_matrix, rotation_angle_deg
from reconstruction.calib_capture import calibrate_folder
from reconstruction.calibration import (
    BOARD,
    BoardSpec,
    CalibrationError,
    detect_board,
    park_martin,
    save_board_png,
    workspace_frame,
)
from reconstruction.handeye import hand_eye
from tests.reconstruction.synth import INTR, look_at, paint_board
from tests.shared import real_data


def _T(rv: list[float] | np.ndarray, t: list[float] | np.ndarray) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_rotvec(rv).as_matrix()
    T[:3, 3] = t
    return T


X_TRUE = _T([0.02, -0.01, 1.57], [0.06, 0.0, 0.035])
B_TRUE = _T([np.pi, 0, 0], [0.3, 0.07, 0.0])


def _blank(index: int = 0) -> RGBDFrame:
    color = np.full((INTR.height, INTR.width, 3), 170, np.uint8)
    depth = np.zeros((INTR.height, INTR.width), np.uint16)  # no occluders
    return RGBDFrame(color, depth, 0.001, INTR, 0.0, index)


def test_park_martin_exact() -> None:
    rng = np.random.default_rng(1)
    hands = [_T(rng.normal(0, 0.4, 3), rng.normal(0, 0.2, 3) + [0.4, 0, 0.5]) for _ in range(6)]
    cams = [invert(Th @ X_TRUE) @ B_TRUE for Th in hands]
    X = park_martin(hands, cams)
    assert np.allclose(X, X_TRUE, atol=1e-8)


def test_detect_and_hand_eye_on_painted_board() -> None:
    centre = B_TRUE[:3, 3] + [0.105, -0.075, 0]
    hands, views = [], []
    for i, az in enumerate(np.linspace(-1.0, 1.0, 6)):
        eye = centre + [0.35 * np.cos(np.pi + az), 0.35 * np.sin(np.pi + az), 0.3 + 0.05 * i]
        Tc = look_at(eye, centre)
        v = detect_board(paint_board(_blank(i), invert(Tc) @ B_TRUE))
        assert v is not None and v.rms_px < 0.5
        hands.append(Tc @ invert(X_TRUE))
        views.append(v)
    res = hand_eye(hands, views, INTR)
    assert np.linalg.norm(res.T[:3, 3] - X_TRUE[:3, 3]) < 0.001
    assert rotation_angle_deg(res.T, X_TRUE) < 0.1
    assert max(res.residual_mm) < 2.0 and not res.rejected
    # six views on one orbit barely turn about one axis: the closed form is ~14 mm off here,
    # and the only warning allowed says so and that the images favour the refined answer
    assert all("the closed form is the weak one" in w for w in res.warnings)
    assert res.uncertainty["spread_mm"] < 2.0 and res.uncertainty["spread_deg"] < 0.2


def test_board_not_found_is_clear() -> None:
    assert detect_board(_blank()) is None
    with pytest.raises(CalibrationError, match="3 board views"):
        hand_eye([np.eye(4)], [], INTR)


def test_board_png_and_workspace_frame(tmp_path: Path) -> None:
    p = save_board_png(tmp_path / "board.png")
    img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
    assert img is not None
    assert img.shape == (600, 840)  # 0.15 x 0.21 m at 4000 px/m
    assert BOARD.size_m == pytest.approx((0.21, 0.15))
    T = workspace_frame(np.array([0, 0, 2.0, -0.2]), np.array([0.5, 0.1, 0.7]))
    assert np.allclose(T[:3, 2], [0, 0, 1]) and np.allclose(T[:3, 3], [0.5, 0.1, 0.1])


def _shared_capture() -> Path:
    return real_data("handeye_abb_charuco", "images")


def test_real_eye_to_hand_capture() -> None:
    """16 real views of a ChArUco board on an ABB wrist seen by a fixed camera: image 2 is
    washed out by glare. Targets of `bench calib-real`; the authors' own base -> camera
    guess is "close to a calibrated result" (independent solves land 10-15 mm / 0.2-0.9 deg
    from it)."""
    folder = _shared_capture()
    board = BoardSpec.parse("charuco:5x7:0.036195:0.018256:DICT_6X6_250")
    res, capture = calibrate_folder(folder / "images", folder / "poses", board, "eye_to_hand")
    assert capture.intrinsics is not None and capture.intrinsics.fx == pytest.approx(1352.02747)
    reasons = {r.index: r.reason for r in res.rejected}
    assert reasons.get(2) == "glare" and len(res.views) >= 13
    assert float(np.median(res.reproj_px)) <= 2.0
    assert res.uncertainty["spread_mm"] <= 3.0 and res.uncertainty["spread_deg"] <= 0.3
    guess = pose_to_matrix(
        [-0.0196464, 1.27843, 0.283965, -0.0480798, -0.558686, 0.827604, -0.0251035]
    )
    assert np.linalg.norm(res.T[:3, 3] - guess[:3, 3]) < 0.020
    assert rotation_angle_deg(res.T, guess) < 1.0
    assert res.suggestions and res.T_hand_board is not None
