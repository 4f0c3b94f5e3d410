"""Hand-eye calibration from a folder of board images and a folder of robot pose files.

Layout (robot_cal_tools' and most capture scripts'): `images/N.jpg|png` and `poses/N.yaml`
paired by file name. A pose file holds the robot base -> wrist (tool) transform as

- YAML or JSON keys `x y z` (metres) and `qx qy qz qw` (ROS / robot_cal_tools), or
- JSON `{"pose": [x, y, z, qx, qy, qz, qw]}` or `{"T_base_hand": 4x4}`, or
- a text file of 7 numbers (x y z qx qy qz qw) or 16 numbers (a row-major 4x4).

Intrinsics come from a YAML/JSON file with `fx fy cx cy` (optionally under `intrinsics:`,
optional `coeffs` / `distortion` list, optional `width height`); if none is given, the
first of `camera_intr_calibrated.yaml`, `intrinsics.yaml`, `intrinsics.json`,
`camera_intr.yaml` next to the images or in their parent folder is used.

Only flat `key: number` YAML (one level of nesting) is read: that is what these files are,
and it spares a YAML dependency.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from numpy.typing import NDArray

from devices.frames import Intrinsics
from devices.poses import pose_to_matrix
from reconstruction.board import (
    BoardSpec,
    BoardView,
    CalibrationError,
    RejectedView,
    find_board,
)
from reconstruction.calibration import CalibrationResult
from reconstruction.handeye import HandEyeOptions, Mode, solve_hand_eye

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff")
POSE_SUFFIXES = (".yaml", ".yml", ".json", ".txt")
INTRINSICS_NAMES = (
    "camera_intr_calibrated.yaml",
    "intrinsics.yaml",
    "intrinsics.json",
    "camera_intr.yaml",
)


@dataclass
class Capture:
    """Board views with their wrist poses, and the images left out (with reasons)."""

    views: list[BoardView] = field(default_factory=list)
    T_base_hand: list[NDArray[np.float64]] = field(default_factory=list)
    rejected: list[RejectedView] = field(default_factory=list)
    files: dict[int, str] = field(default_factory=dict)  # view index -> image file name
    intrinsics: Intrinsics | None = None
    intrinsics_file: Path | None = None


def calibrate_folder(
    images_dir: Path,
    poses_dir: Path,
    board: BoardSpec,
    mode: Mode = "eye_to_hand",
    intrinsics_file: Path | None = None,
    options: HandEyeOptions | None = None,
    min_corners: int = 8,
) -> tuple[CalibrationResult, Capture]:
    """Detect the board in every image, pair it with its pose file and solve hand-eye.

    Returns the result (views left out by detection are in `result.rejected`) and the
    capture it came from. Raises CalibrationError naming the file for unreadable images,
    pose or intrinsics files, and when too few views remain."""
    capture = load_capture(images_dir, poses_dir, board, intrinsics_file, min_corners)
    assert capture.intrinsics is not None
    result = solve_hand_eye(
        capture.T_base_hand,
        capture.views,
        capture.intrinsics,
        mode=mode,
        options=options,
        rejected=capture.rejected,
    )
    return result, capture


def load_capture(
    images_dir: Path,
    poses_dir: Path,
    board: BoardSpec,
    intrinsics_file: Path | None = None,
    min_corners: int = 8,
) -> Capture:
    """Board views and wrist poses of a folder capture (see the module docstring)."""
    images_dir, poses_dir = Path(images_dir), Path(poses_dir)
    for folder, what in ((images_dir, "images"), (poses_dir, "poses")):
        if not folder.is_dir():
            raise CalibrationError(f"{folder}: the {what} folder does not exist")
    images = sorted(
        (p for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES), key=_natural
    )
    if not images:
        raise CalibrationError(
            f"{images_dir}: no images ({', '.join(IMAGE_SUFFIXES)}) in the images folder"
        )
    capture = Capture()
    capture.intrinsics_file = intrinsics_file or find_intrinsics_file(images_dir)
    if capture.intrinsics_file is None:
        raise CalibrationError(
            f"{images_dir}: no intrinsics file given (--intrinsics) and none of "
            f"{', '.join(INTRINSICS_NAMES)} next to the images or in their parent folder"
        )
    for position, image_path in enumerate(images):
        index = int(image_path.stem) if image_path.stem.isdigit() else position
        pose_path = _pose_file(poses_dir, image_path)
        T_base_hand = read_pose_file(pose_path)
        gray = cv2.imread(str(image_path), cv2.IMREAD_GRAYSCALE)
        if gray is None:
            raise CalibrationError(
                f"{image_path}: cannot read the image (not a JPEG/PNG/BMP/TIFF that OpenCV "
                "decodes, or the file is truncated)"
            )
        if capture.intrinsics is None:
            capture.intrinsics = read_intrinsics_file(
                capture.intrinsics_file, gray.shape[1], gray.shape[0]
            )
        intr = capture.intrinsics
        if (gray.shape[1], gray.shape[0]) != (intr.width, intr.height):
            raise CalibrationError(
                f"{image_path}: {gray.shape[1]}x{gray.shape[0]} pixels, but the intrinsics "
                f"({capture.intrinsics_file}) are for {intr.width}x{intr.height}"
            )
        found = find_board(np.asarray(gray, np.uint8), intr, board, index, min_corners)
        capture.files[index] = image_path.name
        if isinstance(found, RejectedView):
            capture.rejected.append(
                RejectedView(found.index, found.reason, f"{image_path.name}: {found.detail}")
            )
        else:
            capture.views.append(found)
            capture.T_base_hand.append(T_base_hand)
    return capture


def find_intrinsics_file(images_dir: Path) -> Path | None:
    """The first of INTRINSICS_NAMES next to the images or in their parent folder."""
    for folder in (Path(images_dir), Path(images_dir).parent):
        for name in INTRINSICS_NAMES:
            if (folder / name).is_file():
                return folder / name
    return None


def read_pose_file(path: Path) -> NDArray[np.float64]:
    """Base -> wrist transform (4x4) from a pose file (see the module docstring)."""
    expected = (
        "expected x y z qx qy qz qw keys (YAML/JSON), {'pose': [7 numbers]}, "
        "{'T_base_hand': 4x4}, or a text file of 7 or 16 numbers"
    )
    try:
        if path.suffix.lower() == ".txt":
            numbers = np.array(path.read_text().replace(",", " ").split(), float)
            data: Any = numbers.tolist()
        elif path.suffix.lower() == ".json":
            data = json.loads(path.read_text())
        else:
            data = read_flat_yaml(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read the pose file ({exc}); {expected}") from None
    try:
        if isinstance(data, dict) and all(
            k in data for k in ("x", "y", "z", "qx", "qy", "qz", "qw")
        ):
            pose = [float(data[k]) for k in ("x", "y", "z", "qx", "qy", "qz", "qw")]
            return _checked_pose(path, pose)
        if isinstance(data, dict) and "pose" in data:
            return _checked_pose(path, [float(v) for v in data["pose"]])
        if isinstance(data, dict) and "T_base_hand" in data:
            return _checked_matrix(path, np.asarray(data["T_base_hand"], float))
        if isinstance(data, list) and len(data) == 7:
            return _checked_pose(path, [float(v) for v in data])
        if isinstance(data, list) and len(data) == 16:
            return _checked_matrix(path, np.asarray(data, float).reshape(4, 4))
    except (TypeError, ValueError) as exc:
        raise CalibrationError(f"{path}: bad pose values ({exc}); {expected}") from None
    raise CalibrationError(f"{path}: not a pose file; {expected}")


def _checked_pose(path: Path, pose: Sequence[float]) -> NDArray[np.float64]:
    q = np.asarray(pose[3:7], float)
    if not np.all(np.isfinite(pose)) or abs(np.linalg.norm(q) - 1.0) > 1e-3:
        raise CalibrationError(
            f"{path}: the quaternion (qx qy qz qw) = {q.tolist()} is not a unit quaternion"
        )
    return pose_to_matrix(pose)


def _checked_matrix(path: Path, T: NDArray[np.float64]) -> NDArray[np.float64]:
    R = T[:3, :3] if T.shape == (4, 4) else np.zeros((3, 3))
    if (
        T.shape != (4, 4)
        or not np.all(np.isfinite(T))
        or not np.allclose(R @ R.T, np.eye(3), atol=1e-4)
        or not np.allclose(T[3], [0, 0, 0, 1])
    ):
        raise CalibrationError(f"{path}: not a rigid 4x4 transform")
    return T


def read_intrinsics_file(path: Path, width: int, height: int) -> Intrinsics:
    """Pinhole intrinsics (+ distortion) from a YAML/JSON file; width/height from the images
    unless the file has them."""
    try:
        data = json.loads(path.read_text()) if path.suffix.lower() == ".json" else None
        if data is None:
            data = read_flat_yaml(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read the intrinsics file ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("intrinsics"), dict):
        data = {**data, **data["intrinsics"]}
    missing = [k for k in ("fx", "fy", "cx", "cy") if not isinstance(data, dict) or k not in data]
    if missing:
        raise CalibrationError(f"{path}: intrinsics file lacks {', '.join(missing)}")
    coeffs = data.get("coeffs", data.get("distortion", [0.0] * 5))
    try:
        return Intrinsics(
            int(data.get("width", width)),
            int(data.get("height", height)),
            float(data["fx"]),
            float(data["fy"]),
            float(data["cx"]),
            float(data["cy"]),
            tuple(float(c) for c in coeffs),
        )
    except (TypeError, ValueError) as exc:
        raise CalibrationError(f"{path}: bad intrinsics values ({exc})") from None


def read_flat_yaml(path: Path) -> dict[str, Any]:
    """`key: value` lines with `#` comments and one level of indented nesting; values are
    numbers, `[a, b]` lists or bare strings. Raises ValueError on anything else."""
    out: dict[str, Any] = {}
    section: dict[str, Any] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip() or line.strip() in ("---", "%YAML:1.0"):
            continue
        match = re.fullmatch(r"(\s*)([A-Za-z_][\w\-]*)\s*:\s*(.*)", line)
        if match is None:
            raise ValueError(f"line {number} is not 'key: value': {raw.strip()!r}")
        indent, key, value = match.groups()
        target = section if indent and section is not None else out
        if not value:
            if indent:
                raise ValueError(f"line {number}: more than one level of nesting")
            section = out[key] = {}
            continue
        if not indent:
            section = None
        target[key] = _yaml_value(value)
    return out


def _yaml_value(text: str) -> Any:
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    try:
        return float(text)
    except ValueError:
        return text.strip("'\"")


def _pose_file(poses_dir: Path, image_path: Path) -> Path:
    for suffix in POSE_SUFFIXES:
        candidate = poses_dir / (image_path.stem + suffix)
        if candidate.is_file():
            return candidate
    raise CalibrationError(
        f"{image_path}: no pose file {image_path.stem}{{{','.join(POSE_SUFFIXES)}}} in {poses_dir}"
    )


def _natural(path: Path) -> tuple[int, str]:
    return (int(path.stem), "") if path.stem.isdigit() else (1 << 60, path.name)
