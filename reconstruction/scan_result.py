"""`ScanResult`: what a scan produces, and its artifact folder.

```
scans/<id>/
  scan.json          table plane, objects (name, pose, colour, stats), T_base_camera,
                     calibration residuals, quality stats, capture info
  mesh.ply           the fused scene mesh (base frame)
  objects/<name>.obj each object's mesh in its own frame (pose in scan.json)
  camera_path.txt    handheld scans: each tracked frame's estimated camera pose, TUM trajectory
                     format (t tx ty tz qx qy qz qw); scan.json lists every frame, tracked or not
  recording.db3      (when the scan was recorded or copied; else scan.json names the recording)
```

Values at the boundary are numpy arrays and trimesh meshes; Open3D stays inside this package.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import trimesh
from numpy.typing import NDArray

from devices.cameras.tum import format_tum_trajectory, read_tum_trajectory
from devices.errors import DataFileError
from reconstruction.display import display_mesh
from reconstruction.errors import ReconstructionError, clean_message
from resources import atomic

FORMAT = "twinbench-scan"
FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class ScannedObject:
    name: str
    mesh: trimesh.Trimesh  # object frame
    T_base_object: NDArray[np.float64]  # 4x4
    color: tuple[int, int, int] = (180, 180, 180)
    watertight: bool = False
    stats: dict[str, Any] = field(default_factory=dict)

    def mesh_in_base(self) -> trimesh.Trimesh:
        m = self.mesh.copy()
        T = self.T_base_object
        return trimesh.Trimesh(m.vertices @ T[:3, :3].T + T[:3, 3], m.faces, process=False)


@dataclass(frozen=True)
class CameraPath:
    """The estimated camera path of a handheld scan: one entry per frame seen."""

    index: NDArray[np.int64]  # (N,) source frame numbers
    t: NDArray[np.float64]  # (N,) timestamps, s
    poses: NDArray[np.float64]  # (N, 4, 4) T_world_camera, NaN where not tracked
    tracked: NDArray[np.bool_]  # (N,)
    inlier_ratio: NDArray[np.float64]  # (N,) valid-pixel inlier ratio of the accepted pose
    method: tuple[str, ...] = ()  # per frame: first | model | global | relocalised | ""
    reason: tuple[str, ...] = ()  # per frame: why it was not tracked ("" if it was)

    @classmethod
    def from_tracks(cls, tracks: list[Any]) -> CameraPath:
        """From reconstruction.tracking.FrameTrack records."""
        nan = np.full((4, 4), np.nan)
        return cls(
            np.array([t.index for t in tracks], np.int64),
            np.array([t.timestamp for t in tracks], float),
            np.stack([nan if t.pose is None else t.pose for t in tracks])
            if tracks
            else np.zeros((0, 4, 4)),
            np.array([t.pose is not None for t in tracks], bool),
            np.array([t.inlier_ratio for t in tracks], float),
            tuple(t.method for t in tracks),
            tuple(t.reason for t in tracks),
        )

    @property
    def tracked_ratio(self) -> float:
        return float(self.tracked.mean()) if len(self.tracked) else 0.0

    def tum_text(self) -> str:
        k = self.tracked
        return format_tum_trajectory(
            self.t[k], self.poses[k], "Twinbench handheld scan: tracked frames only"
        )

    def frames_json(self) -> list[dict[str, Any]]:
        return [
            {
                "index": int(self.index[i]),
                "t": float(self.t[i]),
                "tracked": bool(self.tracked[i]),
                "inlier_ratio": round(float(self.inlier_ratio[i]), 4),
                "method": self.method[i] if i < len(self.method) else "",
                "reason": self.reason[i] if i < len(self.reason) else "",
            }
            for i in range(len(self.t))
        ]

    @classmethod
    def load(cls, folder: Path, frames: list[dict[str, Any]]) -> CameraPath:
        f = folder / "camera_path.txt"
        poses = np.full((len(frames), 4, 4), np.nan)
        tracked = np.array([bool(x.get("tracked")) for x in frames], bool)
        if tracked.any():
            _, T = read_tum_trajectory(f)
            if len(T) != int(tracked.sum()):
                raise DataFileError(
                    f"{f}: {len(T)} poses but scan.json lists {int(tracked.sum())} tracked frames"
                )
            poses[tracked] = T
        return cls(
            np.array([int(x["index"]) for x in frames], np.int64),
            np.array([float(x["t"]) for x in frames], float),
            poses,
            tracked,
            np.array([float(x.get("inlier_ratio", 0.0)) for x in frames], float),
            tuple(str(x.get("method", "")) for x in frames),
            tuple(str(x.get("reason", "")) for x in frames),
        )


@dataclass(frozen=True)
class ScanResult:
    """A reconstructed workspace in the robot base frame."""

    scene_mesh: trimesh.Trimesh
    table_plane: NDArray[np.float64] | None  # (4,) n x, n y, n z, d (n.p + d = 0)
    objects: tuple[ScannedObject, ...]
    T_base_camera: NDArray[np.float64] | None  # fixed camera, or the hand-eye for wrist
    calibration: dict[str, Any] = field(default_factory=dict)  # method, residuals, errors
    quality: dict[str, Any] = field(default_factory=dict)  # frames, skipped, timings
    warnings: tuple[str, ...] = ()
    capture: dict[str, Any] = field(default_factory=dict)  # sdk version, intrinsics, ...
    camera_path: CameraPath | None = None  # handheld scans: the estimated path
    # a coarser copy of scene_mesh for drawing (`display_copy`); not saved
    display_mesh: trimesh.Trimesh | None = field(default=None, compare=False, repr=False)

    def object(self, name: str) -> ScannedObject:
        for o in self.objects:
            if o.name == name:
                return o
        raise KeyError(name)

    def renamed(self, old: str, new: str) -> ScanResult:
        if not _NAME_RE.match(new):
            raise DataFileError(f"object name {new!r}: use letters, digits, '_', '.', '-'")
        if any(o.name == new for o in self.objects):
            raise DataFileError(f"object name {new!r} is already used in this scan")
        objs = tuple(replace(o, name=new) if o.name == old else o for o in self.objects)
        return replace(self, objects=objs)

    def without(self, name: str) -> ScanResult:
        return replace(self, objects=tuple(o for o in self.objects if o.name != name))

    def recolored(self, name: str, color: tuple[int, int, int]) -> ScanResult:
        objs = tuple(
            replace(o, color=(int(color[0]), int(color[1]), int(color[2]))) if o.name == name else o
            for o in self.objects
        )
        return replace(self, objects=objs)

    # --- files -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def mat(T: NDArray[np.float64] | None) -> list[list[float]] | None:
            return None if T is None else np.asarray(T, float).tolist()

        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "table_plane": None
            if self.table_plane is None
            else [float(v) for v in self.table_plane],
            "T_base_camera": mat(self.T_base_camera),
            "objects": [
                {
                    "name": o.name,
                    "file": f"objects/{o.name}.obj",
                    "T_base_object": mat(o.T_base_object),
                    "color": list(o.color),
                    "watertight": o.watertight,
                    "triangles": int(len(o.mesh.faces)),
                    "stats": o.stats,
                }
                for o in self.objects
            ],
            "calibration": self.calibration,
            "quality": self.quality,
            "warnings": list(self.warnings),
            "capture": self.capture,
            "camera_path": None
            if self.camera_path is None
            else {
                "file": "camera_path.txt",
                "format": "TUM trajectory (t tx ty tz qx qy qz qw), tracked frames only",
                "tracked_ratio": round(self.camera_path.tracked_ratio, 4),
                "frames": self.camera_path.frames_json(),
            },
        }

    def save(self, folder: Path) -> None:
        """Write scan.json, mesh.ply and objects/*.obj into `folder` (atomic per file)."""
        folder = Path(folder)
        (folder / "objects").mkdir(parents=True, exist_ok=True)
        ply = self.scene_mesh.export(file_type="ply")
        assert isinstance(ply, bytes), "trimesh exports PLY as bytes"
        atomic.write_bytes(folder / "mesh.ply", ply)
        for o in self.objects:
            data = o.mesh.export(file_type="obj")
            assert isinstance(data, str | bytes), "trimesh exports OBJ as text"
            atomic.write_text(
                folder / "objects" / f"{o.name}.obj",
                data if isinstance(data, str) else data.decode(),
            )
        if self.camera_path is not None:
            atomic.write_text(folder / "camera_path.txt", self.camera_path.tum_text())
        atomic.write_json(folder / "scan.json", atomic.jsonable(self.to_json()))

    @classmethod
    def load(cls, folder: Path) -> ScanResult:
        """Read a scan artifact folder; DataFileError names the broken file."""
        folder = Path(folder)
        jpath = folder / "scan.json"
        try:
            d = json.loads(jpath.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataFileError(f"{jpath}: cannot read scan ({exc})") from exc
        if d.get("format") != FORMAT:
            raise DataFileError(f"{jpath}: not a Twinbench scan (format field)")
        if int(d.get("format_version", 0)) > FORMAT_VERSION:
            raise DataFileError(
                f"{jpath}: scan format {d['format_version']} is newer than "
                f"this Twinbench supports ({FORMAT_VERSION})"
            )
        scene = _load_mesh(folder / "mesh.ply")
        objs = []
        for o in d.get("objects", []):
            objs.append(
                ScannedObject(
                    str(o["name"]),
                    _load_mesh(folder / o["file"]),
                    np.asarray(o["T_base_object"], float),
                    tuple(o.get("color", (180,) * 3)),
                    bool(o.get("watertight", False)),
                    dict(o.get("stats", {})),
                )
            )
        T = d.get("T_base_camera")
        plane = d.get("table_plane")
        cp = d.get("camera_path")
        path = None if not cp else CameraPath.load(folder, list(cp.get("frames", [])))
        return cls(
            scene,
            None if plane is None else np.asarray(plane, float),
            tuple(objs),
            None if T is None else np.asarray(T, float),
            dict(d.get("calibration", {})),
            dict(d.get("quality", {})),
            tuple(d.get("warnings", [])),
            dict(d.get("capture", {})),
            path,
            display_copy(scene),
        )


DISPLAY_FACES = 30_000  # a window draws a scanned scene with at most this many triangles


def display_copy(mesh: trimesh.Trimesh) -> trimesh.Trimesh:
    """The scene as a window draws it (reconstruction/display.py), made where the scan is
    finished or read, not on the window's thread."""
    return display_mesh(mesh, DISPLAY_FACES)


def _load_mesh(path: Path) -> trimesh.Trimesh:
    if not path.is_file():
        raise DataFileError(f"{path}: missing from the scan folder")
    try:
        m = trimesh.load(path, force="mesh", process=False)
    except Exception as exc:  # trimesh raises many types for bad files
        raise DataFileError(f"{path}: not a readable mesh ({exc})") from exc
    if not isinstance(m, trimesh.Trimesh):
        raise DataFileError(f"{path}: not a triangle mesh")
    return m


def require_usable(result: ScanResult, min_tracked_ratio: float = 0.5) -> None:
    """Raise ReconstructionError, naming what failed and what to try, when a scan is not worth
    saving: an empty mesh, or (handheld) fewer than `min_tracked_ratio` of the frames tracked."""
    q = result.quality
    skipped = q.get("frames_skipped", {})
    reasons: dict[str, int] = {}
    for why in skipped.values():
        key = clean_message(why).split(" (")[0]
        reasons[key] = reasons.get(key, 0) + 1
    top = ", ".join(f"{n} x {k}" for k, n in sorted(reasons.items(), key=lambda x: -x[1])[:3])
    rng = q.get("depth_range_m")
    rng_s = f"{rng[0]:.2f}..{rng[1]:.2f} m" if rng else "the default range"
    path = result.camera_path
    if path is not None and len(path.tracked) and path.tracked_ratio < min_tracked_ratio:
        lost = [i for i, ok in enumerate(path.tracked) if not ok]
        first = int(path.index[lost[0]]) if lost else -1
        raise ReconstructionError(
            f"only {int(path.tracked.sum())} of {len(path.tracked)} frames tracked "
            f"({path.tracked_ratio:.0%}, need {min_tracked_ratio:.0%}); first lost at frame "
            f"{first}; skipped: {top or 'none'}. Try: move the camera more slowly and keep "
            f"surfaces with shape in view, check the depth range ({rng_s}; set it with "
            "--depth-range MIN:MAX), or check the depth scale. Nothing was saved."
        )
    if len(result.scene_mesh.faces) == 0:
        seen = q.get("frames_seen", q.get("frames_integrated", 0) + len(skipped))
        raise ReconstructionError(
            f"the scan is empty: no surface was fused from {seen} frames "
            f"({q.get('frames_integrated', 0)} integrated; skipped: {top or 'none'}). Try: "
            f"check the depth scale and that the surfaces lie within the depth range ({rng_s}; "
            "--depth-range MIN:MAX), or a larger --voxel. Nothing was saved."
        )
