"""Mass properties from meshes and primitives (per kilogram, so mass stays a parameter).

A mesh must be non-degenerate; its volume (for a density prior) is defined only when it is
watertight. A scan mesh that is open (seen from one side) can use its convex hull instead —
`open_mesh="hull"` — and the returned notes say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import trimesh

from twins.decompose import hull
from twins.errors import TwinError


@dataclass(frozen=True)
class MassProps:
    """volume [m^3], com [m] and inertia per kg [m^2] about the com, body frame."""

    volume: float
    com: tuple[float, float, float]
    inertia_per_kg: np.ndarray
    notes: tuple[str, ...] = ()


def check_mesh(mesh: trimesh.Trimesh, name: str) -> None:
    """TwinError naming `name` if the mesh is empty, non-finite, flat or zero-area."""
    if len(mesh.vertices) < 4 or len(mesh.faces) < 4:
        raise TwinError(
            f"{name}: mesh is degenerate ({len(mesh.vertices)} vertices, {len(mesh.faces)} faces)"
        )
    if not np.all(np.isfinite(mesh.vertices)):
        raise TwinError(f"{name}: mesh has NaN/inf vertex coordinates")
    ext = mesh.extents
    if np.min(ext) < 1e-4:
        raise TwinError(
            f"{name}: mesh is flat (extents {np.round(ext, 5).tolist()} m); "
            "a rigid body needs volume — wrong units or a single scan side?"
        )
    if mesh.area <= 0:
        raise TwinError(f"{name}: mesh has zero surface area")


def mesh_mass_props(mesh: trimesh.Trimesh, name: str, open_mesh: str = "error") -> MassProps:
    """Mass properties of a closed mesh. `open_mesh`: "error" refuses a non-watertight
    mesh; "hull" uses its convex hull and says so in `notes`."""
    check_mesh(mesh, name)
    notes: tuple[str, ...] = ()
    solid = mesh
    if not mesh.is_watertight:
        repaired = mesh.copy()
        repaired.merge_vertices()
        try:
            repaired.fill_holes()
        except ImportError:  # trimesh needs networkx for this; then no repair
            pass
        if repaired.is_watertight and repaired.volume > 0:
            solid = repaired
            notes = (f"{name}: mesh had small holes; filled before computing volume",)
        elif open_mesh == "hull":
            solid = hull(mesh.vertices)
            notes = (f"{name}: mesh is not watertight; volume and inertia from its convex hull",)
        else:
            raise TwinError(
                f"{name}: mesh is not watertight, so its volume is undefined; "
                "repair it, give a mass, or build with open_mesh='hull'"
            )
    if solid.volume < 0:
        solid = solid.copy()
        solid.invert()
    vol = float(solid.volume)
    if not vol > 1e-12:
        raise TwinError(f"{name}: mesh encloses no volume ({vol:g} m^3)")
    props = solid.mass_properties  # density 1
    Ib = np.asarray(props["inertia"], dtype=float) / float(props["mass"])
    com = tuple(float(x) for x in props["center_mass"])
    return MassProps(vol, com, (Ib + Ib.T) / 2, notes)  # type: ignore[arg-type]


def primitive_mass_props(kind: str, size: tuple[float, ...]) -> MassProps:
    """Uniform box (half extents), cylinder (radius, length along z) or sphere (radius)."""
    if kind == "box":
        a, b, c = (2 * s for s in size)
        vol = a * b * c
        Ib = np.diag([b * b + c * c, a * a + c * c, a * a + b * b]) / 12.0
    elif kind == "cylinder":
        r, h = size
        vol = np.pi * r * r * h
        Ib = np.diag([(3 * r * r + h * h) / 12, (3 * r * r + h * h) / 12, r * r / 2])
    elif kind == "sphere":
        r = size[0]
        vol = 4 / 3 * np.pi * r**3
        Ib = np.eye(3) * 0.4 * r * r
    else:
        raise TwinError(f"no mass properties for primitive '{kind}'")
    return MassProps(float(vol), (0.0, 0.0, 0.0), Ib)


def principal_axes(Ib: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(diag (3,), R (3x3) with columns the principal axes, right-handed)."""
    w, R = np.linalg.eigh((Ib + Ib.T) / 2)
    if np.linalg.det(R) < 0:
        R[:, 0] = -R[:, 0]
    return w, R
