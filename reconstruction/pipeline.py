"""One scan, frame by frame: poses in, TSDF growing, objects out (`ScanSession`).

Poses come from the caller — robot kinematics x hand-eye for a wrist camera, a calibrated
`T_base_camera` for a fixed one — or from RGB-D odometry (`track=True`) for a handheld
recording, where frames that fail to track are skipped and reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.frames import RGBDFrame
from reconstruction.errors import ReconstructionError
from reconstruction.objects import extract_object
from reconstruction.scan_result import ScannedObject, ScanResult
from reconstruction.segment import cluster_objects, fit_table_plane
from reconstruction.tsdf import TSDFIntegrator, TSDFSettings

Box = tuple[NDArray[np.float64], NDArray[np.float64]]


@dataclass
class SegmentSettings:
    seed: int = 0
    up: tuple[float, float, float] | None = (0.0, 0.0, 1.0)  # None for handheld scans
    min_height: float = 0.008
    max_height: float = 0.3
    eps: float = 0.012
    triangle_budget: int = 4000
    exclude: list[Box] = field(default_factory=list)  # e.g. the robot's base


@dataclass
class Preview:
    points: NDArray[np.float32]
    colors: NDArray[np.uint8]
    frames: int


class ScanSession:
    """Accumulates frames into a TSDF; `finish()` segments and returns a ScanResult."""

    def __init__(self, tsdf: TSDFSettings | None = None, track: bool = False) -> None:
        self.tsdf = TSDFIntegrator(tsdf)
        self.track = track
        self.skipped: dict[int, str] = {}  # frame index -> why
        self.integrate_s: list[float] = []
        self._odo: Any = None
        self.last_pose: NDArray[np.float64] | None = None
        self.capture: dict[str, Any] = {}

    def add(self, frame: RGBDFrame, T_base_camera: NDArray[np.float64] | None = None) -> bool:
        """Integrate one frame. Without a pose (and with `track`), RGB-D odometry supplies one.
        Returns False if the frame was skipped (reason in `skipped`)."""
        if not self.capture:
            self.capture = {
                "intrinsics": frame.intrinsics.to_dict(),
                "depth_scale": frame.depth_scale,
                **frame.meta.get("capture", {}),
            }
        nz = frame.depth[frame.depth > 0]
        if nz.size == 0:
            self.skipped[frame.index] = "all-zero depth"
            return False
        med = float(np.median(nz[:: max(1, nz.size // 5000)])) * frame.depth_scale
        st = self.tsdf.settings
        if not st.depth_min <= med <= 3 * st.depth_max:
            self.skipped[frame.index] = (
                f"median depth {med:.3f} m is implausible (depth scale "
                f"{frame.depth_scale} m/unit wrong?)"
            )
            return False
        if T_base_camera is None:
            if not self.track:
                raise ReconstructionError(
                    f"frame {frame.index}: no camera pose (calibrate the "
                    "camera, connect the robot, or scan handheld)"
                )
            if self._odo is None:
                from reconstruction.odometry import Odometry

                self._odo = Odometry()
            T_base_camera, why = self._odo.track(frame)
            if T_base_camera is None:
                self.skipped[frame.index] = why
                return False
        t0 = time.perf_counter()
        ok = self.tsdf.integrate(frame, np.asarray(T_base_camera, float))
        self.integrate_s.append(time.perf_counter() - t0)
        if not ok:
            self.skipped[frame.index] = "no depth in range"
            return False
        self.last_pose = np.asarray(T_base_camera, float)
        return True

    def preview(self, max_points: int = 60000) -> Preview:
        p, c = self.tsdf.points()
        if len(p) > max_points:
            idx = np.random.default_rng(0).choice(len(p), max_points, replace=False)
            p, c = p[idx], c[idx]
        return Preview(p, c, self.tsdf.frames_integrated)

    def finish(
        self,
        seg: SegmentSettings | None = None,
        T_base_camera: NDArray[np.float64] | None = None,
        calibration: dict[str, Any] | None = None,
        progress: Callable[[float, str], None] | None = None,
    ) -> ScanResult:
        """Mesh, table plane, objects. Keeps what it has: no plane -> no objects, a warning."""
        seg = seg or SegmentSettings()
        warnings: list[str] = []
        if progress:
            progress(0.0, "extracting mesh")
        mesh = self.tsdf.mesh()
        quality: dict[str, Any] = {
            "frames_integrated": self.tsdf.frames_integrated,
            "frames_skipped": {str(k): v for k, v in sorted(self.skipped.items())},
            "integrate_ms_mean": float(np.mean(self.integrate_s) * 1000)
            if self.integrate_s
            else None,
            "mesh_vertices": int(len(mesh.vertices)),
            "mesh_triangles": int(len(mesh.faces)),
            "voxel_size_m": self.tsdf.settings.voxel_size,
        }
        if self.skipped:
            warnings.append(
                f"{len(self.skipped)} frames skipped: "
                + ", ".join(f"{k} ({v})" for k, v in list(sorted(self.skipped.items()))[:8])
            )
        if len(mesh.faces) == 0:
            warnings.append(
                "the fused mesh is empty: check the depth scale and that the "
                "surfaces are within the depth range"
            )
            return ScanResult(
                mesh,
                None,
                (),
                T_base_camera,
                calibration or {},
                quality,
                tuple(warnings),
                self.capture,
            )
        try:
            plane, frac = fit_table_plane(
                mesh.vertices, seed=seg.seed, up=None if seg.up is None else np.asarray(seg.up)
            )
        except ReconstructionError as exc:
            warnings.append(f"no table found: {exc}")
            return ScanResult(
                mesh,
                None,
                (),
                T_base_camera,
                calibration or {},
                quality,
                tuple(warnings),
                self.capture,
            )
        quality["table_inlier_fraction"] = frac
        from reconstruction.calibration import workspace_frame

        calibration = {
            **(calibration or {}),
            "T_base_table": workspace_frame(
                np.array(plane.to_list()), mesh.vertices.mean(axis=0)
            ).tolist(),
        }
        if progress:
            progress(0.4, "clustering objects")
        colors = (
            mesh.visual.vertex_colors[:, :3]
            if mesh.visual.kind == "vertex"
            else np.full((len(mesh.vertices), 3), 180, np.uint8)
        )
        clusters = cluster_objects(
            mesh.vertices,
            colors,
            plane,
            seg.min_height,
            seg.max_height,
            eps=seg.eps,
            exclude=seg.exclude,
        )
        objects = []
        for i, cl in enumerate(clusters):
            if progress:
                progress(0.5 + 0.5 * i / max(len(clusters), 1), f"cleaning object {i + 1}")
            om = extract_object(mesh, cl, plane, seg.triangle_budget, self.tsdf.settings.voxel_size)
            name = f"object_{i + 1}"
            col = tuple(int(v) for v in np.median(cl.colors, axis=0))
            stats = {
                "points": int(len(cl.points)),
                "holes_filled": om.holes_filled,
                "closing": om.method,
                "triangles_before": om.triangles_before,
                "volume_m3": float(om.mesh.volume) if om.watertight else None,
                "extent_m": [float(v) for v in om.mesh.extents],
                "warnings": om.warnings,
            }
            warnings.extend(f"{name}: {w}" for w in om.warnings)
            objects.append(
                ScannedObject(name, om.mesh, om.T_world_object, col, om.watertight, stats)
            )
        if not objects:
            warnings.append("no objects found on the table")
        return ScanResult(
            mesh,
            np.array(plane.to_list()),
            tuple(objects),
            T_base_camera,
            calibration or {},
            quality,
            tuple(warnings),
            self.capture,
        )
