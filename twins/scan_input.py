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

from devices.poses import matrix_to_pose, pose_to_matrix
from reconstruction.scan_result import ScannedObject, ScanResult
from resources import path as resource_path
from twins.errors import TwinError


@dataclass(frozen=True)
class ScanObject:
    name: str
    mesh: trimesh.Trimesh  # object frame
    pose: np.ndarray  # (7,) object frame in the robot base frame
    rgba: tuple[float, float, float, float] = (0.3, 0.6, 0.8, 1.0)
    # points the scan observed on and around the object (object frame), None when unknown:
    # what a primitive is fitted to (twins/primitives.py); the rest of `mesh` was closed
    observed: np.ndarray | None = None


def observed_points(
    scene: trimesh.Trimesh, T_base_object: np.ndarray, mesh: trimesh.Trimesh, margin: float = 0.01
) -> np.ndarray:
    """Points on the scene mesh (what the camera saw) within `margin` m of the object mesh's
    bounding box, in the object frame: about one per 2 mm x 2 mm (seeded), at most 40000."""
    if len(mesh.vertices) == 0 or len(scene.faces) == 0:  # an empty mesh: its own error later
        return np.zeros((0, 3))
    v = trimesh.transform_points(np.asarray(scene.vertices, float), np.linalg.inv(T_base_object))
    lo, hi = mesh.bounds[0] - margin, mesh.bounds[1] + margin
    inside = np.all((v > lo) & (v < hi), axis=1)
    faces = np.asarray(scene.faces)[inside[np.asarray(scene.faces)].all(axis=1)]
    if len(faces) == 0:
        return np.zeros((0, 3))
    part = trimesh.Trimesh(v, faces, process=False)
    n = int(min(40000, max(100, part.area / 0.002**2)))
    pts, _ = trimesh.sample.sample_surface(part, n, seed=0)
    return np.asarray(pts, float)


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


LAB_SCENE = "panda_table"  # the demo workspace is this lab scene's


def lab_scene_objects(scene: str = LAB_SCENE) -> tuple[ScanObject, ...]:
    """The objects of lab scene `scene` as the scene's own description declares them
    (resources/lab/<scene>.json, written from devices/lab/scenes.py; mesh objects from
    resources/lab/meshes/): shape, size, resting pose and colour only, never the hidden
    physical truth (mass, friction, ...). Read as plain files, so the GUI process never
    loads the lab (MuJoCo). Raises TwinError naming the file when it is missing or wrong."""
    import json

    file = resource_path("lab", f"{scene}.json")
    try:
        objects = json.loads(file.read_text())["objects"]
        out = []
        for o in objects:
            shape, size = o["shape"], [float(v) for v in o["size"]]
            if shape == "box":
                mesh = trimesh.creation.box(extents=size)
            elif shape == "cylinder":
                mesh = trimesh.creation.cylinder(radius=size[0], height=size[1], sections=64)
            elif shape == "mesh":
                mfile = resource_path("lab", "meshes", f"{o['mesh']}.obj")
                mesh = trimesh.load(mfile, force="mesh", process=True)
                mesh.apply_scale(size[0] if size else 1.0)
            else:
                raise ValueError(f"object {o['name']!r}: unknown shape {shape!r}")
            rgba = tuple(float(c) for c in o.get("rgba", (0.3, 0.6, 0.8, 1.0)))
            out.append(ScanObject(o["name"], mesh, np.asarray(o["pose"], float), rgba))  # type: ignore[arg-type]
    except (OSError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise TwinError(f"{file}: cannot read the lab scene's objects ({exc})") from exc
    return tuple(out)


def procedural_scan() -> ScanInput:
    """The demo workspace: the lab's panda_table scene (a box, a cylinder and a non-convex
    U-block on a table whose top is the plane z = 0), from the scene's own description."""
    return ScanInput(lab_scene_objects(LAB_SCENE), source="procedural")


def procedural_scan_result() -> Any:
    """The procedural demo scan as a reconstruction `ScanResult` (for a scan artifact)."""
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
    scene = trimesh.util.concatenate(parts)
    assert isinstance(scene, trimesh.Trimesh)
    return ScanResult(
        scene,
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
            o.name,
            o.mesh,
            matrix_to_pose(o.T_base_object),
            (*(c / 255.0 for c in o.color), 1.0),  # type: ignore[arg-type]
            observed_points(res.scene_mesh, o.T_base_object, o.mesh),
        )
        for o in res.objects
    )
    plane = None if res.table_plane is None else [float(x) for x in res.table_plane]
    extent = (
        _table_extent(res.scene_mesh, np.asarray(plane))
        if plane is not None
        else (-0.25, 0.95, -0.6, 0.6)
    )
    return ScanInput(
        objs,
        None if plane is None else (plane[0], plane[1], plane[2], plane[3]),
        extent,  # type: ignore[arg-type]
        source,
        tuple(res.warnings),
    )


def load_scan(scan: Any) -> ScanInput:
    """A ScanInput from a ScanInput, a reconstruction ScanResult, or a scan folder."""
    if isinstance(scan, ScanInput):
        return scan
    if isinstance(scan, (str, Path)):
        folder = Path(scan)
        if not (folder / "scan.json").is_file():
            raise TwinError(f"{folder}: not a scan folder (no scan.json)")
        return _from_scan_result(ScanResult.load(folder), folder.name)
    return _from_scan_result(scan)
