"""Workspace calibration: ChArUco board views, hand-eye, fixed camera, table frame.

- `BoardSpec.parse("charuco:5x7:0.036195:0.018256:DICT_6X6_250")`: a board from one string.
- `detect_board(frame)` / `find_board(gray, intrinsics)`: ChArUco corners (OpenCV aruco) and
  the board pose `T_camera_board` with its reprojection RMS (an intrinsics check: > ~1 px
  means the intrinsics are off); `find_board` says why a view was rejected (glare, too few
  corners, collinear corners).
- `hand_eye(T_base_hand, views)`: eye-in-hand calibration (Park–Martin, then a robust
  reprojection refinement with outlier views dropped and a leave-one-out uncertainty, see
  `reconstruction/handeye.py`) -> `T_hand_camera`, the board pose in the base frame and
  per-view residuals. `reconstruction.handeye.solve_hand_eye` also does eye-to-hand.
- `fixed_camera(views, T_base_board)`: a fixed camera's `T_base_camera` from a board whose
  base pose is known (e.g. from the hand-eye step), with per-view residuals.
- `project_points(points, T_camera_points, intrinsics)`: the one projection, with the
  camera's distortion coefficients, used by every residual here.
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
    """Calibration failed: board not found, too few views, degenerate motion, bad input."""


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

    @property
    def corner_count(self) -> int:
        """Inner chessboard corners, i.e. the most ChArUco corners one view can show."""
        return (self.squares[0] - 1) * (self.squares[1] - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "squares": list(self.squares),
            "square": self.square,
            "marker": self.marker,
            "dictionary": self.dictionary,
        }

    def to_spec(self) -> str:
        """The string `parse` reads back."""
        cols, rows = self.squares
        return f"charuco:{cols}x{rows}:{self.square:g}:{self.marker:g}:{self.dictionary}"

    @classmethod
    def parse(cls, text: str) -> BoardSpec:
        """`charuco:COLSxROWS:SQUARE_M:MARKER_M:DICT`, e.g.
        `charuco:5x7:0.036195:0.018256:DICT_6X6_250` (OpenCV's `CharucoBoard((5, 7), …)`:
        5 squares across, 7 down), or `lab` for the virtual lab's board. The dictionary is
        an OpenCV name (`DICT_6X6_250`) or its number (10). Raises CalibrationError."""
        text = text.strip()
        if text.lower() == "lab":
            return BOARD
        usage = (
            f"board spec {text!r}: expected charuco:COLSxROWS:SQUARE_M:MARKER_M:DICT, "
            "e.g. charuco:5x7:0.036195:0.018256:DICT_6X6_250, or 'lab'"
        )
        parts = text.split(":")
        if len(parts) != 5 or parts[0].lower() != "charuco":
            raise CalibrationError(usage)
        try:
            cols, rows = (int(n) for n in parts[1].lower().split("x"))
            square, marker = float(parts[2]), float(parts[3])
        except ValueError:
            raise CalibrationError(usage) from None
        dictionary = parts[4].strip().upper()
        if dictionary.isdigit():
            names = [n for n in dir(cv2.aruco) if n.startswith("DICT_")]
            by_number = {int(getattr(cv2.aruco, n)): n for n in names}
            if int(dictionary) not in by_number:
                raise CalibrationError(f"{usage}; no ArUco dictionary number {dictionary}")
            dictionary = by_number[int(dictionary)]
        if not dictionary.startswith("DICT_"):
            dictionary = "DICT_" + dictionary
        if not hasattr(cv2.aruco, dictionary):
            raise CalibrationError(f"{usage}; OpenCV has no ArUco dictionary {dictionary}")
        if cols < 2 or rows < 2 or not 0 < marker < square:
            raise CalibrationError(
                f"{usage}; needs >= 2x2 squares and 0 < marker ({marker} m) < square ({square} m)"
            )
        return cls((cols, rows), square, marker, dictionary)


BOARD = BoardSpec()


def charuco_board(spec: BoardSpec = BOARD) -> Any:
    dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, spec.dictionary))
    return cv2.aruco.CharucoBoard(spec.squares, spec.square, spec.marker, dictionary)


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


@dataclass(frozen=True)
class RejectedView:
    """A view left out of a calibration, and why. `reason` is a short tag ("glare",
    "too few corners", "collinear corners", "board pose", "residual", "no pose");
    `detail` is the sentence a person reads."""

    index: int
    reason: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "reason": self.reason, "detail": self.detail}


# A board area with more saturated pixels than this, and too few corners, is glare.
GLARE_SATURATED_FRACTION = 0.25


def find_board(
    gray: NDArray[np.uint8],
    intrinsics: Intrinsics,
    spec: BoardSpec = BOARD,
    index: int = 0,
    min_corners: int = 8,
) -> BoardView | RejectedView:
    """The board in a grey image (pose with the camera's distortion), or why not."""
    board = charuco_board(spec)
    detector = cv2.aruco.CharucoDetector(board)
    charuco_corners, charuco_ids, marker_corners, _marker_ids = detector.detectBoard(gray)
    found = 0 if charuco_ids is None else len(charuco_ids)
    if found < min_corners:
        detail = f"{found} of {spec.corner_count} board corners found (needs {min_corners})"
        saturated = _saturated_fraction(gray, marker_corners)
        if saturated > GLARE_SATURATED_FRACTION:
            return RejectedView(
                index, "glare", f"{detail}; {saturated:.0%} of the board area is saturated"
            )
        return RejectedView(index, "too few corners", detail)
    if board.checkCharucoCornersCollinear(charuco_ids):
        return RejectedView(
            index, "collinear corners", f"the {found} corners found lie on one line"
        )
    obj, img = board.matchImagePoints(charuco_corners, charuco_ids)
    object_points = obj.reshape(-1, 3).astype(np.float64)
    corners = img.reshape(-1, 2).astype(np.float64)
    K, dist = intrinsics.K, np.asarray(intrinsics.coeffs, float)
    ok, rvec, tvec = cv2.solvePnP(object_points, corners, K, dist, flags=cv2.SOLVEPNP_IPPE)
    if not ok:
        return RejectedView(index, "board pose", "PnP found no board pose")
    rvec, tvec = cv2.solvePnPRefineLM(object_points, corners, K, dist, rvec, tvec)
    T = np.eye(4)
    T[:3, :3] = cv2.Rodrigues(rvec)[0]
    T[:3, 3] = tvec.ravel()
    if T[2, 3] <= 0:
        return RejectedView(index, "board pose", "PnP put the board behind the camera")
    err = project_points(object_points, T, intrinsics) - corners
    rms = float(np.sqrt(np.mean(np.sum(err**2, axis=1))))
    return BoardView(index, T, corners, object_points, rms)


def _saturated_fraction(gray: NDArray[np.uint8], marker_corners: Any) -> float:
    """Share of saturated pixels where the board was seen (the detected markers' hull; the
    whole image if no marker was found)."""
    if marker_corners is None or len(marker_corners) == 0:
        return float(np.mean(gray >= 250))
    pts = np.concatenate([np.asarray(m).reshape(-1, 2) for m in marker_corners])
    hull = cv2.convexHull(pts.astype(np.float32)).astype(np.int32)
    mask = np.zeros(gray.shape, np.uint8)
    cv2.fillConvexPoly(mask, hull, 1)
    inside = gray[mask > 0]
    return float(np.mean(inside >= 250)) if inside.size else 0.0


def detect_board(
    frame: RGBDFrame, spec: BoardSpec = BOARD, min_corners: int = 8
) -> BoardView | None:
    """Find the board in a frame; None if it is not (fully enough) visible."""
    gray = np.asarray(cv2.cvtColor(frame.color, cv2.COLOR_RGB2GRAY), np.uint8)
    view = find_board(gray, frame.intrinsics, spec, frame.index, min_corners)
    return view if isinstance(view, BoardView) else None


def project_points(
    points: NDArray[np.float64], T_camera_points: NDArray[np.float64], intrinsics: Intrinsics
) -> NDArray[np.float64]:
    """(N, 3) points in a frame at `T_camera_points` -> (N, 2) pixels, through the camera's
    distortion coefficients (OpenCV's model, the one detection and PnP use)."""
    rvec = cv2.Rodrigues(np.ascontiguousarray(T_camera_points[:3, :3]))[0]
    uv, _ = cv2.projectPoints(
        np.ascontiguousarray(points, dtype=np.float64).reshape(-1, 1, 3),
        rvec,
        np.ascontiguousarray(T_camera_points[:3, 3], dtype=np.float64),
        intrinsics.K,
        np.asarray(intrinsics.coeffs, float),
    )
    return np.asarray(uv, np.float64).reshape(-1, 2)


def undistort_pixels(pixels: NDArray[np.float64], intrinsics: Intrinsics) -> NDArray[np.float64]:
    """(N, 2) pixels -> (N, 2) normalised image coordinates (x/z, y/z), the inverse of
    `project_points` (plain pinhole arithmetic when the camera has no distortion)."""
    if not any(intrinsics.coeffs):
        return np.column_stack(
            [
                (pixels[:, 0] - intrinsics.cx) / intrinsics.fx,
                (pixels[:, 1] - intrinsics.cy) / intrinsics.fy,
            ]
        )
    # OpenCV's default 5 iterations leave ~0.01 off at a wide lens's edge (OpenCV 5: the
    # criteria are the last argument of undistortPoints, there is no undistortPointsIter)
    out = cv2.undistortPoints(
        np.ascontiguousarray(pixels, dtype=np.float64).reshape(-1, 1, 2),
        intrinsics.K,
        np.asarray(intrinsics.coeffs, float),
        None,
        np.eye(3),  # R
        np.eye(3),  # P = identity: normalised coordinates out
        (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 100, 1e-12),
    )
    return np.asarray(out, np.float64).reshape(-1, 2)


def view_rms_px(
    view: BoardView, T_camera_board: NDArray[np.float64], intrinsics: Intrinsics
) -> float:
    """RMS reprojection error (px) of a view's corners with the board at `T_camera_board`."""
    err = project_points(view.object_points, T_camera_board, intrinsics) - view.corners
    return float(np.sqrt(np.mean(np.sum(err**2, axis=1))))


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


def hand_eye(
    T_base_hand: Sequence[NDArray[np.float64]], views: Sequence[BoardView], intrinsics: Intrinsics
) -> CalibrationResult:
    """Eye-in-hand calibration from robot hand poses and board views of a fixed board.

    Needs >= 3 views with rotation between them. Park–Martin, then a robust reprojection
    refinement that drops outlier views (see `reconstruction.handeye.solve_hand_eye`).
    Residuals per view: how far that view's board pose in the base frame lies from the
    consensus (mm, deg) and its reprojection RMS. Raises CalibrationError.
    """
    from reconstruction.handeye import solve_hand_eye

    return solve_hand_eye(T_base_hand, views, intrinsics, mode="eye_in_hand")


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
        raise CalibrationError(
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
