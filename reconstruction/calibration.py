"""Workspace calibration: ChArUco board views, hand-eye, fixed camera, table frame.

- `detect_board(frame)`: ChArUco corners (OpenCV aruco) and the board pose `T_camera_board`
  with its reprojection RMS (an intrinsics check: > ~1 px means the intrinsics are off).
- `hand_eye(T_base_hand, views)`: eye-in-hand calibration (`cv2.calibrateHandEye`, then a
  joint reprojection refinement) -> `T_hand_camera`, the board pose in the base frame and
  per-view residuals.
- `fixed_camera(views, T_base_board)`: a fixed camera's `T_base_camera` from a board whose
  base pose is known (e.g. from the hand-eye step), with per-view residuals.
- `save_board_png(path)`: the printable board (also what the virtual lab textures).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares
from scipy.spatial.transform import Rotation

from devices.frames import Intrinsics, RGBDFrame
from devices.poses import invert, rotation_angle_deg
from reconstruction.errors import ReconstructionError


class CalibrationError(ReconstructionError):
    """Calibration failed: board not found, too few views, degenerate motion."""


@dataclass(frozen=True)
class BoardSpec:
    """A ChArUco board: squares (columns, rows), square and marker side in metres."""

    squares: tuple[int, int] = (7, 5)
    square: float = 0.03
    marker: float = 0.022
    dictionary: str = "DICT_5X5_100"

    @property
    def size_m(self) -> tuple[float, float]:
        return self.squares[0] * self.square, self.squares[1] * self.square

    def to_dict(self) -> dict[str, Any]:
        return {
            "squares": list(self.squares),
            "square": self.square,
            "marker": self.marker,
            "dictionary": self.dictionary,
        }


BOARD = BoardSpec()


def charuco_board(spec: BoardSpec = BOARD) -> Any:
    d = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, spec.dictionary))
    return cv2.aruco.CharucoBoard(spec.squares, spec.square, spec.marker, d)


def board_image(spec: BoardSpec = BOARD, px_per_m: float = 4000.0) -> NDArray[np.uint8]:
    """Grey image of the board, no margin: pixel (u, v) is board point (u, v) / px_per_m."""
    w, h = (int(round(s * px_per_m)) for s in spec.size_m)
    return charuco_board(spec).generateImage((w, h), marginSize=0, borderBits=1)


def save_board_png(path: Path, spec: BoardSpec = BOARD, px_per_m: float = 4000.0) -> Path:
    """Write the board as a PNG (for printing, or as a texture in the virtual lab).

    Board frame: origin at the image's top-left corner, x along image columns, y along
    rows, z into the board (OpenCV's object-point convention).
    """
    from resources import atomic

    img = board_image(spec, px_per_m)
    ok, buf = cv2.imencode(".png", img)
    if not ok:
        raise CalibrationError(f"{path}: cannot encode the board image")
    atomic.write_bytes(Path(path), buf.tobytes())
    return Path(path)


@dataclass(frozen=True)
class BoardView:
    index: int  # frame index
    T_camera_board: NDArray[np.float64]
    corners: NDArray[np.float64]  # (N, 2) pixels
    object_points: NDArray[np.float64]  # (N, 3) board frame
    rms_px: float


def detect_board(
    frame: RGBDFrame, spec: BoardSpec = BOARD, min_corners: int = 8
) -> BoardView | None:
    """Find the board in a frame; None if it is not (fully enough) visible."""
    gray = cv2.cvtColor(frame.color, cv2.COLOR_RGB2GRAY)
    board = charuco_board(spec)
    det = cv2.aruco.CharucoDetector(board)
    cc, ci, _mc, _mi = det.detectBoard(gray)
    if ci is None or len(ci) < min_corners:
        return None
    obj, img = board.matchImagePoints(cc, ci)
    obj = obj.reshape(-1, 3).astype(np.float64)
    img = img.reshape(-1, 2).astype(np.float64)
    if board.checkCharucoCornersCollinear(ci):
        return None
    K, dist = frame.intrinsics.K, np.asarray(frame.intrinsics.coeffs, float)
    ok, rvec, tvec = cv2.solvePnP(obj, img, K, dist, flags=cv2.SOLVEPNP_IPPE)
    if not ok:
        return None
    rvec, tvec = cv2.solvePnPRefineLM(obj, img, K, dist, rvec, tvec)
    proj, _ = cv2.projectPoints(obj, rvec, tvec, K, dist)
    rms = float(np.sqrt(np.mean(np.sum((proj.reshape(-1, 2) - img) ** 2, axis=1))))
    T = np.eye(4)
    T[:3, :3] = cv2.Rodrigues(rvec)[0]
    T[:3, 3] = tvec.ravel()
    return BoardView(frame.index, T, img, obj, rms)


@dataclass
class CalibrationResult:
    """A calibration and its per-view residuals (mm / deg / px)."""

    method: str
    T: NDArray[np.float64]  # T_hand_camera or T_base_camera
    T_base_board: NDArray[np.float64]
    residual_mm: list[float] = field(default_factory=list)
    residual_deg: list[float] = field(default_factory=list)
    reproj_px: list[float] = field(default_factory=list)
    views: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "views": self.views,
            "residual_mm": [round(v, 3) for v in self.residual_mm],
            "residual_deg": [round(v, 4) for v in self.residual_deg],
            "reproj_px": [round(v, 3) for v in self.reproj_px],
            "mean_residual_mm": float(np.mean(self.residual_mm)) if self.residual_mm else None,
            "max_reproj_px": float(np.max(self.reproj_px)) if self.reproj_px else None,
            "T_base_board": self.T_base_board.tolist(),
            "warnings": self.warnings,
        }


def _to_vec(T: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.concatenate([Rotation.from_matrix(T[:3, :3]).as_rotvec(), T[:3, 3]])


def _to_mat(v: NDArray[np.float64]) -> NDArray[np.float64]:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_rotvec(v[:3]).as_matrix()
    T[:3, 3] = v[3:]
    return T


def _reproject(
    T_cam_board: NDArray[np.float64], view: BoardView, intr: Intrinsics
) -> NDArray[np.float64]:
    p = view.object_points @ T_cam_board[:3, :3].T + T_cam_board[:3, 3]
    uv = p[:, :2] / p[:, 2:3]
    return np.column_stack([uv[:, 0] * intr.fx + intr.cx, uv[:, 1] * intr.fy + intr.cy])


def hand_eye(
    T_base_hand: Sequence[NDArray[np.float64]], views: Sequence[BoardView], intrinsics: Intrinsics
) -> CalibrationResult:
    """Eye-in-hand calibration from robot hand poses and board views of a fixed board.

    Needs >= 3 views with rotation between them. Residuals per view: how far that view's
    board pose in the base frame lies from the consensus (mm, deg) and its reprojection RMS.
    """
    if len(views) < 3 or len(views) != len(T_base_hand):
        raise CalibrationError(
            f"hand-eye needs >= 3 board views with robot poses, got "
            f"{len(views)} views and {len(T_base_hand)} poses"
        )
    if hasattr(cv2, "calibrateHandEye"):
        R, t = cv2.calibrateHandEye(
            [T[:3, :3] for T in T_base_hand],
            [T[:3, 3] for T in T_base_hand],
            [v.T_camera_board[:3, :3] for v in views],
            [v.T_camera_board[:3, 3] for v in views],
            method=cv2.CALIB_HAND_EYE_PARK,
        )
        X = np.eye(4)
        X[:3, :3], X[:3, 3] = R, np.ravel(t)
    else:  # OpenCV 5.0's Python bindings dropped calibrateHandEye
        X = park_martin(T_base_hand, [v.T_camera_board for v in views])
    boards = [Tb @ X @ v.T_camera_board for Tb, v in zip(T_base_hand, views, strict=True)]
    B = _mean_pose(boards)

    def resid(p: NDArray[np.float64]) -> NDArray[np.float64]:
        Xp, Bp = _to_mat(p[:6]), _to_mat(p[6:])
        out = []
        for Tb, v in zip(T_base_hand, views, strict=True):
            T_cb = invert(Tb @ Xp) @ Bp
            out.append((_reproject(T_cb, v, intrinsics) - v.corners).ravel())
        return np.concatenate(out)

    sol = least_squares(resid, np.concatenate([_to_vec(X), _to_vec(B)]), method="lm")
    X, B = _to_mat(sol.x[:6]), _to_mat(sol.x[6:])
    res = CalibrationResult(
        "hand_eye_park_martin+reprojection", X, B, views=[v.index for v in views]
    )
    for Tb, v in zip(T_base_hand, views, strict=True):
        Bi = Tb @ X @ v.T_camera_board
        res.residual_mm.append(float(np.linalg.norm(Bi[:3, 3] - B[:3, 3]) * 1000))
        res.residual_deg.append(rotation_angle_deg(Bi, B))
        e = _reproject(invert(Tb @ X) @ B, v, intrinsics) - v.corners
        res.reproj_px.append(float(np.sqrt(np.mean(np.sum(e**2, axis=1)))))
    _flag_outliers(res)
    return res


def park_martin(
    T_base_hand: Sequence[NDArray[np.float64]], T_camera_board: Sequence[NDArray[np.float64]]
) -> NDArray[np.float64]:
    """Closed-form AX = XB (Park & Martin 1994) over all view pairs -> T_hand_camera."""
    M = np.zeros((3, 3))
    rows, rhs = [], []
    n = len(T_base_hand)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    motions = []
    for i, j in pairs:
        A = invert(T_base_hand[j]) @ T_base_hand[i]
        B = T_camera_board[j] @ invert(T_camera_board[i])
        a = Rotation.from_matrix(A[:3, :3]).as_rotvec()
        b = Rotation.from_matrix(B[:3, :3]).as_rotvec()
        M += np.outer(b, a)
        motions.append((A, B))
    w, V = np.linalg.eigh(M.T @ M)
    if w.min() < 1e-10:
        raise CalibrationError(
            "hand-eye: the robot views rotate about one axis only; add "
            "views tilted about another axis"
        )
    R = V @ np.diag(w**-0.5) @ V.T @ M.T
    for A, B in motions:
        rows.append(A[:3, :3] - np.eye(3))
        rhs.append(R @ B[:3, 3] - A[:3, 3])
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
    pix = _reproject(T, BoardView(0, T, np.zeros((4, 2)), outline, 0.0), intr)
    mask = np.zeros(frame.depth.shape, np.uint8)
    cv2.fillConvexPoly(mask, np.round(pix).astype(np.int32), 1)
    v, u = np.nonzero((mask > 0) & (frame.depth > 0))
    if len(u) < 200:
        return view
    z = frame.depth[v, u].astype(np.float64) * frame.depth_scale
    P = np.column_stack([(u - intr.cx) / intr.fx * z, (v - intr.cy) / intr.fy * z, z])
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
    e = _reproject(T2, view, intr) - view.corners
    rms = float(np.sqrt(np.mean(np.sum(e**2, axis=1))))
    return BoardView(view.index, T2, view.corners, view.object_points, rms)


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

    def resid(p: NDArray[np.float64]) -> NDArray[np.float64]:
        T_cb = invert(_to_mat(p)) @ T_base_board
        return np.concatenate(
            [(_reproject(T_cb, v, intrinsics) - v.corners).ravel() for v in views]
        )

    T0 = _mean_pose([T_base_board @ invert(v.T_camera_board) for v in views])
    T = T0 if depth_refined else _to_mat(least_squares(resid, _to_vec(T0), method="lm").x)
    method = "fixed_board_depth_plane" if depth_refined else "fixed_board_reprojection"
    res = CalibrationResult(method, T, T_base_board, views=[v.index for v in views])
    for v in views:
        Ti = T_base_board @ invert(v.T_camera_board)
        res.residual_mm.append(float(np.linalg.norm(Ti[:3, 3] - T[:3, 3]) * 1000))
        res.residual_deg.append(rotation_angle_deg(Ti, T))
        e = _reproject(invert(T) @ T_base_board, v, intrinsics) - v.corners
        res.reproj_px.append(float(np.sqrt(np.mean(np.sum(e**2, axis=1)))))
    _flag_outliers(res)
    return res


def intrinsics_check(views: Sequence[BoardView], intrinsics: Intrinsics) -> dict[str, Any]:
    """Re-estimate fx, fy (principal point and distortion fixed) from the board views and
    compare with the camera's stated intrinsics. A few percent off means a wrong resolution
    or a camera that needs its own intrinsic calibration."""
    if len(views) < 3:
        return {"checked": False, "why": f"needs >= 3 board views, got {len(views)}"}
    K0 = intrinsics.K.copy()
    flags = (
        cv2.CALIB_USE_INTRINSIC_GUESS
        | cv2.CALIB_FIX_PRINCIPAL_POINT
        | cv2.CALIB_FIX_K1
        | cv2.CALIB_FIX_K2
        | cv2.CALIB_FIX_K3
        | cv2.CALIB_ZERO_TANGENT_DIST
    )
    obj = [v.object_points.astype(np.float32) for v in views]
    img = [v.corners.astype(np.float32) for v in views]
    rms, K, *_ = cv2.calibrateCamera(
        obj, img, (intrinsics.width, intrinsics.height), K0, np.zeros(5), flags=flags
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


def _flag_outliers(res: CalibrationResult) -> None:
    for i, (px, idx) in enumerate(zip(res.reproj_px, res.views, strict=True)):
        if px > 2.0:
            res.warnings.append(
                f"view {idx}: reprojection {px:.2f} px (> 2 px); check the "
                "intrinsics or drop this view"
            )
        if res.residual_mm and res.residual_mm[i] > 10.0:
            res.warnings.append(f"view {idx}: {res.residual_mm[i]:.1f} mm from the consensus")


def _mean_pose(Ts: Sequence[NDArray[np.float64]]) -> NDArray[np.float64]:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_matrix([t[:3, :3] for t in Ts]).mean().as_matrix()
    T[:3, 3] = np.mean([t[:3, 3] for t in Ts], axis=0)
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


def paint_board(
    frame: RGBDFrame,
    T_camera_board: NDArray[np.float64],
    spec: BoardSpec = BOARD,
    occlusion_tol: float = 0.02,
) -> RGBDFrame:
    """A copy of `frame` with a flat board drawn at `T_camera_board` (a sticker: depth
    unchanged). Pixels whose measured depth is nearer than the board by more than
    `occlusion_tol` are occluders and keep their colour. For simulated calibration data."""
    intr = frame.intrinsics
    ppm = 4000.0
    img = board_image(spec, ppm)
    S = np.diag([1 / ppm, 1 / ppm, 1.0])  # board px -> board metres
    M = T_camera_board[:3, [0, 1, 3]]
    H = intr.K @ M @ S
    if T_camera_board[2, 3] <= 0:
        return frame
    w, h = intr.width, intr.height
    warped = cv2.warpPerspective(
        img, H, (w, h), flags=cv2.INTER_AREA, borderMode=cv2.BORDER_CONSTANT, borderValue=0
    )
    mask = (
        cv2.warpPerspective(
            np.full(img.shape, 255, np.uint8), H, (w, h), flags=cv2.INTER_NEAREST, borderValue=0
        )
        > 0
    )
    # depth of the board plane along each pixel ray
    n = T_camera_board[:3, 2]
    p0 = T_camera_board[:3, 3]
    u, v = np.meshgrid(np.arange(w), np.arange(h))
    rays = np.stack([(u - intr.cx) / intr.fx, (v - intr.cy) / intr.fy, np.ones_like(u, float)], -1)
    z_board = (p0 @ n) / (rays @ n)
    z_meas = frame.depth_m
    visible = mask & ((z_meas == 0) | (z_meas > z_board - occlusion_tol))
    color = frame.color.copy()
    shade = frame.color.mean(axis=2, keepdims=True) / 255.0 * 0.4 + 0.6  # keep scene light
    painted = (warped[..., None].astype(np.float32) * shade).clip(0, 255).astype(np.uint8)
    color[visible] = (
        painted[visible].repeat(1, axis=-1)
        if painted.shape[-1] == 3
        else np.repeat(painted[visible], 3, axis=-1)
    )
    return RGBDFrame(
        color,
        frame.depth,
        frame.depth_scale,
        frame.intrinsics,
        frame.timestamp,
        frame.index,
        frame.T_world_camera,
        dict(frame.meta),
    )
