"""What a 3D view needs from a twin: meshes in their body frames and the current poses.

Robot links come from the URDF's visual elements (parsed here: the twin loads none into PyBullet);
objects from the twin's visual mesh; collision geometry (primitives or convex hulls) is
returned separately so a view can toggle it. Plain numpy/trimesh values, no PyBullet types.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np
import trimesh

from devices.poses import pose_to_matrix
from reconstruction.display import display_mesh, mesh_arrays
from twins.builder import TwinWorld
from twins.engine import pb
from twins.spec import ObjectSpec, TwinSpec
from twins.urdf import loadable_urdf, visuals

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Drawable:
    """A mesh attached to `body` (a name in `poses()`), placed by `T_body_mesh`."""

    name: str
    body: str
    vertices: np.ndarray
    faces: np.ndarray
    rgba: tuple[float, float, float, float]
    T_body_mesh: np.ndarray
    collision: bool = False


_RAW: dict[str, tuple[np.ndarray, np.ndarray] | str] = {}  # path -> arrays, or why not
_RAW_LOCK = threading.Lock()


def preload(paths: Iterable[str]) -> None:
    """Read the mesh files not read yet in a worker process: trimesh's OBJ parser holds the
    GIL 50-130 ms per Panda link on a quiet core, and opening a twin on a loaded laptop held
    the window 0.6 s. Read here when no worker can be started."""
    with _RAW_LOCK:
        todo = sorted({p for p in paths if p not in _RAW})
    if not todo:
        return
    try:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no Qt, no threads
        with ProcessPoolExecutor(1, mp_context=ctx) as ex:
            got = list(ex.map(mesh_arrays, todo))
    except (OSError, BrokenProcessPool) as exc:
        log.warning("mesh reader process failed (%s); reading %d meshes here", exc, len(todo))
        got = [mesh_arrays(p) for p in todo]
    with _RAW_LOCK:
        _RAW.update(zip(todo, got, strict=True))


def _load(path: str, scale: tuple[float, float, float]) -> trimesh.Trimesh | None:
    """The mesh at `path` scaled, or None (with a warning naming the file and why) when it
    cannot be read or has no faces: a view draws what it can, the twin still simulates."""
    with _RAW_LOCK:
        raw = _RAW.get(path)
    if raw is None:
        raw = mesh_arrays(path)
        with _RAW_LOCK:
            _RAW[path] = raw
    if isinstance(raw, str):
        log.warning("%s: %s", path, raw)
        return None
    v, f = raw
    return trimesh.Trimesh(v * np.asarray(scale), f, process=False)


def _primitive(kind: str, size: tuple[float, ...]) -> trimesh.Trimesh:
    if kind == "box":
        return trimesh.creation.box(np.asarray(size) * 2)
    if kind == "cylinder":
        return trimesh.creation.cylinder(size[0], size[1], sections=24)
    return trimesh.creation.icosphere(2, size[0])


COLLISION_RGBA = (0.2, 0.9, 0.4, 0.35)
# The Panda's links have 12-22 k triangles each, 100 k in all, ~15 ms a frame in software
# OpenGL: views get each mesh clustered down to this many (a few mm of detail lost on a link).
DISPLAY_MAX_FACES = 2500


def _drawable(
    name: str,
    body: str,
    mesh: trimesh.Trimesh,
    rgba: tuple[float, float, float, float],
    T_body_mesh: np.ndarray,
    collision: bool = False,
) -> Drawable:
    return Drawable(
        name, body, np.asarray(mesh.vertices), np.asarray(mesh.faces), rgba, T_body_mesh, collision
    )


def _object_drawables(spec: TwinSpec, o: ObjectSpec, body: str) -> list[Drawable]:
    out = []
    vis = None
    if o.shape.mesh:
        vis = _load(str(spec.resolve(o.shape.mesh)), (1.0, 1.0, 1.0))
        if vis is None:
            log.warning("object '%s': drawn from its collision shape instead", o.name)
    T_col = pose_to_matrix(o.shape.collision_pose)
    T_vis = np.eye(4)
    if vis is None and o.shape.kind == "mesh":  # fall back to the hulls, shown solid
        hulls = [_load(str(spec.resolve(h)), (1.0, 1.0, 1.0)) for h in o.shape.hulls]
        parts = [h for h in hulls if h is not None]
        vis = trimesh.util.concatenate(parts) if parts else None  # type: ignore[assignment]
    elif vis is None:
        vis, T_vis = _primitive(o.shape.kind, o.shape.size), T_col
    if vis is not None:
        vis = display_mesh(vis, DISPLAY_MAX_FACES)
        rgba = (o.rgba[0], o.rgba[1], o.rgba[2], o.rgba[3])
        out.append(_drawable(f"{body}/visual", body, vis, rgba, T_vis))
    if o.shape.kind == "mesh":
        for i, h in enumerate(o.shape.hulls):
            m = _load(str(spec.resolve(h)), (1.0, 1.0, 1.0))
            if m is not None:
                out.append(_drawable(f"{body}/hull{i}", body, m, COLLISION_RGBA, np.eye(4), True))
    else:
        m = _primitive(o.shape.kind, o.shape.size)
        out.append(_drawable(f"{body}/collision", body, m, COLLISION_RGBA, T_col, True))
    return out


def drawables(world: TwinWorld) -> list[Drawable]:
    """Every mesh of the twin (visual and collision), in body frames."""
    spec, out = world.spec, []
    preload(_mesh_files(world))
    for o in spec.objects:
        out += _object_drawables(spec, o, o.name)
    if spec.environment.table is not None:
        out += _object_drawables(spec, spec.environment.table, "table")
    if world.robot_id is not None and spec.robot is not None:
        path, _ = loadable_urdf(spec.resolve(spec.robot.urdf))
        for k, v in enumerate(visuals(path)):
            if v.kind == "mesh":
                m = _load(str(v.mesh), v.scale) if v.mesh is not None else None
            elif v.kind == "box":
                m = trimesh.creation.box(v.size)
            elif v.kind == "cylinder":
                m = trimesh.creation.cylinder(v.size[0], v.size[1], sections=16)
            else:
                m = trimesh.creation.icosphere(1, v.size[0])
            if m is None:
                continue
            rgba = v.rgba if v.rgba and v.rgba[3] > 0 else (0.85, 0.85, 0.88, 1.0)
            body = f"robot/{v.link}"
            m = display_mesh(m, DISPLAY_MAX_FACES)
            out.append(_drawable(f"{body}/visual{k}", body, m, rgba, v.origin))  # type: ignore[arg-type]
    return out


def _mesh_files(world: TwinWorld) -> list[str]:
    """Every mesh file `drawables` reads: objects' visuals and hulls, the robot's visuals."""
    spec = world.spec
    objs = [*spec.objects, *([spec.environment.table] if spec.environment.table else [])]
    files = [str(spec.resolve(m)) for o in objs for m in (o.shape.mesh, *o.shape.hulls) if m]
    if world.robot_id is not None and spec.robot is not None:
        path, _ = loadable_urdf(spec.resolve(spec.robot.urdf))
        files += [str(v.mesh) for v in visuals(path) if v.kind == "mesh" and v.mesh is not None]
    return files


def poses(world: TwinWorld) -> dict[str, np.ndarray]:
    """World pose (4x4) of every body `drawables` refers to."""
    out = {o.name: pose_to_matrix(world.object_pose(o.name)) for o in world.spec.objects}
    if world.spec.environment.table is not None:
        out["table"] = pose_to_matrix(world.spec.environment.table.pose)
    if world.robot_id is not None:
        cid, rid = world.cid, world.robot_id
        for name, i in world.link_index.items():
            if i == -1:
                p, q = pb.getBasePositionAndOrientation(rid, physicsClientId=cid)
                T = pose_to_matrix([*p, *q])
                info = pb.getDynamicsInfo(rid, -1, physicsClientId=cid)
                T = T @ np.linalg.inv(pose_to_matrix([*info[3], *info[4]]))
            else:
                st = pb.getLinkState(rid, i, computeForwardKinematics=True, physicsClientId=cid)
                T = pose_to_matrix([*st[4], *st[5]])  # link frame (URDF), not com
            out[f"robot/{name}"] = T
    return out
