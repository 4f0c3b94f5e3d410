"""URDF export: one file per object, and a scene snapshot (static environment plus every
object fixed at its current pose, for viewers such as RViz)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from resources import atomic
from twins.spec import ObjectSpec, TwinSpec
from twins.urdf import link_xml


def _mass(spec: TwinSpec, o: ObjectSpec, prefix: str, values: Mapping[str, float]) -> float:
    if o.static:
        return 0.0
    if o.mass_from == "mass":
        return float(values[f"{prefix}.mass"])
    return float(values[f"{prefix}.density"] * o.volume)


def _rel(spec: TwinSpec, ref: str | None, out: Path) -> str | None:
    if ref is None:
        return None
    p = spec.resolve(ref)
    try:
        return str(Path("..") / Path(p).resolve().relative_to(out.resolve().parent))
    except ValueError:
        return str(p)


def object_link(
    spec: TwinSpec,
    o: ObjectSpec,
    prefix: str,
    values: Mapping[str, float],
    out: Path,
    name: str | None = None,
) -> str:
    m = _mass(spec, o, prefix, values)
    Ib = np.asarray(o.inertia_per_kg).reshape(3, 3) * max(m, 0.0)
    mesh = _rel(spec, o.shape.mesh, out)
    hulls = tuple(_rel(spec, h, out) or "" for h in o.shape.hulls)
    return link_xml(
        name or o.name,
        o.shape.kind,
        o.shape.size,
        mesh,
        hulls,
        m,
        o.com,
        Ib,
        o.rgba,
        o.shape.collision_pose,
    )


def export_urdfs(
    spec: TwinSpec, out: Path, values: Mapping[str, float] | None = None
) -> list[Path]:
    """Write `<out>/<object>.urdf` per object and `<out>/scene.urdf`; returns the paths."""
    vals = spec.params.validate(values)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for o in spec.objects:
        xml = f'<?xml version="1.0"?><robot name="{o.name}">{object_link(spec, o, o.prefix, vals, out)}</robot>\n'
        atomic.write_text(out / f"{o.name}.urdf", xml)
        written.append(out / f"{o.name}.urdf")
    parts = ['<link name="world"/>']
    bodies = [(o, o.prefix) for o in spec.objects]
    if spec.environment.table is not None:
        bodies.append((spec.environment.table, "env.table"))
    for o, prefix in bodies:
        parts.append(object_link(spec, o, prefix, vals, out))
        xyz = " ".join(f"{x:.9g}" for x in o.pose[:3])
        rpy = " ".join(f"{x:.9g}" for x in Rotation.from_quat(o.pose[3:]).as_euler("xyz"))
        parts.append(
            f'<joint name="world_{o.name}" type="fixed"><parent link="world"/>'
            f'<child link="{o.name}"/><origin xyz="{xyz}" rpy="{rpy}"/></joint>'
        )
    atomic.write_text(
        out / "scene.urdf",
        f'<?xml version="1.0"?><robot name="{spec.name}_scene">{"".join(parts)}</robot>\n',
    )
    written.append(out / "scene.urdf")
    return written
