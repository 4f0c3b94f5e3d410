"""TSDF fusion with Open3D's tensor `VoxelBlockGrid` (DESIGN §9: never the legacy
`ScalableTSDFVolume`, which extracts an empty mesh in Open3D 0.20).

`TSDFIntegrator.integrate(frame, T_world_camera)` fuses one RGBDFrame; `mesh()` extracts a
trimesh in the world frame, `points()` a cheap coloured point cloud for live previews.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import open3d as o3d
import open3d.core as o3c
import trimesh
from numpy.typing import NDArray

from devices.frames import RGBDFrame
from devices.poses import invert
from reconstruction.errors import ReconstructionError


@dataclass(frozen=True)
class TSDFSettings:
    voxel_size: float = 0.004        # m
    block_resolution: int = 8        # 8^3 voxels per block: fewer idle voxels than 16^3
    block_count: int = 4000          # initial capacity; the hash map grows when full
    depth_min: float = 0.1           # m, nearer depth is ignored
    depth_max: float = 1.1           # m, farther depth is ignored (the floor, walls)
    trunc_voxels: float = 4.0        # truncation distance in voxels
    weight_threshold: float = 2.0    # frames a voxel needs before it appears in the mesh


class TSDFIntegrator:
    """A growing TSDF volume in the world frame (the frame of the poses given to it)."""

    def __init__(self, settings: TSDFSettings | None = None) -> None:
        self.settings = s = settings or TSDFSettings()
        self.device = o3c.Device("CPU:0")
        self.vbg = o3d.t.geometry.VoxelBlockGrid(
            attr_names=("tsdf", "weight", "color"),
            attr_dtypes=(o3c.float32, o3c.uint16, o3c.uint16),
            attr_channels=((1,), (1,), (3,)),
            voxel_size=s.voxel_size, block_resolution=s.block_resolution,
            block_count=s.block_count, device=self.device)
        self.frames_integrated = 0
        self.empty_frames: list[int] = []

    def integrate(self, frame: RGBDFrame, T_world_camera: NDArray[np.float64]) -> bool:
        """Fuse one frame seen from `T_world_camera` (4x4). Returns False (and remembers the
        frame index) when the frame has no valid depth in range; raises on bad input."""
        s = self.settings
        if not np.isfinite(T_world_camera).all():
            raise ReconstructionError(f"frame {frame.index}: camera pose has NaN/inf")
        depth = frame.depth
        if depth.shape != frame.color.shape[:2]:
            raise ReconstructionError(
                f"frame {frame.index}: depth {depth.shape} and colour {frame.color.shape[:2]} "
                "differ in size; align depth to colour first")
        scale = 1.0 / frame.depth_scale
        dmin_units = s.depth_min * scale
        valid = (depth > dmin_units) & (depth < s.depth_max * scale)
        if valid.sum() < 0.001 * depth.size:
            self.empty_frames.append(frame.index)
            return False
        if dmin_units > 1:
            depth = np.where(depth > dmin_units, depth, 0).astype(np.uint16)
        d_img = o3d.t.geometry.Image(o3c.Tensor(np.ascontiguousarray(depth)))
        c_img = o3d.t.geometry.Image(o3c.Tensor(np.ascontiguousarray(frame.color)))
        K = o3c.Tensor(frame.intrinsics.K, o3c.float64)
        extr = o3c.Tensor(invert(T_world_camera), o3c.float64)
        try:
            coords = self.vbg.compute_unique_block_coordinates(
                d_img, K, extr, depth_scale=scale, depth_max=s.depth_max,
                trunc_voxel_multiplier=float(s.trunc_voxels))
            self.vbg.integrate(coords, d_img, c_img, K, K, extr, depth_scale=scale,
                               depth_max=s.depth_max, trunc_voxel_multiplier=float(s.trunc_voxels))
        except RuntimeError as exc:
            if "No block is touched" in str(exc):
                self.empty_frames.append(frame.index)
                return False
            raise ReconstructionError(
                f"frame {frame.index}: TSDF integration failed ({exc}); the volume may be full "
                f"(block_count={s.block_count}) — use a larger voxel size or fewer frames") from exc
        self.frames_integrated += 1
        return True

    def mesh(self) -> trimesh.Trimesh:
        """The fused surface as a trimesh (vertex colours uint8); empty if nothing is fused."""
        if self.frames_integrated == 0:
            return trimesh.Trimesh(np.zeros((0, 3)), np.zeros((0, 3), dtype=np.int64))
        m = self.vbg.extract_triangle_mesh(weight_threshold=self._weight_threshold())
        v = m.vertex.positions.numpy().astype(np.float64) if "positions" in m.vertex else \
            np.zeros((0, 3))
        if len(v) == 0 or "indices" not in m.triangle:
            return trimesh.Trimesh(np.zeros((0, 3)), np.zeros((0, 3), dtype=np.int64))
        f = m.triangle.indices.numpy().astype(np.int64)
        colors = None
        if "colors" in m.vertex:
            c = m.vertex.colors.numpy()
            c = c * 255.0 if c.max() <= 1.0 + 1e-6 else c
            colors = np.clip(c, 0, 255).astype(np.uint8)
        return trimesh.Trimesh(v, f, vertex_colors=colors, process=False)

    def points(self) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
        """Surface points (N, 3) float32 and colours (N, 3) uint8 — cheap, for previews."""
        if self.frames_integrated == 0:
            return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8)
        pcd = self.vbg.extract_point_cloud(weight_threshold=self._weight_threshold())
        if "positions" not in pcd.point or len(pcd.point.positions) == 0:
            return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8)
        p = pcd.point.positions.numpy().astype(np.float32)
        c = pcd.point.colors.numpy() if "colors" in pcd.point else np.full_like(p, 180.0)
        c = c * 255.0 if c.size and c.max() <= 1.0 + 1e-6 else c
        return p, np.clip(c, 0, 255).astype(np.uint8)

    def _weight_threshold(self) -> float:
        return float(min(self.settings.weight_threshold, max(self.frames_integrated, 1)))
