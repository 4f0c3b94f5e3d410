"""Scan (+ robot description) -> a twin folder: twin.json, meshes, hulls, URDF exports."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from devices.poses import pose_to_matrix
from resources import path as resource_path
from resources.jobs import Job, Progress, run_to_end
from twins.builder import TwinWorld
from twins.errors import TwinError
from twins.export import export_urdfs
from twins.make import assemble, mesh_object, robot_from_urdf, sim_params, table_box
from twins.scan_input import ScanInput, load_scan
from twins.spec import IDENTITY_POSE, TwinSpec
from twins.urdf import loadable_urdf

ProgressCallback = Callable[[float | None, str], None]
PANDA = "pybullet_data:franka_panda/panda.urdf"
PANDA_HOME = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785, 0.02, 0.02)


def resolve_robot_ref(ref: str) -> Path:
    """Absolute path of `pybullet_data:`, `resources:` or file references."""
    if ref.startswith("pybullet_data:"):
        import pybullet_data

        return Path(pybullet_data.getDataPath()) / ref.split(":", 1)[1]
    if ref.startswith("resources:"):
        return resource_path(*ref.split(":", 1)[1].split("/"))
    return Path(ref).expanduser().resolve()


def robot_into(
    folder: Path,
    ref: str,
    base_pose: Sequence[float] = IDENTITY_POSE,
    actuator: str = "servo",
    initial_joint_pos: Sequence[float] = (),
    time_step: float = 1 / 240,
) -> tuple[Any, list[Any], list[str]]:
    """A robot spec for `ref`. Bundled descriptions stay references; a user file is copied
    into `folder/robot/` (repaired if needed) so the twin folder is self-contained."""
    src = resolve_robot_ref(ref)
    if ref.startswith(("pybullet_data:", "resources:")):
        path, spec_ref = src, ref
        _, notes = loadable_urdf(src)
    else:
        out = folder / "robot"
        loadable, notes = loadable_urdf(src, out)
        if loadable == src:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / src.name)
            loadable = out / src.name
            notes.append(f"{src.name}: copied into the twin; meshes resolved from {src.parent}")
            _, _ = loadable_urdf(loadable, out)
        path, spec_ref = loadable, str(loadable.relative_to(folder))
    robot, params = robot_from_urdf(
        spec_ref,
        path,
        base_pose,
        actuator,
        initial_joint_pos=initial_joint_pos,
        notes=notes,
        time_step=time_step,
    )
    return robot, params, list(robot.notes)  # the loader's notes and the spec's own


def support_in_object(
    plane: Sequence[float] | None, pose: Sequence[float] | np.ndarray
) -> tuple[float, float, float, float] | None:
    """The scan's table plane (a, b, c, d in the base frame) in an object's frame (`pose`:
    the object frame in the base frame), for fitting primitives to what the scan observed
    (twins/primitives.py ignores it when the object does not rest on it); None without one.
    `pose` may also be the 4x4 matrix T_base_object."""
    if plane is None:
        return None
    T = np.asarray(pose, float)
    T = T if T.shape == (4, 4) else pose_to_matrix(T)
    n = np.asarray(plane[:3], float)
    a, b, c = (float(v) for v in T[:3, :3].T @ n)
    return a, b, c, float(n @ T[:3, 3] + float(plane[3]))


def table_from_plane(scan: ScanInput) -> Any:
    if scan.table_plane is None:
        return None
    a, b, c, d = scan.table_plane
    n = np.array([a, b, c], float)
    if np.linalg.norm(n) < 1e-9:
        raise TwinError("scan table plane has a zero normal")
    if abs(n[2]) < 0.9 * np.linalg.norm(n):
        raise TwinError(
            f"scan table plane normal {n.round(3).tolist()} is far from vertical; "
            "is the camera-to-robot calibration applied?"
        )
    n = n / np.linalg.norm(n)
    x0, x1, y0, y1 = scan.table_extent
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    cz = -(d + n[0] * cx + n[1] * cy) / n[2]
    obj, params = table_box(((x1 - x0) / 2, (y1 - y0) / 2, 0.02), (cx, cy, cz))
    return obj, params


def build_twin_steps(
    scan: Any,
    folder: Path,
    robot: str | None = PANDA,
    base_pose: Sequence[float] = IDENTITY_POSE,
    name: str = "twin",
    density: float = 500.0,
    meta: dict[str, Any] | None = None,
) -> Job[TwinSpec]:
    """Build a twin into `folder` from a scan (ScanResult, scan folder or ScanInput) and a
    robot URDF reference (None: no robot). Yields Progress; returns the spec,
    already saved as `folder/twin.json` with URDF exports in `folder/urdf/`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    yield Progress(0.0, "reading scan")
    sc = load_scan(scan)
    notes = list(sc.notes)
    objects = []
    for i, o in enumerate(sc.objects):
        frac = 0.05 + 0.6 * i / max(len(sc.objects), 1)
        yield Progress(frac, f"object '{o.name}': inertia, collision")
        obj, params, n = mesh_object(
            o.name,
            o.mesh,
            tuple(o.pose),
            folder,
            density=density,
            source=sc.source,
            rgba=o.rgba,
            support=support_in_object(sc.table_plane, o.pose),
            observed=o.observed,
        )
        objects.append((obj, params))
        notes += n
    rob = None
    if robot:
        yield Progress(0.7, f"robot {robot}")
        q0 = PANDA_HOME if robot == PANDA else ()
        r, rp, rn = robot_into(folder, robot, base_pose, initial_joint_pos=q0)
        rob = (r, rp)
        notes += rn
    table = table_from_plane(sc)
    spec = assemble(
        name,
        rob,
        objects,
        table,
        ground=table is None,
        sim=sim_params(),
        base_dir=folder,
        meta={**(meta or {}), "scan": sc.source, "notes": notes},
    )
    yield Progress(0.85, "checking the twin builds and steps")
    with TwinWorld(spec) as world:
        world.step(10)
    yield Progress(0.92, "exporting URDFs")
    export_urdfs(spec, folder / "urdf")
    spec.save(folder)
    done = f"twin '{name}': {len(objects)} objects" + (f", robot {robot}" if robot else "")
    yield Progress(1.0, done)
    return spec


def build_twin(
    scan: Any,
    folder: Path,
    robot: str | None = PANDA,
    base_pose: Sequence[float] = IDENTITY_POSE,
    name: str = "twin",
    density: float = 500.0,
    meta: dict[str, Any] | None = None,
    progress: ProgressCallback | None = None,
) -> TwinSpec:
    """`build_twin_steps` run to the end (progress callback optional)."""
    gen = build_twin_steps(scan, folder, robot, base_pose, name, density, meta)
    return run_to_end(gen, None if progress is None else lambda p: progress(p.fraction, p.message))
