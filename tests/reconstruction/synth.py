"""Analytic RGB-D frames: ray-cast a small trimesh scene (table + objects) with Open3D."""

from __future__ import annotations

import cv2
import numpy as np
import open3d as o3d
import trimesh
from numpy.typing import NDArray

from devices.frames import Intrinsics, RGBDFrame
from devices.poses import invert
from reconstruction.board import BOARD, BoardSpec, BoardView, board_image, view_rms_px

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
        look_at(
            np.asarray(center) + np.array([radius * np.cos(a), radius * np.sin(a), height]),
            np.asarray(center),
        )
        for a in angles
    ]


def paint_board(
    frame: RGBDFrame,
    T_camera_board: NDArray[np.float64],
    spec: BoardSpec = BOARD,
    occlusion_tol: float = 0.02,
) -> RGBDFrame:
    """A copy of `frame` with a flat board drawn at `T_camera_board` (a sticker: depth
    unchanged, pinhole: no distortion). Pixels whose measured depth is nearer than the board by more than
    `occlusion_tol` are occluders and keep their colour. For simulated calibration data."""
    intr = frame.intrinsics
    px_per_m = 4000.0
    img = board_image(spec, px_per_m)
    board_px_to_m = np.diag([1 / px_per_m, 1 / px_per_m, 1.0])
    # a plane's homography: board (x, y, 1) -> camera through columns x, y, t of T_camera_board
    H = intr.K @ T_camera_board[:3, [0, 1, 3]] @ board_px_to_m
    if T_camera_board[2, 3] <= 0:
        return frame
    w, h = intr.width, intr.height
    warped = cv2.warpPerspective(
        img, H, (w, h), flags=cv2.INTER_AREA, borderMode=cv2.BORDER_CONSTANT, borderValue=0
    )
    mask = (
        cv2.warpPerspective(
            np.full(img.shape, 255, np.uint8), H, (w, h), flags=cv2.INTER_NEAREST, borderValue=0
        )
        > 0
    )
    # depth of the board plane along each pixel ray
    n = T_camera_board[:3, 2]
    p0 = T_camera_board[:3, 3]
    u, v = np.meshgrid(np.arange(w), np.arange(h))
    rays = np.stack([(u - intr.cx) / intr.fx, (v - intr.cy) / intr.fy, np.ones_like(u, float)], -1)
    z_board = (p0 @ n) / (rays @ n)
    z_meas = frame.depth_m
    visible = mask & ((z_meas == 0) | (z_meas > z_board - occlusion_tol))
    color = frame.color.copy()
    shade = frame.color.mean(axis=2, keepdims=True) / 255.0 * 0.4 + 0.6  # keep scene light
    painted = (warped[..., None].astype(np.float32) * shade).clip(0, 255).astype(np.uint8)
    color[visible] = (
        painted[visible].repeat(1, axis=-1)
        if painted.shape[-1] == 3
        else np.repeat(painted[visible], 3, axis=-1)
    )
    return RGBDFrame(
        color,
        frame.depth,
        frame.depth_scale,
        frame.intrinsics,
        frame.timestamp,
        frame.index,
        frame.T_world_camera,
        dict(frame.meta),
    )


def analytic_board_view(
    T_camera_board: NDArray[np.float64],
    intr: Intrinsics,
    spec: BoardSpec = BOARD,
    noise_px: float = 0.0,
    rng: np.random.Generator | None = None,
    index: int = 0,
) -> BoardView:
    """A board view made without an image: every inner corner projected with OpenCV's
    distortion model, Gaussian pixel noise added, the pose solved by PnP as detection does."""
    board = cv2.aruco.CharucoBoard(
        spec.squares,
        spec.square,
        spec.marker,
        cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, spec.dictionary)),
    )
    object_points = np.asarray(board.getChessboardCorners(), np.float64).reshape(-1, 3)
    dist = np.asarray(intr.coeffs, float)
    rvec = cv2.Rodrigues(T_camera_board[:3, :3])[0]
    uv, _ = cv2.projectPoints(object_points, rvec, T_camera_board[:3, 3], intr.K, dist)
    corners = np.asarray(uv, np.float64).reshape(-1, 2)
    if noise_px > 0:
        corners = corners + (rng or np.random.default_rng(index)).normal(0, noise_px, corners.shape)
    ok, rvec, tvec = cv2.solvePnP(object_points, corners, intr.K, dist, flags=cv2.SOLVEPNP_IPPE)
    rvec, tvec = cv2.solvePnPRefineLM(object_points, corners, intr.K, dist, rvec, tvec)
    T = np.eye(4)
    T[:3, :3] = cv2.Rodrigues(rvec)[0]
    T[:3, 3] = tvec.ravel()
    view = BoardView(index, T, corners, object_points, 0.0)
    return BoardView(index, T, corners, object_points, view_rms_px(view, T, intr))
