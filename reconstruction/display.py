"""Meshes made light enough to draw (`display_mesh`): one home for every 3D view's copy.

Views draw in software OpenGL on most of our users' desktops (and always here): the Panda's
links have 12-22k triangles each, a scanned workspace 190k+, and a loaded laptop took ~0.5 s
to repaint the latter. Vertices are clustered on a grid (each cluster at its mean), collapsed
and repeated triangles dropped, winding kept: numpy only, tens of ms for 200k triangles.
"""

from __future__ import annotations

import numpy as np
import trimesh


def display_mesh(mesh: trimesh.Trimesh, max_faces: int) -> trimesh.Trimesh:
    """`mesh` with at most `max_faces` triangles for drawing (itself when it has no more):
    the grid cell starts where the surface area says the budget is met and grows by 25 %
    until it is."""
    v = np.asarray(mesh.vertices, float)
    f = np.asarray(mesh.faces, np.int64)
    if len(f) <= max_faces:
        return mesh
    cell = max(float(np.sqrt(2.0 * float(mesh.area) / max_faces)), 1e-6)
    lo = v.min(axis=0)
    while True:
        g = np.floor((v - lo) / cell).astype(np.int64)
        dims = g.max(axis=0) + 1
        key = (g[:, 0] * dims[1] + g[:, 1]) * dims[2] + g[:, 2]
        _, inv, n = np.unique(key, return_inverse=True, return_counts=True)
        inv = inv.ravel()
        verts = np.column_stack([np.bincount(inv, weights=v[:, k]) / n for k in range(3)])
        faces = inv[f]
        faces = faces[
            (faces[:, 0] != faces[:, 1])
            & (faces[:, 1] != faces[:, 2])
            & (faces[:, 0] != faces[:, 2])
        ]
        _, first = np.unique(np.sort(faces, axis=1), axis=0, return_index=True)
        faces = faces[np.sort(first)]
        if len(faces) <= max_faces:
            return trimesh.Trimesh(verts, faces, process=False)
        cell *= 1.25


def mesh_arrays(path: str) -> tuple[np.ndarray, np.ndarray] | str:
    """A mesh file's vertices and faces, or why it cannot be drawn (a worker process reads
    them: see `twins.view.preload`)."""
    try:
        m = trimesh.load(path, force="mesh", process=False)
    except (OSError, ValueError, KeyError, IndexError, TypeError, NotImplementedError) as exc:
        return f"cannot read this mesh for drawing ({type(exc).__name__}: {exc})"
    if not isinstance(m, trimesh.Trimesh) or len(m.faces) == 0:
        return "mesh has no faces; not drawn"
    return np.asarray(m.vertices, float), np.asarray(m.faces, np.int64)
