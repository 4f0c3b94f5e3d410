"""What a twin is built from: objects (mesh + pose) and the table, in the robot base frame.

Accepts the reconstruction layer's `ScanResult` (or its artifact folder) and the procedural
demo scan below, for when there is no camera scan yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trimesh
from scipy.spatial.transform import Rotation

from devices.poses import matrix_to_pose, pose_to_matrix
from twins.errors import TwinError


@dataclass(frozen=True)
class ScanObject:
    name: str
    mesh: trimesh.Trimesh  # object frame
    pose: np.ndarray  # (7,) object frame in the robot base frame
    rgba: tuple[float, float, float, float] = (0.3, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class ScanInput:
    """Objects and table in the robot base frame; `table_extent` = (xmin, xmax, ymin, ymax)
    of the table top in its plane frame, `table_plane` = (a, b, c, d) with a x + b y + c z + d
    = 0 and (a, b, c) the unit normal."""

    objects: tuple[ScanObject, ...]
    table_plane: tuple[float, float, float, float] | None = (0.0, 0.0, 1.0, 0.0)
    table_extent: tuple[float, float, float, float] = (-0.25, 0.95, -0.6, 0.6)
    source: str = ""
    notes: tuple[str, ...] = field(default=())


def _u_block() -> trimesh.Trimesh:
    """A U-shaped block 0.10 x 0.07 x 0.05 m (non-convex, watertight): an extruded outline."""
    xy = np.array(
        [
            (-0.05, -0.05),
            (0.05, -0.05),
            (0.05, 0.02),
            (0.02, 0.02),
            (0.02, -0.02),
            (-0.02, -0.02),
            (-0.02, 0.02),
            (-0.05, 0.02),
        ]
    )
    n, h = len(xy), 0.025
    v = np.vstack([np.c_[xy, np.full(n, -h)], np.c_[xy, np.full(n, h)]])
    cap = [(0, 1, 4), (0, 4, 5), (1, 2, 3), (1, 3, 4), (5, 6, 7), (5, 7, 0)]
    faces = [(c, b, a) for a, b, c in cap] + [(a + n, b + n, c + n) for a, b, c in cap]
    for i in range(n):
        k = (i + 1) % n
        faces += [(i, k, k + n), (i, k + n, i + n)]
    return trimesh.Trimesh(v, np.array(faces), process=True)


def _yaw(x: float, y: float, z: float, deg: float) -> np.ndarray:
    return np.array([x, y, z, *Rotation.from_euler("z", deg, degrees=True).as_quat()])


def procedural_scan() -> ScanInput:
    """The demo workspace (same layout as the lab's panda_table scene): a box, a cylinder
    and a non-convex U-block on a table whose top is the plane z = 0."""
    objs = (
        ScanObject(
            "box",
            trimesh.creation.box((0.08, 0.05, 0.05)),
            _yaw(0.56, -0.2, 0.025, 20),
            (0.85, 0.25, 0.2, 1.0),
        ),
        ScanObject(
            "cylinder",
            trimesh.creation.cylinder(0.035, 0.09, sections=32),
            _yaw(0.48, 0.2, 0.045, 0),
            (0.2, 0.4, 0.85, 1.0),
        ),
        ScanObject("u_block", _u_block(), _yaw(0.66, 0.02, 0.025, -30), (0.25, 0.7, 0.3, 1.0)),
    )
    return ScanInput(objs, source="procedural")


def procedural_scan_result() -> Any:
    """The procedural demo scan as a reconstruction `ScanResult` (for a scan artifact)."""
    from reconstruction.scan_result import ScannedObject, ScanResult

    sc = procedural_scan()
    x0, x1, y0, y1 = sc.table_extent
    table = trimesh.creation.box(
        (x1 - x0, y1 - y0, 0.04),
        trimesh.transformations.translation_matrix(((x0 + x1) / 2, (y0 + y1) / 2, -0.02)),
    )
    objs, parts = [], [table]
    for o in sc.objects:
        T = pose_to_matrix(o.pose)
        color = tuple(int(round(255 * c)) for c in o.rgba[:3])
        objs.append(
            ScannedObject(
                o.name,
                o.mesh,
                T,
                color,  # type: ignore[arg-type]
                watertight=bool(o.mesh.is_watertight),
            )
        )
        parts.append(trimesh.Trimesh(trimesh.transform_points(o.mesh.vertices, T), o.mesh.faces))
    return ScanResult(
        trimesh.util.concatenate(parts),
        np.array(sc.table_plane, float),  # type: ignore[arg-type]
        tuple(objs),
        None,
        capture={"source": "procedural"},
    )


def _table_extent(scene: trimesh.Trimesh, plane: np.ndarray) -> tuple[float, float, float, float]:
    """xy bounds of the scene-mesh vertices lying on the table plane (1st-99th percentile)."""
    v = np.asarray(scene.vertices, float)
    n, d = plane[:3] / np.linalg.norm(plane[:3]), plane[3] / np.linalg.norm(plane[:3])
    on = v[np.abs(v @ n + d) < 0.01]
    if len(on) < 10:
        return (-0.25, 0.95, -0.6, 0.6)
    lo, hi = np.percentile(on[:, :2], 1, axis=0), np.percentile(on[:, :2], 99, axis=0)
    return (float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1]))


def _from_scan_result(res: Any, source: str = "scan") -> ScanInput:
    objs = tuple(
        ScanObject(
            o.name, o.mesh, matrix_to_pose(o.T_base_object), (*(c / 255.0 for c in o.color), 1.0)
        )  # type: ignore[arg-type]
        for o in res.objects
    )
    plane = None if res.table_plane is None else np.asarray(res.table_plane, float)
    extent = _table_extent(res.scene_mesh, plane) if plane is not None else (-0.25, 0.95, -0.6, 0.6)
    return ScanInput(
        objs,
        None if plane is None else tuple(float(x) for x in plane),
        extent,  # type: ignore[arg-type]
        source,
        tuple(res.warnings),
    )


def load_scan(scan: Any) -> ScanInput:
    """A ScanInput from a ScanInput, a reconstruction ScanResult, or a scan folder."""
    if isinstance(scan, ScanInput):
        return scan
    if isinstance(scan, (str, Path)):
        from reconstruction.scan_result import ScanResult

        folder = Path(scan)
        if not (folder / "scan.json").is_file():
            raise TwinError(f"{folder}: not a scan folder (no scan.json)")
        return _from_scan_result(ScanResult.load(folder), folder.name)
    return _from_scan_result(scan)
