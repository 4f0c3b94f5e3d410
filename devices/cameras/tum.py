"""A folder of RGB-D frames in the TUM RGB-D benchmark layout, as a `CameraSource`.

```
DIR/
  associations.txt   "t_rgb rgb/FILE t_depth depth/FILE" per line (or rgb.txt + depth.txt,
                     associated here by nearest timestamp)
  rgb/, depth/       colour images (PNG/JPEG) and uint16 depth PNGs registered to colour
  intrinsics.json    optional: width, height, fx, fy, cx, cy, depth_scale (units per metre)
  groundtruth.txt    optional: "t tx ty tz qx qy qz qw" camera-to-world (motion capture)
```

Depth units default to the benchmark's 5000 per metre; intrinsics default to the TUM
freiburg3 camera (the benchmark's own default for undistorted images). Frames carry no pose:
a camera does not know where it is; the ground truth is for benchmarks and tests
(`groundtruth()`), never for the scan. The TUM trajectory format (`read_tum_trajectory`,
`format_tum_trajectory`) is also the format scans store their estimated camera path in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from devices.errors import DataFileError
from devices.frames import Intrinsics, RGBDFrame
from devices.poses import matrix_to_pose, pose_to_matrix

TUM_DEPTH_UNITS_PER_M = 5000.0
# TUM freiburg3 (Asus Xtion) colour camera, images already undistorted by the benchmark
TUM_FR3 = Intrinsics(640, 480, 535.4, 539.2, 320.1, 247.6)
MAX_ASSOCIATION_DT = 0.02  # s, TUM's own associate.py default


@dataclass(frozen=True)
class TumEntry:
    t: float
    rgb: Path
    depth: Path


def is_tum_folder(path: Path) -> bool:
    """True if `path` is a folder holding associations.txt, or rgb.txt and depth.txt."""
    p = Path(path)
    return p.is_dir() and (
        (p / "associations.txt").is_file()
        or ((p / "rgb.txt").is_file() and (p / "depth.txt").is_file())
    )


def _table(path: Path, cols: int) -> list[list[str]]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.split()
        if len(parts) < cols:
            raise DataFileError(f"{path}:{n}: expected {cols} columns, got {len(parts)}")
        rows.append(parts)
    return rows


def read_tum_trajectory(path: Path) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(timestamps (N,), T_world_camera (N, 4, 4)) from a TUM trajectory file."""
    path = Path(path)
    try:
        rows = _table(path, 8)
        a = np.array([[float(v) for v in r[:8]] for r in rows], dtype=float)
    except (OSError, ValueError) as exc:
        raise DataFileError(
            f"{path}: not a TUM trajectory 't tx ty tz qx qy qz qw' ({exc})"
        ) from exc
    if len(a) == 0:
        raise DataFileError(f"{path}: the trajectory holds no poses")
    return a[:, 0], np.stack([pose_to_matrix(r[1:]) for r in a])


def format_tum_trajectory(t: NDArray[np.float64], T: NDArray[np.float64], comment: str = "") -> str:
    """Text of a TUM trajectory file: one 't tx ty tz qx qy qz qw' line per pose."""
    lines = [f"# {c}" for c in comment.splitlines()] if comment else []
    lines.append("# timestamp tx ty tz qx qy qz qw (camera to world)")
    for ti, Ti in zip(t, T, strict=True):
        p = matrix_to_pose(Ti)
        lines.append(f"{ti:.6f} " + " ".join(f"{v:.6f}" for v in p))
    return "\n".join(lines) + "\n"


def _associate(folder: Path) -> list[TumEntry]:
    assoc = folder / "associations.txt"
    if assoc.is_file():
        return [TumEntry(float(r[0]), folder / r[1], folder / r[3]) for r in _table(assoc, 4)]
    rgb = [(float(r[0]), r[1]) for r in _table(folder / "rgb.txt", 2)]
    depth = [(float(r[0]), r[1]) for r in _table(folder / "depth.txt", 2)]
    if not depth:
        return []
    td = np.array([d[0] for d in depth])
    out, used = [], set()
    for t, f in rgb:
        j = int(np.argmin(np.abs(td - t)))
        if abs(td[j] - t) <= MAX_ASSOCIATION_DT and j not in used:
            used.add(j)
            out.append(TumEntry(t, folder / f, folder / depth[j][1]))
    return out


class TumFolderSource:
    """`CameraSource` over a TUM-layout folder: frames in timestamp order, as fast as read.

    `stride` keeps every n-th frame, `max_frames` stops early. Raises DataFileError naming the
    folder or file when the layout, an image or the intrinsics are wrong.
    """

    def __init__(self, folder: Path, stride: int = 1, max_frames: int | None = None) -> None:
        self.path = Path(folder)
        if not self.path.is_dir():
            raise DataFileError(f"{self.path}: no such folder")
        if not is_tum_folder(self.path):
            raise DataFileError(
                f"{self.path}: not a TUM RGB-D folder (needs associations.txt, or rgb.txt "
                "and depth.txt)"
            )
        try:
            self.entries = _associate(self.path)[:: max(1, stride)]
        except (OSError, ValueError) as exc:
            raise DataFileError(f"{self.path}: cannot read the frame lists ({exc})") from exc
        if max_frames is not None:
            self.entries = self.entries[:max_frames]
        if not self.entries:
            raise DataFileError(f"{self.path}: the frame lists name no colour + depth pairs")
        self.intrinsics, self.depth_scale = self._calibration()
        self.frames_read = 0
        self.dropped: list[int] = []
        self.warnings: list[str] = []

    def _calibration(self) -> tuple[Intrinsics, float]:
        f = self.path / "intrinsics.json"
        if not f.is_file():
            return TUM_FR3, 1.0 / TUM_DEPTH_UNITS_PER_M
        try:
            d = json.loads(f.read_text(encoding="utf-8"))
            K = Intrinsics(
                int(d["width"]),
                int(d["height"]),
                float(d["fx"]),
                float(d["fy"]),
                float(d["cx"]),
                float(d["cy"]),
            )
            units = float(d.get("depth_scale", TUM_DEPTH_UNITS_PER_M))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataFileError(f"{f}: needs width, height, fx, fy, cx, cy ({exc})") from exc
        if not 100 <= units <= 100000:
            raise DataFileError(f"{f}: depth_scale {units} units per metre is implausible")
        return K, 1.0 / units

    def __enter__(self) -> TumFolderSource:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def record_to(self, path: Path) -> None:
        raise DataFileError(
            f"{self.path}: re-recording a frame folder is not supported (it already is a "
            "recording; copy the folder instead)"
        )

    def __len__(self) -> int:
        return len(self.entries)

    def files(self) -> list[Path]:
        """Every file the frames come from (for the recording's size and hash)."""
        extra = [
            self.path / n
            for n in ("associations.txt", "rgb.txt", "depth.txt", "intrinsics.json")
            if (self.path / n).is_file()
        ]
        return extra + [p for e in self.entries for p in (e.rgb, e.depth)]

    def frames(self) -> Iterator[RGBDFrame]:
        """Yield every frame; DataFileError names an unreadable or mismatched image."""
        import cv2

        K = self.intrinsics
        for i, e in enumerate(self.entries):
            color = cv2.imread(str(e.rgb), cv2.IMREAD_COLOR)
            depth = cv2.imread(str(e.depth), cv2.IMREAD_UNCHANGED)
            if color is None:
                raise DataFileError(f"{e.rgb}: missing or not an image")
            if depth is None or depth.dtype != np.uint16 or depth.ndim != 2:
                raise DataFileError(f"{e.depth}: missing or not a 16-bit single-channel PNG")
            if depth.shape != color.shape[:2] or depth.shape != (K.height, K.width):
                raise DataFileError(
                    f"{e.depth}: depth {depth.shape[::-1]} / colour {color.shape[1::-1]} do "
                    f"not match the intrinsics' {K.width}x{K.height}"
                )
            self.frames_read += 1
            yield RGBDFrame(
                np.ascontiguousarray(color[:, :, ::-1]),
                np.asarray(depth, np.uint16),
                self.depth_scale,
                K,
                e.t,
                i,
                None,
                {"aligned": True, "source": "tum", "file": e.rgb.name},
            )

    def groundtruth(self) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
        """(frame timestamps, T_world_camera per frame) from groundtruth.txt, interpolated at
        the frames' timestamps (nearest within 20 ms); None without the file. Frames without
        ground truth nearby get NaN poses."""
        gt = self.path / "groundtruth.txt"
        if not gt.is_file():
            return None
        tg, Tg = read_tum_trajectory(gt)
        t = np.array([e.t for e in self.entries])
        out = np.full((len(t), 4, 4), np.nan)
        for i, ti in enumerate(t):
            j = int(np.argmin(np.abs(tg - ti)))
            if abs(tg[j] - ti) <= MAX_ASSOCIATION_DT:
                out[i] = Tg[j]
        return t, out
