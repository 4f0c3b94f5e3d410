"""Recognise meshes that are boxes or cylinders, so the twin collides with the exact
primitive (several times cheaper to simulate than hull sets, and no faceting)."""

from __future__ import annotations

import numpy as np
import trimesh

from devices.poses import matrix_to_pose


def fit_primitive(
    mesh: trimesh.Trimesh, tol: float = 0.03
) -> tuple[str, tuple[float, ...], np.ndarray] | None:
    """("box", half extents, pose) or ("cylinder", (radius, length), pose) when the closed
    mesh's volume matches the primitive within `tol`; pose of the primitive in the mesh
    frame (xyz + quat xyzw). None otherwise (or for open meshes)."""
    if not mesh.is_watertight or mesh.volume <= 0:
        return None
    vol = float(mesh.volume)
    T, ext = trimesh.bounds.oriented_bounds(mesh)  # T maps mesh -> box frame
    T_mesh_box = np.linalg.inv(T)
    ext = np.asarray(ext, float)
    if abs(np.prod(ext) - vol) / vol < tol:
        return "box", tuple(float(e / 2) for e in ext), matrix_to_pose(T_mesh_box)
    v = trimesh.transform_points(mesh.vertices, T)
    best = None
    for ax in range(3):
        others = [i for i in range(3) if i != ax]
        r = float(np.max(np.linalg.norm(v[:, others], axis=1)))
        cvol = np.pi * r * r * ext[ax]
        err = abs(cvol - vol) / vol
        if err < tol and (best is None or err < best[0]):
            best = (err, ax, r)
    if best is None:
        return None
    _, ax, r = best
    R = np.eye(4)
    if ax != 2:  # cylinder axis is z in PyBullet: rotate z onto the chosen axis
        z = np.zeros(3)
        z[ax] = 1.0
        x = np.zeros(3)
        x[[i for i in range(3) if i != ax][0]] = 1.0
        R[:3, :3] = np.column_stack([x, np.cross(z, x), z])
    return "cylinder", (r, float(ext[ax])), matrix_to_pose(T_mesh_box @ R)
