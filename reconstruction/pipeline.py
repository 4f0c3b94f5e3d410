"""One scan, frame by frame: poses in, TSDF growing, objects out (`ScanSession`).

Poses come from the caller — robot kinematics x hand-eye for a wrist camera, a calibrated
`T_base_camera` for a fixed one — or, for a handheld scan (`track=True`), from frame-to-model
tracking against the growing TSDF (reconstruction/tracking.py), where frames that fail the
tracking gate are skipped and reported. With loop closure on, a handheld scan ends with a
keyframe pose graph and, when that moved the path, the frames are fused again along it. Its
support plane follows reconstruction/support.py (never a ceiling).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.frames import RGBDFrame
from reconstruction.calibration import workspace_frame
from reconstruction.errors import ReconstructionError, clean_message
from reconstruction.objects import extract_object, vertex_colors
from reconstruction.scan_result import CameraPath, ScannedObject, ScanResult, display_copy
from reconstruction.segment import Cluster, Plane, cluster_objects, fit_table_plane
from reconstruction.stream import DeferredFusion
from reconstruction.support import choose_support_plane, up_direction
from reconstruction.tracking import (
    FrameTrack,
    HandheldTracker,
    TrackingSettings,
    choose_depth_range,
)
from reconstruction.tsdf import TSDFIntegrator, TSDFSettings

Box = tuple[NDArray[np.float64], NDArray[np.float64]]
PREVIEW_POINTS = 25_000  # a live preview holds at most this many fused points (drawn 10x a second)


@dataclass
class SegmentSettings:
    seed: int = 0
    up: tuple[float, float, float] | None = (0.0, 0.0, 1.0)  # None for handheld scans
    min_height: float = 0.008
    max_height: float = 0.3
    eps: float = 0.012
    triangle_budget: int = 4000
    exclude: list[Box] = field(default_factory=list)  # e.g. the robot's base
    # handheld scans: "auto" (reconstruction/support.py rule), "none", a candidate number
    # ("2") or an explicit plane "a,b,c,d" (n.p + d = 0, world frame = first camera)
    support_plane: str = "auto"


def preview_subset(
    points: NDArray[np.float32], colors: NDArray[np.uint8], max_points: int = PREVIEW_POINTS
) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
    """Every k-th point (and colour), at most `max_points`: a window draws the cloud on its
    GUI thread, and a whole workspace's surface (100k+ points) took a software renderer
    hundreds of milliseconds per repaint while a scan ran."""
    if len(points) <= max_points:
        return points, colors
    k = -(-len(points) // max_points)
    return points[::k], colors[::k]


@dataclass
class Preview:
    points: NDArray[np.float32]
    colors: NDArray[np.uint8]
    frames: int


class ScanSession:
    """Accumulates frames into a TSDF; `finish()` segments and returns a ScanResult."""

    def __init__(
        self,
        tsdf: TSDFSettings | None = None,
        track: bool = False,
        tracking: Any = None,
        depth_range: tuple[float, float] | str | None = None,
        keep_frames_mb: float = 1500.0,
        fuse_max_hz: float = 15.0,
        loop_closure: bool = False,
    ) -> None:
        """`track`: handheld (poses from tracking; `tracking`: TrackingSettings, or None for
        defaults scaled to the depth range). `depth_range`: None keeps the TSDF's, "auto"
        chooses it from the first frame, (min, max) in m sets it. Tracked frames are fused at
        up to `fuse_max_hz` (keyframes always: at video rate neighbours see the same surfaces).
        `loop_closure` (reconstruction/pose_graph.py): frames are kept to fuse again up to
        `keep_frames_mb` (then only keyframes)."""
        self.tsdf = TSDFIntegrator(tsdf)
        self.track = track
        self.skipped: dict[int, str] = {}  # frame index -> why
        self.integrate_s: list[float] = []
        self.track_s: list[float] = []
        self._tracker: Any = None
        self._tracking = tracking
        self._loop_closure = loop_closure
        self._depth_range = depth_range
        self._keep_bytes = keep_frames_mb * 1e6
        self._fuse_dt = 1.0 / fuse_max_hz if fuse_max_hz > 0 else 0.0
        self._last_fused_t: float | None = None
        self._kept: dict[int, RGBDFrame] = {}
        self._kept_bytes = 0
        self.frames_seen = 0
        self.last_pose: NDArray[np.float64] | None = None
        self.capture: dict[str, Any] = {}
        self.gravity_sum = np.zeros(3)  # world-frame accelerometer sum (up), when frames have it
        self._first: tuple[RGBDFrame, NDArray[np.float64]] | None = None
        self._ray_offset: NDArray[np.float64] | None = None
        # handheld: a tracked frame is fused on a worker while the next one is registered
        self._fusion = DeferredFusion()

    def flush(self) -> None:
        """Finish the fusion still held or running: `tsdf` then holds every fused frame."""
        self._fusion.wait()

    def prepare_frame(self, frame: RGBDFrame) -> None:
        """Build a frame's tracking view ahead of `add` (a no-op before the first frame)."""
        if self.track and self._tracker is not None:
            self._tracker.prepare(frame)

    def add(self, frame: RGBDFrame, T_base_camera: NDArray[np.float64] | None = None) -> bool:
        """Integrate one frame. Without a pose (and with `track`), RGB-D odometry supplies one.
        Returns False if the frame was skipped (reason in `skipped`)."""
        if not self.capture:
            self.capture = {
                "intrinsics": frame.intrinsics.to_dict(),
                "depth_scale": frame.depth_scale,
                **frame.meta.get("capture", {}),
            }
            self._set_depth_range(frame)
        self.frames_seen += 1
        nz = frame.depth[frame.depth > 0]
        if nz.size == 0:
            self.skipped[frame.index] = "all-zero depth"
            self._note_untracked(frame, "all-zero depth")
            return False
        med = float(np.median(nz[:: max(1, nz.size // 5000)])) * frame.depth_scale
        st = self.tsdf.settings
        if not st.depth_min <= med <= 3 * st.depth_max:
            self.skipped[frame.index] = (
                f"median depth {med:.3f} m is implausible (depth scale "
                f"{frame.depth_scale} m/unit wrong?)"
            )
            self._note_untracked(frame, self.skipped[frame.index])
            return False
        if T_base_camera is None:
            if not self.track:
                raise ReconstructionError(
                    f"frame {frame.index}: no camera pose (calibrate the "
                    "camera, connect the robot, or scan handheld)"
                )
            t0 = time.perf_counter()
            ft = self.tracker.track(frame, self._model_view)
            self.track_s.append(time.perf_counter() - t0)
            self._fusion.start()  # the previous frame's fusion, if no raycast started it
            if ft.pose is None:
                self.skipped[frame.index] = ft.reason
                return False
            T_base_camera = ft.pose
            keyframe = self._is_keyframe(ft)
            self._keep(frame, keyframe)
            accel = frame.meta.get("accel")
            if accel is not None:
                self.gravity_sum += T_base_camera[:3, :3] @ np.asarray(accel, float)
            last = self._last_fused_t
            # 2 % slack: timestamps of a 30 fps stream jitter around 1/15 s for every other frame
            if (
                not keyframe
                and last is not None
                and 0 <= frame.timestamp - last < 0.98 * self._fuse_dt
            ):
                self.last_pose = np.asarray(T_base_camera, float)
                return True
            # fused on the worker from the next raycast on (or at once, into an empty model)
            pose = np.asarray(T_base_camera, float)
            self._fusion.defer(lambda: self._fuse(frame, pose))
            self.last_pose = pose
            self._last_fused_t = frame.timestamp
            return True
        t0 = time.perf_counter()
        ok = self.tsdf.integrate(frame, np.asarray(T_base_camera, float))
        self.integrate_s.append(time.perf_counter() - t0)
        if not ok:
            self.skipped[frame.index] = "no depth in range"
            return False
        self.last_pose = np.asarray(T_base_camera, float)
        self._last_fused_t = frame.timestamp
        return True

    def _fuse(self, frame: RGBDFrame, pose: NDArray[np.float64]) -> None:
        """A tracked frame's fusion (on the fusion worker)."""
        t0 = time.perf_counter()
        ok = self.tsdf.integrate(frame, pose)
        self.integrate_s.append(time.perf_counter() - t0)
        if not ok:
            self.skipped[frame.index] = "no depth in range"
        elif self._first is None:
            self._first = (frame, pose)

    # --- handheld tracking ---------------------------------------------------------------------
    @property
    def tracker(self) -> Any:
        """The HandheldTracker of a handheld scan (created at the first frame)."""
        if self._tracker is None:
            st = self.tsdf.settings
            ts = self._tracking or TrackingSettings(
                voxel=float(np.clip(st.depth_max / 300, 0.005, 0.015))
            )
            lc = ts.loop_closure or self._loop_closure
            ts = replace(ts, depth_min=st.depth_min, depth_max=st.depth_max, loop_closure=lc)
            self._tracker = HandheldTracker(ts)
        return self._tracker

    def _set_depth_range(self, frame: RGBDFrame) -> None:
        rng = self._depth_range
        if rng is None:
            return
        if isinstance(rng, str):
            if rng != "auto":
                raise ReconstructionError(f"depth range {rng!r}: use 'auto' or (min, max) in m")
            rng = choose_depth_range([frame])
        lo, hi = float(rng[0]), float(rng[1])
        if not 0 <= lo < hi:
            raise ReconstructionError(f"depth range {lo}..{hi} m: need 0 <= min < max")
        self.tsdf = TSDFIntegrator(replace(self.tsdf.settings, depth_min=lo, depth_max=hi))
        self.capture["depth_range_m"] = [lo, hi]
        self.capture["depth_range_from"] = "data" if self._depth_range == "auto" else "user"

    def _model_view(
        self, T_world_camera: NDArray[np.float64], frame: RGBDFrame, down: int = 1
    ) -> Any:
        # never raycast while a fusion writes; an empty model takes the held frame first
        self._fusion.join_running()
        if self._first is None:
            self._fusion.wait()
        r = self.tsdf.render_depth(frame, T_world_camera, down)
        if r is None:
            self._fusion.start()
            return None
        if self._ray_offset is None:
            self._ray_offset = self._measure_ray_offset()
        # the view (numpy and Open3D downsampling: they need the GIL, which fusion holds) is
        # built first; the held frame then fuses while this one is registered (ICP runs
        # without the GIL)
        view = self.tracker.view_of_depth(*r)
        self._fusion.start()
        # the raycast surface sits at a fixed offset in the grid (world) frame: seen from this
        # camera it is a translation, undone on the registration's result
        C = np.eye(4)
        C[:3, 3] = -np.asarray(T_world_camera)[:3, :3].T @ self._ray_offset
        view.correction = C
        return view

    def _measure_ray_offset(self) -> NDArray[np.float64]:
        """Open3D 0.20's raycast of a VoxelBlockGrid renders the fused surface shifted by
        about half a voxel (measured: 3-4 mm at 5 mm voxels, and ~7 mm along the view axis in
        its depth), which frame-to-model ICP would add to every pose and fuse again —
        a drift of that much per frame. Measured once, on the first fused frame: ICP of its
        own points onto the model rendered from its own pose gives the offset (world frame)."""
        first = self._first
        if first is None:
            return np.zeros(3)
        f, T = first
        r = self.tsdf.render_depth(f, T, 1)
        if r is None:
            return np.zeros(3)
        tr = self.tracker
        D = tr._icp(tr.view_of_frame(f), tr.view_of_depth(*r), np.eye(4))
        if D is None or np.linalg.norm(D[:3, 3]) > 3 * self.tsdf.settings.voxel_size:
            return np.zeros(3)
        return np.asarray(T[:3, :3] @ D[:3, 3], float)

    def _is_keyframe(self, ft: Any) -> bool:
        kfs = self.tracker.keyframes
        return bool(kfs) and kfs[-1].frame_index == ft.index

    def _keep(self, frame: RGBDFrame, keyframe: bool) -> None:
        if not self.tracker.s.loop_closure:  # nothing to fuse again without loop closure
            return
        size = frame.depth.nbytes + frame.color.nbytes
        if self._kept_bytes + size <= self._keep_bytes or keyframe:
            self._kept[frame.index] = frame
            self._kept_bytes += size

    def _note_untracked(self, frame: RGBDFrame, why: str) -> None:
        if self.track:
            self.tracker.tracks.append(
                FrameTrack(frame.index, frame.timestamp, None, 0.0, "", clean_message(why))
            )

    def _close_path(self, quality: dict[str, Any], warnings: list[str]) -> CameraPath | None:
        """Pose graph over keyframes, re-fusion along the optimised path; the camera path."""
        if not self.track or self._tracker is None:
            return None
        self._fusion.close()
        tr = self._tracker
        opt = tr.optimise()
        quality["pose_graph"] = opt
        if "rejected" in opt:
            warnings.append(f"loop closure not applied: {opt['rejected']}")
        moved = float(opt.get("max_correction_m", 0.0))
        if opt.get("optimised") and moved > 0.5 * self.tsdf.settings.voxel_size:
            poses = {t.index: t.pose for t in tr.tracks if t.pose is not None}
            refused = [i for i in poses if i in self._kept]
            ig = TSDFIntegrator(self.tsdf.settings)
            for i in sorted(refused):
                ig.integrate(self._kept[i], poses[i])
            if len(refused) < len(poses):
                warnings.append(
                    f"after loop closure only {len(refused)} of {len(poses)} tracked frames "
                    "were kept in memory to fuse again (raise keep_frames_mb)"
                )
            self.tsdf = ig
            if poses:
                self.last_pose = poses[max(poses)]
        quality["tracking"] = {
            **tr.summary(),
            "raycast_offset_m": None
            if self._ray_offset is None
            else [round(float(v), 5) for v in self._ray_offset],
        }
        quality["track_ms_mean"] = (
            round(float(np.mean(self.track_s)) * 1000, 2) if self.track_s else None
        )
        return CameraPath.from_tracks(tr.tracks)

    @property
    def frames_integrated(self) -> int:
        return self.tsdf.frames_integrated

    def preview(self, max_points: int = PREVIEW_POINTS) -> Preview:
        """The fused surface so far, at most `max_points` of it (`preview_subset`)."""
        self._fusion.wait()
        p, c = preview_subset(*self.tsdf.points(), max_points)
        return Preview(p, c, self.tsdf.frames_integrated)

    def table_objects(
        self, seed: int = 0, exclude: list[Box] | None = None
    ) -> tuple[Plane, list[Cluster]]:
        """The table plane (facing +z) and the object clusters on it, from the fused points
        so far (a guided scan's second pass plans its views around them). Raises a
        TwinbenchError when there is no table."""
        self._fusion.wait()
        pts, cols = self.tsdf.points()
        plane, _ = fit_table_plane(pts, seed=seed, up=np.array([0.0, 0, 1]))
        return plane, cluster_objects(pts, cols, plane, exclude=list(exclude or []))  # type: ignore[arg-type]

    def finish(
        self,
        seg: SegmentSettings | None = None,
        T_base_camera: NDArray[np.float64] | None = None,
        calibration: dict[str, Any] | None = None,
        progress: Callable[[float, str], None] | None = None,
    ) -> ScanResult:
        """Mesh, table plane, objects. Keeps what it has: no plane -> no objects, a warning.
        A handheld scan first closes its loops (pose graph) and keeps its camera path."""
        seg = seg or SegmentSettings()
        warnings: list[str] = []
        quality: dict[str, Any] = {}
        t_finish = time.perf_counter()
        self._fusion.close()
        if progress:
            progress(0.0, "closing loops" if self.track else "extracting mesh")
        path = self._close_path(quality, warnings)
        mesh = self.tsdf.mesh()
        quality.update(
            {
                "frames_integrated": self.tsdf.frames_integrated,
                "frames_skipped": {str(k): v for k, v in sorted(self.skipped.items())},
                "integrate_ms_mean": float(np.mean(self.integrate_s) * 1000)
                if self.integrate_s
                else None,
                "mesh_vertices": int(len(mesh.vertices)),
                "mesh_triangles": int(len(mesh.faces)),
                "voxel_size_m": self.tsdf.settings.voxel_size,
                "depth_range_m": [self.tsdf.settings.depth_min, self.tsdf.settings.depth_max],
            }
        )
        if self.skipped:
            warnings.append(
                f"{len(self.skipped)} frames skipped: "
                + ", ".join(f"{k} ({v})" for k, v in list(sorted(self.skipped.items()))[:8])
            )

        def result(
            plane: NDArray[np.float64] | None, objects: tuple[ScannedObject, ...]
        ) -> ScanResult:
            # the end of a scan (loops, mesh, plane, objects) is part of its speed
            quality["finish_s"] = round(time.perf_counter() - t_finish, 3)
            return ScanResult(
                mesh,
                plane,
                objects,
                T_base_camera,
                calibration or {},
                quality,
                tuple(warnings),
                self.capture,
                path,
                display_copy(mesh),
            )

        if len(mesh.faces) == 0:
            warnings.append(
                "the fused mesh is empty: check the depth scale and that the "
                "surfaces are within the depth range"
            )
            return result(None, ())
        plane = self._support_plane(mesh.vertices, seg, path, quality, warnings)
        if plane is None:
            return result(None, ())
        calibration = {
            **(calibration or {}),
            "T_base_table": workspace_frame(
                np.array(plane.to_list()), mesh.vertices.mean(axis=0)
            ).tolist(),
        }
        if progress:
            progress(0.4, "clustering objects")
        vc = vertex_colors(mesh)
        colors = vc[:, :3] if vc is not None else np.full((len(mesh.vertices), 3), 180, np.uint8)
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
            r, g, b = (int(v) for v in np.median(cl.colors, axis=0)[:3])
            col = (r, g, b)
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
        return result(np.array(plane.to_list()), tuple(objects))

    def _support_plane(
        self,
        vertices: NDArray[np.float64],
        seg: SegmentSettings,
        path: CameraPath | None,
        quality: dict[str, Any],
        warnings: list[str],
    ) -> Plane | None:
        """The table: for posed scans the largest plane facing `seg.up`; for handheld scans
        the support-plane rule of reconstruction/support.py, or the user's choice."""
        if not self.track and seg.support_plane == "auto":
            try:
                plane, frac = fit_table_plane(
                    vertices, seed=seg.seed, up=None if seg.up is None else np.asarray(seg.up)
                )
            except ReconstructionError as exc:
                warnings.append(f"no table found: {exc}")
                return None
            quality["table_inlier_fraction"] = frac
            return plane
        centres = (
            path.poses[path.tracked][:, :3, 3] if path is not None and path.tracked.any() else None
        )
        up, up_from = up_direction(
            path.poses[path.tracked] if path is not None else None,
            self.gravity_sum if np.linalg.norm(self.gravity_sum) > 0 else None,
            None if seg.up is None else np.asarray(seg.up, float),
        )
        # the image-up guess is only as good as the camera is level: a looser tilt limit
        tilt = 25.0 if up_from in ("given", "accelerometer") else 45.0
        choice = choose_support_plane(
            vertices, up, centres, seg.support_plane, seed=seg.seed, max_tilt_deg=tilt
        )
        quality["support_plane"] = {
            "rule": choice.rule,
            "up": [round(float(v), 4) for v in up],
            "up_from": up_from,
            "candidates": choice.candidates,
            "chosen": choice.chosen,
        }
        if choice.plane is None:
            warnings.append(choice.message)
            return None
        quality["table_inlier_fraction"] = choice.inlier_fraction
        return choice.plane
