"""Workspace calibration: fixed camera, intrinsics check, table frame, and the pieces the
hand-eye solve (`reconstruction/handeye.py`) builds on.

- `CalibrationResult`, `park_martin` (closed-form AX = XB), `mean_pose`: used by the
  hand-eye solve in `reconstruction/handeye.py`, which is where hand-eye lives (eye-in-hand
  and eye-to-hand; `hand_eye` there is the eye-in-hand shorthand).
- `fixed_camera(views, T_base_board)`: a fixed camera's `T_base_camera` from a board whose
  base pose is known (e.g. from the hand-eye step), with per-view residuals.
- `refine_with_depth(view, frame)`: a far board's tilt and distance from the depth image.
- `intrinsics_check(views, intrinsics)`, `workspace_frame(plane, origin)`.

The board itself (spec, detection, projection) lives in `reconstruction/board.py`; its
names are re-exported here for the callers that import them from this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares
from scipy.spatial.transform import Rotation

from devices.frames import Intrinsics, RGBDFrame
from devices.poses import invert, rotation_angle_deg
from reconstruction.board import (
    BOARD,
    GLARE_SATURATED_FRACTION,
    BoardSpec,
    BoardView,
    CalibrationError,
    RejectedView,
    board_image,
    charuco_board,
    detect_board,
    find_board,
    project_points,
    save_board_png,
    undistort_pixels,
    view_rms_px,
)

__all__ = [
    "BOARD",
    "GLARE_SATURATED_FRACTION",
    "BoardSpec",
    "BoardView",
    "CalibrationError",
    "CalibrationResult",
    "LacksRotationError",
    "RejectedView",
    "board_image",
    "charuco_board",
    "detect_board",
    "find_board",
    "fixed_camera",
    "flag_outliers",
    "intrinsics_check",
    "mean_pose",
    "park_martin",
    "project_points",
    "refine_with_depth",
    "save_board_png",
    "undistort_pixels",
    "view_rms_px",
    "workspace_frame",
]


class LacksRotationError(CalibrationError):
    """Hand-eye: the robot views rotate about one axis only (a guided path can add views
    tilted about another axis itself; a person is asked to)."""


@dataclass
class CalibrationResult:
    """A calibration, its per-view residuals (mm / deg / px) and its own uncertainty.

    `T` is T_hand_camera (eye-in-hand) or T_base_camera (eye-to-hand, fixed camera).
    `T_base_board` is the board in the base frame where the board stays put (NaN for
    eye-to-hand, where `T_hand_board` holds the board on the wrist). `T_linear` is the
    closed-form (Park–Martin) answer the refinement started from. `uncertainty`: the
    leave-one-out spread of `T` (see `reconstruction.handeye`). `suggestions`: which poses
    to add.
    """

    method: str
    T: NDArray[np.float64]
    T_base_board: NDArray[np.float64]
    residual_mm: list[float] = field(default_factory=list)
    residual_deg: list[float] = field(default_factory=list)
    reproj_px: list[float] = field(default_factory=list)
    views: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mode: str = "eye_in_hand"
    T_hand_board: NDArray[np.float64] | None = None
    T_linear: NDArray[np.float64] | None = None
    uncertainty: dict[str, Any] = field(default_factory=dict)
    rejected: list[RejectedView] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    rotation_spread_deg: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "mode": self.mode,
            "views": self.views,
            "residual_mm": [round(v, 3) for v in self.residual_mm],
            "residual_deg": [round(v, 4) for v in self.residual_deg],
            "reproj_px": [round(v, 3) for v in self.reproj_px],
            "mean_residual_mm": float(np.mean(self.residual_mm)) if self.residual_mm else None,
            "max_reproj_px": float(np.max(self.reproj_px)) if self.reproj_px else None,
            "median_reproj_px": float(np.median(self.reproj_px)) if self.reproj_px else None,
            "warnings": self.warnings,
            "rejected": [r.to_dict() for r in self.rejected],
            "uncertainty": self.uncertainty,
            "suggestions": self.suggestions,
            "rotation_spread_deg": self.rotation_spread_deg,
        }
        if np.all(np.isfinite(self.T_base_board)):
            out["T_base_board"] = self.T_base_board.tolist()
        if self.T_hand_board is not None:
            out["T_hand_board"] = self.T_hand_board.tolist()
        if self.T_linear is not None:
            out["T_linear"] = self.T_linear.tolist()
        return out


def _to_vec(T: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.concatenate([Rotation.from_matrix(T[:3, :3]).as_rotvec(), T[:3, 3]])


def _to_mat(v: NDArray[np.float64]) -> NDArray[np.float64]:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_rotvec(v[:3]).as_matrix()
    T[:3, 3] = v[3:]
    return T


def park_martin(
    T_base_hand: Sequence[NDArray[np.float64]], T_camera_board: Sequence[NDArray[np.float64]]
) -> NDArray[np.float64]:
    """Closed-form AX = XB (Park & Martin 1994) over all view pairs -> T_hand_camera.

    Also solves eye-to-hand when given the inverted hand poses (then it returns
    T_base_camera). Raises CalibrationError if the motions rotate about one axis only.
    """
    M = np.zeros((3, 3))
    n = len(T_base_hand)
    motions = []
    for i in range(n):
        for j in range(i + 1, n):
            hand_motion = invert(T_base_hand[j]) @ T_base_hand[i]
            camera_motion = T_camera_board[j] @ invert(T_camera_board[i])
            a = Rotation.from_matrix(hand_motion[:3, :3]).as_rotvec()
            b = Rotation.from_matrix(camera_motion[:3, :3]).as_rotvec()
            M += np.outer(b, a)
            motions.append((hand_motion, camera_motion))
    eigvals, eigvecs = np.linalg.eigh(M.T @ M)
    if eigvals.min() < 1e-10:
        raise LacksRotationError(
            "hand-eye: the robot views rotate about one axis only; add "
            "views tilted about another axis"
        )
    R = eigvecs @ np.diag(eigvals**-0.5) @ eigvecs.T @ M.T
    rows = [hand_motion[:3, :3] - np.eye(3) for hand_motion, _ in motions]
    rhs = [R @ cam[:3, 3] - hand_motion[:3, 3] for hand_motion, cam in motions]
    t = np.linalg.lstsq(np.vstack(rows), np.concatenate(rhs), rcond=None)[0]
    X = np.eye(4)
    X[:3, :3], X[:3, 3] = R, t
    return X


def refine_with_depth(view: BoardView, frame: RGBDFrame, spec: BoardSpec = BOARD) -> BoardView:
    """Correct the board's tilt and distance with the depth image.

    A far, oblique board's PnP pose is weakest in its tilt and distance; thousands of depth
    pixels on the board pin both down. The board normal becomes the fitted depth plane's
    normal and the origin slides along its pixel ray onto that plane; the in-image position
    stays PnP's. Returns the view unchanged if too few depth pixels lie on the board.
    """
    intr, T = frame.intrinsics, view.T_camera_board
    w, h = spec.size_m
    inset = spec.square * 0.5
    outline = np.array(
        [[inset, inset, 0], [w - inset, inset, 0], [w - inset, h - inset, 0], [inset, h - inset, 0]]
    )
    outline_px = project_points(outline, T, intr)
    mask = np.zeros(frame.depth.shape, np.uint8)
    cv2.fillConvexPoly(mask, np.round(outline_px).astype(np.int32), 1)
    v, u = np.nonzero((mask > 0) & (frame.depth > 0))
    if len(u) < 200:
        return view
    z = frame.depth[v, u].astype(np.float64) * frame.depth_scale
    xy = undistort_pixels(np.column_stack([u, v]).astype(np.float64), intr)
    P = np.column_stack([xy * z[:, None], z])
    keep = np.ones(len(P), bool)
    for _ in range(3):
        c = P[keep].mean(axis=0)
        n = np.linalg.svd(P[keep] - c, full_matrices=False)[2][2]
        r = (P - c) @ n
        keep = np.abs(r) < max(3 * r[keep].std(), 1e-4)
    if n @ T[:3, 2] < 0:
        n = -n
    R_fix = Rotation.align_vectors([n], [T[:3, 2]])[0].as_matrix()
    ray = T[:3, 3] / T[2, 3]
    s = (c @ n) / (ray @ n)
    T2 = np.eye(4)
    T2[:3, :3] = R_fix @ T[:3, :3]
    T2[:3, 3] = ray * s
    return BoardView(view.index, T2, view.corners, view.object_points, view_rms_px(view, T2, intr))


def fixed_camera(
    views: Sequence[BoardView],
    T_base_board: NDArray[np.float64],
    intrinsics: Intrinsics,
    depth_refined: bool = False,
) -> CalibrationResult:
    """A fixed camera's T_base_camera from views of a board at a known base pose.

    Without depth the pose is refined on the reprojection error; with `depth_refined` views
    (see `refine_with_depth`) their mean pose is kept, reprojection only reported.
    """
    if not views:
        raise CalibrationError("fixed camera: the board was not found in any frame")

    def residuals(params: NDArray[np.float64]) -> NDArray[np.float64]:
        T_camera_board = invert(_to_mat(params)) @ T_base_board
        return np.concatenate(
            [
                (project_points(v.object_points, T_camera_board, intrinsics) - v.corners).ravel()
                for v in views
            ]
        )

    T0 = mean_pose([T_base_board @ invert(v.T_camera_board) for v in views])
    T = T0 if depth_refined else _to_mat(least_squares(residuals, _to_vec(T0), method="lm").x)
    method = "fixed_board_depth_plane" if depth_refined else "fixed_board_reprojection"
    res = CalibrationResult(method, T, T_base_board, views=[v.index for v in views])
    for v in views:
        T_base_camera_i = T_base_board @ invert(v.T_camera_board)
        res.residual_mm.append(float(np.linalg.norm(T_base_camera_i[:3, 3] - T[:3, 3]) * 1000))
        res.residual_deg.append(rotation_angle_deg(T_base_camera_i, T))
        res.reproj_px.append(view_rms_px(v, invert(T) @ T_base_board, intrinsics))
    flag_outliers(res)
    return res


def intrinsics_check(views: Sequence[BoardView], intrinsics: Intrinsics) -> dict[str, Any]:
    """Re-estimate fx, fy (principal point and the stated distortion fixed) from the board
    views and compare with the camera's stated intrinsics. A few percent off means a wrong
    resolution or a camera that needs its own intrinsic calibration."""
    if len(views) < 3:
        return {"checked": False, "why": f"needs >= 3 board views, got {len(views)}"}
    K0 = intrinsics.K.copy()
    coeffs = np.zeros(max(5, len(intrinsics.coeffs)))
    coeffs[: len(intrinsics.coeffs)] = intrinsics.coeffs
    flags = (
        cv2.CALIB_USE_INTRINSIC_GUESS
        | cv2.CALIB_FIX_PRINCIPAL_POINT
        | cv2.CALIB_FIX_K1
        | cv2.CALIB_FIX_K2
        | cv2.CALIB_FIX_K3
        | cv2.CALIB_FIX_TANGENT_DIST
    )
    if len(coeffs) > 5:
        flags |= cv2.CALIB_RATIONAL_MODEL | cv2.CALIB_FIX_K4 | cv2.CALIB_FIX_K5 | cv2.CALIB_FIX_K6
    obj = [v.object_points.astype(np.float32) for v in views]
    img = [v.corners.astype(np.float32) for v in views]
    rms, K, *_ = cv2.calibrateCamera(
        obj, img, (intrinsics.width, intrinsics.height), K0, coeffs, flags=flags
    )
    rel = max(abs(K[0, 0] / intrinsics.fx - 1), abs(K[1, 1] / intrinsics.fy - 1))
    return {
        "checked": True,
        "fx": float(K[0, 0]),
        "fy": float(K[1, 1]),
        "stated_fx": intrinsics.fx,
        "stated_fy": intrinsics.fy,
        "relative_error": float(rel),
        "rms_px": float(rms),
        "ok": bool(rel < 0.02),
    }


def flag_outliers(res: CalibrationResult) -> None:
    """Warn (in `res.warnings`) about views over 2 px reprojection or 10 mm from the
    consensus."""
    for i, (px, idx) in enumerate(zip(res.reproj_px, res.views, strict=True)):
        if px > 2.0:
            res.warnings.append(
                f"view {idx}: reprojection {px:.2f} px (> 2 px); check the "
                "intrinsics or drop this view"
            )
        if res.residual_mm and res.residual_mm[i] > 10.0:
            res.warnings.append(f"view {idx}: {res.residual_mm[i]:.1f} mm from the consensus")


def mean_pose(poses: Sequence[NDArray[np.float64]]) -> NDArray[np.float64]:
    """Chordal mean rotation and mean translation of 4x4 poses."""
    T = np.eye(4)
    T[:3, :3] = Rotation.from_matrix([P[:3, :3] for P in poses]).mean().as_matrix()
    T[:3, 3] = np.mean([P[:3, 3] for P in poses], axis=0)
    return T


def workspace_frame(
    plane: NDArray[np.float64], origin_near: NDArray[np.float64]
) -> NDArray[np.float64]:
    """T_base_workspace: z = table normal, origin = `origin_near` projected onto the table,
    x = base x projected onto the table."""
    n = np.asarray(plane[:3], float)
    n = n / np.linalg.norm(n)
    d = float(plane[3]) / np.linalg.norm(plane[:3])
    o = np.asarray(origin_near, float)
    o = o - (o @ n + d) * n
    x = np.array([1.0, 0, 0]) - n * n[0]
    if np.linalg.norm(x) < 1e-6:
        x = np.array([0, 1.0, 0]) - n * n[1]
    x /= np.linalg.norm(x)
    T = np.eye(4)
    T[:3, 0], T[:3, 1], T[:3, 2], T[:3, 3] = x, np.cross(n, x), n, o
    return T
