"""Frame-to-frame RGB-D odometry (Open3D tensor pipeline) for handheld scans.

The first frame defines the world. A frame that fails to track (too little overlap, no
depth, the solver diverging) is skipped and reported; the next one is tracked against the
last good frame.
"""

from __future__ import annotations

import numpy as np
import open3d as o3d
import open3d.core as o3c
from numpy.typing import NDArray

from devices.frames import RGBDFrame


class Odometry:
    def __init__(
        self, depth_max: float = 1.5, min_fitness: float = 0.3, max_step_m: float = 0.15
    ) -> None:
        self.depth_max, self.min_fitness, self.max_step_m = depth_max, min_fitness, max_step_m
        self._prev: o3d.t.geometry.RGBDImage | None = None
        self._pose = np.eye(4)
        self._motion = np.eye(4)  # last frame-to-frame motion: the next initial guess
        self._crit = [o3d.t.pipelines.odometry.OdometryConvergenceCriteria(i) for i in (30, 20, 10)]

    def _rgbd(self, f: RGBDFrame) -> o3d.t.geometry.RGBDImage:
        color = o3d.t.geometry.Image(o3c.Tensor(np.ascontiguousarray(f.color)))
        depth = o3d.t.geometry.Image(o3c.Tensor(np.ascontiguousarray(f.depth)))
        return o3d.t.geometry.RGBDImage(color.to(o3c.float32, scale=1.0 / 255.0), depth)

    def track(self, f: RGBDFrame) -> tuple[NDArray[np.float64] | None, str]:
        """T_world_camera of this frame, or (None, reason) if tracking failed."""
        cur = self._rgbd(f)
        if self._prev is None:
            self._prev = cur
            return self._pose.copy(), ""
        K = o3c.Tensor(f.intrinsics.K, o3c.float64)
        try:
            res = o3d.t.pipelines.odometry.rgbd_odometry_multi_scale(
                cur,
                self._prev,
                K,
                o3c.Tensor(self._motion),
                1.0 / f.depth_scale,
                self.depth_max,
                self._crit,
                o3d.t.pipelines.odometry.Method.Hybrid,
            )
        except RuntimeError as exc:
            return None, f"tracking failed ({exc})"
        T = res.transformation.numpy()
        if not np.isfinite(T).all() or res.fitness < self.min_fitness:
            return None, f"tracking failed (fitness {res.fitness:.2f})"
        if np.linalg.norm(T[:3, 3]) > self.max_step_m:
            return None, f"tracking failed (jump of {np.linalg.norm(T[:3, 3]):.2f} m)"
        self._pose = self._pose @ T
        self._motion = T
        self._prev = cur
        return self._pose.copy(), ""
