"""Analytic RGB-D frames: ray-cast a small trimesh scene (table + objects) with Open3D."""

from __future__ import annotations

import numpy as np
import open3d as o3d
import trimesh

from devices.frames import Intrinsics, RGBDFrame
from devices.poses import invert

INTR = Intrinsics(640, 480, 615.0, 615.0, 320.0, 240.0)


def scene() -> dict[str, trimesh.Trimesh]:
    """Table top at z=0 (1.0 x 0.8 m), a box and a cylinder standing on it (world = base)."""
    table = trimesh.creation.box((1.0, 0.8, 0.04))
    table.apply_translation((0.5, 0.0, -0.02))
    box = trimesh.creation.box((0.08, 0.06, 0.10))
    box.apply_translation((0.45, 0.12, 0.05))
    cyl = trimesh.creation.cylinder(radius=0.035, height=0.12, sections=64)
    cyl.apply_translation((0.60, -0.12, 0.06))
    return {"table": table, "box": box, "cylinder": cyl}


def look_at(
    eye: np.ndarray, target: np.ndarray, up: tuple[float, float, float] = (0, 0, 1.0)
) -> np.ndarray:
    """T_world_camera of an OpenCV camera (x right, y down, z forward) at eye looking at target."""
    z = target - eye
    z = z / np.linalg.norm(z)
    x = np.cross(z, np.asarray(up, float))
    x = x / np.linalg.norm(x)
    y = np.cross(z, x)
    T = np.eye(4)
    T[:3, 0], T[:3, 1], T[:3, 2], T[:3, 3] = x, y, z, eye
    return T


def render(
    meshes: dict[str, trimesh.Trimesh],
    T_world_camera: np.ndarray,
    intr: Intrinsics = INTR,
    noise_m: float = 0.0,
    index: int = 0,
    seed: int = 0,
) -> RGBDFrame:
    """Depth (mm units) and flat per-mesh colour as seen by a pinhole camera."""
    rs = o3d.t.geometry.RaycastingScene()
    colors = {}
    palette = [(200, 180, 150), (200, 40, 40), (40, 90, 200), (40, 160, 60)]
    for i, (_name, m) in enumerate(meshes.items()):
        gid = rs.add_triangles(
            o3d.core.Tensor(m.vertices.astype(np.float32)),
            o3d.core.Tensor(m.faces.astype(np.uint32)),
        )
        colors[gid] = palette[i % len(palette)]
    rays = o3d.t.geometry.RaycastingScene.create_rays_pinhole(
        o3d.core.Tensor(intr.K), o3d.core.Tensor(invert(T_world_camera)), intr.width, intr.height
    )
    ans = rs.cast_rays(rays)
    t = ans["t_hit"].numpy()
    geo = ans["geometry_ids"].numpy()
    # t_hit is along the (unnormalised) ray; convert to z-depth
    d = rays.numpy()[..., 3:]
    dirs_cam = d @ T_world_camera[:3, :3]
    z = t * dirs_cam[..., 2]
    z[~np.isfinite(z)] = 0
    if noise_m > 0:
        rng = np.random.default_rng(seed + index)
        z = z + rng.normal(0, noise_m, z.shape) * (z > 0)
    depth = np.clip(np.round(z * 1000), 0, 65535).astype(np.uint16)
    color = np.zeros((intr.height, intr.width, 3), np.uint8)
    for gid, c in colors.items():
        color[geo == gid] = c
    return RGBDFrame(color, depth, 0.001, intr, index / 30.0, index, T_world_camera)


def orbit(
    n: int,
    radius: float = 0.6,
    height: float = 0.45,
    center: tuple[float, float, float] = (0.52, 0.0, 0.03),
    span: float = 0.9,
) -> list[np.ndarray]:
    """Camera poses on an arc around the objects, looking at `center`."""
    angles = np.linspace(-span, span, n) + np.pi
    return [
        look_at(center + np.array([radius * np.cos(a), radius * np.sin(a), height]), center)
        for a in angles
    ]
