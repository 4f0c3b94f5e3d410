"""What a twin is built from: objects (mesh + pose) and the table, in the robot base frame.

Accepts the reconstruction layer's `ScanResult` when it exists (duck-typed: `objects` with
`name`, `mesh`, `pose`/`T_world_object`, a table `plane`), a scan folder (`scan.json` +
`objects/*.obj`), or the procedural demo scan below (same folder format) when there is no
camera scan yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trimesh
from scipy.spatial.transform import Rotation

from devices.poses import matrix_to_pose, pose_to_matrix
from resources import atomic
from twins.errors import TwinError


@dataclass(frozen=True)
class ScanObject:
    name: str
    mesh: trimesh.Trimesh          # object frame
    pose: np.ndarray               # (7,) object frame in the robot base frame


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
    xy = np.array([(-0.05, -0.05), (0.05, -0.05), (0.05, 0.02), (0.02, 0.02), (0.02, -0.02),
                   (-0.02, -0.02), (-0.02, 0.02), (-0.05, 0.02)])
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
        ScanObject("box", trimesh.creation.box((0.08, 0.05, 0.05)), _yaw(0.56, -0.2, 0.025, 20)),
        ScanObject("cylinder", trimesh.creation.cylinder(0.035, 0.09, sections=32),
                   _yaw(0.48, 0.2, 0.045, 0)),
        ScanObject("u_block", _u_block(), _yaw(0.66, 0.02, 0.025, -30)),
    )
    return ScanInput(objs, source="procedural")


def write_scan(scan: ScanInput, folder: Path) -> None:
    """Write the scan folder format (`scan.json`, `objects/<name>.obj`)."""
    (Path(folder) / "objects").mkdir(parents=True, exist_ok=True)
    for o in scan.objects:
        o.mesh.export(Path(folder) / "objects" / f"{o.name}.obj")
    atomic.write_json(Path(folder) / "scan.json", {
        "format": "twinbench-scan", "format_version": 1, "source": scan.source,
        "frame": "robot_base",
        "table": {"plane": list(scan.table_plane) if scan.table_plane else None,
                  "extent": list(scan.table_extent)},
        "objects": [{"name": o.name, "mesh": f"objects/{o.name}.obj",
                     "pose": [float(x) for x in o.pose]} for o in scan.objects],
        "notes": list(scan.notes),
    })


def _from_scan_result(res: Any) -> ScanInput:
    objs = []
    for i, o in enumerate(res.objects):
        name = str(getattr(o, "name", f"object{i}"))
        T = getattr(o, "T_world_object", None)
        pose = matrix_to_pose(T) if T is not None else np.asarray(o.pose, float)
        objs.append(ScanObject(name, o.mesh, pose))
    T_base_world = getattr(res, "T_base_world", None)
    if T_base_world is not None:
        T = np.asarray(T_base_world, float)
        objs = [ScanObject(o.name, o.mesh, matrix_to_pose(T @ pose_to_matrix(o.pose))) for o in objs]
    plane = getattr(res, "table_plane", None) or getattr(res, "plane", None)
    if plane is not None and hasattr(plane, "to_list"):
        plane = plane.to_list()
    return ScanInput(tuple(objs), tuple(plane) if plane is not None else None,
                     source=str(getattr(res, "id", "scan")))


def load_scan(scan: Any) -> ScanInput:
    """A ScanInput from a ScanInput, a ScanResult-like object, or a scan folder."""
    if isinstance(scan, ScanInput):
        return scan
    if not isinstance(scan, (str, Path)):
        return _from_scan_result(scan)
    folder = Path(scan)
    try:  # the reconstruction layer's own format, once it exists
        from reconstruction.scan import ScanResult  # type: ignore[import-not-found]

        if (folder / "scan.json").is_file() and hasattr(ScanResult, "load"):
            d = json.loads((folder / "scan.json").read_text())
            if d.get("format") != "twinbench-scan":
                return _from_scan_result(ScanResult.load(folder))
    except ImportError:
        pass
    path = folder / "scan.json"
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TwinError(f"{path}: no scan here") from None
    except (OSError, ValueError) as exc:
        raise TwinError(f"{path}: unreadable scan description ({exc})") from exc
    objs = []
    for o in d.get("objects", []):
        mpath = folder / o["mesh"]
        if not mpath.is_file():
            raise TwinError(f"{path}: object '{o.get('name')}' mesh {mpath} is missing")
        try:
            mesh = trimesh.load(mpath, force="mesh", process=True)
        except Exception as exc:  # trimesh raises many types on bad files
            raise TwinError(f"{mpath}: unreadable mesh ({exc})") from exc
        objs.append(ScanObject(str(o["name"]), mesh, np.asarray(o["pose"], float)))
    table = d.get("table") or {}
    plane = table.get("plane")
    return ScanInput(tuple(objs), tuple(plane) if plane else None,
                     tuple(table.get("extent", (-0.25, 0.95, -0.6, 0.6))),
                     str(d.get("source", folder.name)), tuple(d.get("notes", ())))
