"""The ChArUco board: its spec, image, detection in a view, and the camera projection.

- `BoardSpec.parse("charuco:5x7:0.036195:0.018256:DICT_6X6_250")`: a board from one string.
- `find_board(gray, intrinsics)` / `detect_board(frame)`: ChArUco corners (OpenCV aruco) and
  the board pose `T_camera_board` with its reprojection RMS (an intrinsics check: > ~1 px
  means the intrinsics are off); `find_board` says why a view was rejected (glare, too few
  corners, collinear corners).
- `project_points(points, T_camera_points, intrinsics)`: the one projection, through the
  camera's distortion coefficients, used by every calibration residual; `undistort_pixels`
  is its inverse.
- `save_board_png(path)`: the printable board (also what the virtual lab textures).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from numpy.typing import NDArray

from devices.frames import Intrinsics, RGBDFrame
from reconstruction.errors import ReconstructionError
from resources import atomic


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
