"""What handheld tracking compares: camera views of depth, and the valid-pixel gate.

A `View` is one depth image seen from its own camera: points with normals, a small depth
image and sampled points for the gate, and (built on first use, they cost) Open3D point
clouds for ICP and FPFH features. The gate
(`gate`) scores a registration over *valid* pixels only (Open3D's odometry `fitness` counts
pixels without depth too: docs/TRAPS.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np
import open3d as o3d
from numpy.typing import NDArray

Mat4 = NDArray[np.float64]
_legacy = o3d.pipelines.registration


@dataclass(frozen=True)
class TrackingSettings:
    """`voxel` is the finest ICP scale (m); coarser scales are 2x and 4x it."""

    voxel: float = 0.01
    depth_min: float = 0.1  # m
    depth_max: float = 3.0  # m
    min_inlier_ratio: float = 0.6  # of frame points landing on model pixels with depth
    min_overlap: float = 0.15  # share of frame points that must land on model depth
    keyframe_m: float = 0.1
    keyframe_deg: float = 10.0
    # "sparse" | "fallback" | "always" | "never". FPFH + RANSAC as one more hypothesis:
    # "sparse" always between frames more than `video_dt_s` apart (keyframe sequences), as
    # a fallback at video rate. TUM cabinet (58 keyframes, 14.5 cm apart), 12 runs each:
    # "sparse" all tracked, ATE 2.99-4.20 cm; "fallback" 3.06-9.35 cm, 2 of 11 over 5 cm
    # (a lost frame 44 and a relocalisation cascade, a slide at frames 44-45)
    global_registration: str = "sparse"
    relocalise: bool = True
    # loop edges + pose graph (`scan --loop-closure`): off by default. The lab out and back
    # with 8.8 cm of drift put on the keyframes: pulled to 1.3 cm (tests/reconstruction/
    # test_loop_closure.py). The TUM cabinet (3 runs): the solution is rejected every time
    # (ATE 3.2-3.7 cm, as without) at 0.4-0.6 fps instead of ~3: its loop registrations are
    # 4.4 cm off the mocap median, 16 cm p90 (plain, repeated faces)
    loop_closure: bool = False
    loop_radius_m: float = 1.0
    loop_max_deg: float = 60.0
    loop_candidates: int = 5
    # a loop edge may differ from the tracked chain by at most `loop_drift_m` + ratio x the
    # path walked between its keyframes (deg: `loop_drift_deg` + 100 x ratio per m walked)
    loop_drift_m: float = 0.01
    loop_drift_deg: float = 1.0
    loop_drift_ratio: float = 0.05
    # the graph's solution is kept only if the linked keyframes' tight inlier ratio gains
    # this much. Lab out and back at 3 fps: 8.8 cm of drift put on the keyframes, +0.14
    # (path pulled to 1.3 cm); 2.6 cm, +0.04 (to 2.4 cm max, 1.0 mean); the tracked path
    # (ATE 3.5 mm), +0.005 — and applying it made ATE 8 mm: loop edges between frames 10
    # deg apart are ~1 cm noisy, the graph cannot do better than that. The same path played
    # back from a recording (the Scan page's "Loop closure" test) gained +0.024-0.027 in 5
    # runs, moved keyframes 2.3-3.1 cm and once made the path 9 cm off on a CI machine: 0.02
    # was too close to the noise
    loop_min_gain: float = 0.03
    # and only if the loops say the tracked path is off: the median offset of the edges that
    # close a loop (10+ keyframes apart) from the tracked chain. Lab out and back: 53 mm with
    # 8.8 cm of drift put on, 1.6 mm on exact poses, 4-6 mm tracked (live or played back)
    loop_min_offset_m: float = 0.01
    # the video fast path's model view at 1/raycast_down of the frame's resolution (the
    # view keeps ~20k points either way: at full resolution every 2nd pixel of the lab's
    # 424x240). Half costs less than half (lab: 18 vs 40 ms CPU) and renders within 0.01
    # deg / 0.1 mm of the full one. Before the fast path tried both starts and keyframes
    # gave a second opinion, 4 of ~20 lab hand paths lost track at half (0 of 9 at full);
    # since then, 8 s lab path, 6 runs each alternated on a quiet machine: half 18.3-20.0
    # fps, ATE 1.8-2.4 mm; full 14.3-16.3 fps, 3.5-9.1 mm; short fast paths (1.5 s, 20
    # seeds): half 0 over 1 cm (4.4-7.7 mm), full 2 (13.8, 17.8 mm)
    raycast_down: int = 2
    video_dt_s: float = 0.1  # frames closer than this take the one-ICP fast path first
    fast_accept_ratio: float = 0.9
    # video fast path: ICP levels `fast_icp_first` to `fast_icp_levels` - 1 of (4x, 2x, 1x
    # voxel), the frame's points at no finer than `fast_src_fine` x voxel (the model's at
    # each level's), each level stopping at a relative change under `fast_icp_eps` (the
    # other paths: 1e-5). Lab short hand paths (1.5 s at 30 fps, 27-80 mm a frame; ATE over
    # 1 cm): the default (1e-4) 0 of 20 (3.4-6.2 mm); 1e-4 on the coarse levels only, 0 of
    # 20 (3.1-7.3 mm); 1e-5, 1 of 10 (91 mm); 1e-3 on the coarse levels, 1 of 3 (271 mm);
    # the frame at 2x voxel, 3 of 20 (21-221 mm); without the 4x level, 1 of 3 (353 mm).
    # ICP CPU on the 8 s path, 1e-5 -> 1e-4: about 48 -> 37 ms a frame (loaded machine).
    # Reuse of a model view for up to `reuse_view_frames` frames while the camera stays
    # within `reuse_view_m` / `reuse_view_deg` of the pose it was raycast at: every frame is
    # raycast by default; reusing a view even for 2 frames lost track on the lab path (32 cm
    # ATE, most frames falling to global registration)
    fast_icp_levels: int = 3
    fast_icp_first: int = 0
    fast_src_fine: float = 1.0
    fast_icp_eps: float = 1e-4
    # above this step (m a frame) the fast path tries both starts and keeps the better by
    # the gate (else the first that passes): lab short hand paths, ATE over 1 cm in 0 of 40
    # (2.9-6.7 mm) against 4 of 40 (39-155 mm: ICP from "no motion" slid 1-3 cm along the
    # table after a 300 deg/s turn and still passed the gate at 0.93-0.96)
    fast_both_above_m: float = 0.01
    reuse_view_frames: int = 1
    reuse_view_m: float = 0.03
    reuse_view_deg: float = 4.0
    # a frame near a keyframe this many keyframes old is also registered to it (0: never)
    revisit_gap: int = 10
    revisit_min_ratio: float = 0.9
    max_speed_mps: float = 2.0  # a pose jump faster than this is a failure
    max_turn_dps: float = 360.0

    @property
    def corr(self) -> tuple[float, float, float]:
        return (20 * self.voxel, 8 * self.voxel, 3 * self.voxel)

    def inlier_m(self, z: NDArray[np.float64]) -> NDArray[np.float64]:
        """Inlier distance at depth z (m): ICP scale plus the sensor's quadratic noise."""
        return 2 * self.voxel + 0.005 * z * z


@dataclass
class View:
    """One camera view (its own camera frame). Arrays are ready; Open3D clouds are built on
    first use."""

    depth: NDArray[np.float32]  # (h, w) metres, 0 = none, at the gate's resolution
    K: NDArray[np.float64]  # intrinsics of `depth`
    sample: NDArray[np.float64]  # (n, 3) camera-frame points for the gate
    points: NDArray[np.float64]  # (m, 3) points with normals: ICP source, cloud input
    normals: NDArray[np.float64]  # (m, 3) facing the camera
    voxel: float  # finest ICP scale (m)
    # T_true_rendered: applied to registrations against this view (a model raycast's offset)
    correction: NDArray[np.float64] | None = None
    _cloud: Any = None
    _levels: dict[float, Any] = dataclass_field(default_factory=dict)
    _fpfh: Any = None
    _down: Any = None

    @property
    def cloud(self) -> o3d.geometry.PointCloud:
        """Voxel-downsampled points with normals (Open3D), built on first use."""
        if self._cloud is None:
            pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(self.points))
            pc.normals = o3d.utility.Vector3dVector(self.normals)
            pc = pc.voxel_down_sample(self.voxel)
            pc.normalize_normals()
            self._cloud = pc
        return self._cloud

    def level(self, voxel: float) -> o3d.geometry.PointCloud:
        """The cloud at ICP scale `voxel` (normals averaged over each voxel), downsampled from
        the fine cloud (the TUM cabinet's tracking is chaotic: keep the points it was tuned
        on)."""
        if voxel <= self.voxel * 1.01:
            return self.cloud
        if voxel not in self._levels:
            pc = self.cloud.voxel_down_sample(voxel)
            pc.normalize_normals()
            self._levels[voxel] = pc
        return self._levels[voxel]

    def size(self) -> int:
        """Points with normals (before voxel downsampling)."""
        return len(self.points)

    def global_features(self, voxel: float) -> tuple[Any, Any]:
        """(downsampled cloud, FPFH features) at `voxel`, computed once."""
        if self._fpfh is None:
            pc = self.cloud.voxel_down_sample(voxel)
            pc.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(2 * voxel, 30))
            self._down = pc
            self._fpfh = _legacy.compute_fpfh_feature(  # type: ignore[call-arg]
                pc, o3d.geometry.KDTreeSearchParamHybrid(5 * voxel, 100)
            )
        return self._down, self._fpfh


def make_view(depth: NDArray[np.float32], K: NDArray[np.float64], voxel: float) -> View:
    """A View of a depth image (m, 0 = none) with intrinsics K."""
    h, w = depth.shape
    # ~20k points for KD-tree ICP whatever the resolution
    stride = max(1, int(round(np.sqrt(h * w / 20000))))
    P, N, ok = _vertex_normal_maps(depth, K, stride, 4 * voxel)
    gs = max(1, int(round(np.sqrt(h * w / 4000))))
    small = np.ascontiguousarray(depth[::gs, ::gs])
    Ks = K.copy()
    Ks[:2] /= gs
    return View(small, Ks, _backproject(depth, K, gs * 2), P[ok], N[ok], voxel)


def gate(s: TrackingSettings, src: View, tgt: View, T_tgt_src: Mat4) -> tuple[float, float, float]:
    """(inlier ratio, overlap, inlier ratio at a third of the inlier distance) of `src` seen
    from `tgt` through T_tgt_src, over valid pixels only: points landing on target pixels
    with depth count; inliers are within `inlier_m` of the target depth; points behind it
    (occluded) are not evidence, points in front of it violate free space. The last value
    ranks hypotheses that all pass the gate."""
    p = src.sample @ T_tgt_src[:3, :3].T + T_tgt_src[:3, 3]
    if len(p) == 0:
        return 0.0, 0.0, 0.0
    z = p[:, 2]
    K, D = tgt.K, tgt.depth
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.round(K[0, 0] * p[:, 0] / z + K[0, 2])
        v = np.round(K[1, 1] * p[:, 1] / z + K[1, 2])
    inside = (z > 1e-3) & (u >= 0) & (v >= 0) & (u < D.shape[1]) & (v < D.shape[0])
    zt = np.zeros(len(p))
    zt[inside] = D[v[inside].astype(np.int64), u[inside].astype(np.int64)]
    has = zt > 0
    tau = s.inlier_m(zt)
    dz = z - zt
    inl = has & (np.abs(dz) < tau)
    viol = has & (dz <= -tau)
    n = int(inl.sum() + viol.sum())
    if n == 0:
        return 0.0, 0.0, 0.0
    tight = has & (np.abs(dz) < tau / 3)
    return float(inl.sum() / n), float(n / len(p)), float(tight.sum() / n)


@functools.lru_cache(maxsize=16)
def _ray_grid(
    h: int, w: int, stride: int, fx: float, fy: float, cx: float, cy: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """x/z and y/z of every `stride`-th pixel's ray (read-only; a stream has one size)."""
    v, u = np.mgrid[0:h, 0:w]
    X, Y = (u * stride - cx) / fx, (v * stride - cy) / fy
    X.flags.writeable = Y.flags.writeable = False
    return X, Y


def _vertex_normal_maps(
    depth: NDArray[np.float32], K: NDArray[np.float64], stride: int, max_jump: float
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """Vertex and normal maps (camera frame) of every `stride`-th pixel, and where both are
    valid: normals from the depth map's neighbours (central differences), facing the camera;
    pixels at depth jumps > `max_jump` have none. (Written out per component: it runs for
    every frame and every model view, on the tracking thread, and np.stack / np.cross /
    np.linalg.norm on these small maps cost half of it.)"""
    d = depth[::stride, ::stride].astype(np.float64)
    h, w = d.shape
    X, Y = _ray_grid(h, w, stride, float(K[0, 0]), float(K[1, 1]), float(K[0, 2]), float(K[1, 2]))
    P = np.empty((h, w, 3))
    np.multiply(X, d, out=P[..., 0])
    np.multiply(Y, d, out=P[..., 1])
    P[..., 2] = d
    ok = d > 0
    dx = P[1:-1, 2:] - P[1:-1, :-2]
    dy = P[2:, 1:-1] - P[:-2, 1:-1]
    a0, a1, a2 = dx[..., 0], dx[..., 1], dx[..., 2]
    b0, b1, b2 = dy[..., 0], dy[..., 1], dy[..., 2]
    n0, n1, n2 = a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0
    norm = np.sqrt(n0 * n0 + n1 * n1 + n2 * n2)
    inner = (
        ok[1:-1, 1:-1]
        & ok[1:-1, 2:]
        & ok[1:-1, :-2]
        & ok[2:, 1:-1]
        & ok[:-2, 1:-1]
        & (np.abs(a2) < max_jump)
        & (np.abs(b2) < max_jump)
        & (norm > 0)
    )
    scale = 1.0 / np.where(norm > 0, norm, 1.0)
    c = P[1:-1, 1:-1]
    # normals face the camera
    scale[n0 * c[..., 0] + n1 * c[..., 1] + n2 * c[..., 2] > 0] *= -1
    N = np.zeros_like(P)
    np.multiply(n0, scale, out=N[1:-1, 1:-1, 0])
    np.multiply(n1, scale, out=N[1:-1, 1:-1, 1])
    np.multiply(n2, scale, out=N[1:-1, 1:-1, 2])
    valid = np.zeros_like(ok)
    valid[1:-1, 1:-1] = inner
    return P, N, valid


def _backproject(
    depth: NDArray[np.float32], K: NDArray[np.float64], stride: int
) -> NDArray[np.float64]:
    d = depth[::stride, ::stride]
    v, u = np.nonzero(d > 0)
    z = d[v, u].astype(np.float64)
    x = (u * stride - K[0, 2]) / K[0, 0] * z
    y = (v * stride - K[1, 2]) / K[1, 1] * z
    return np.column_stack([x, y, z])
