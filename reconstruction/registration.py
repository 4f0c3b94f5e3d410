"""Registration of one camera view onto another for handheld tracking: coarse-to-fine KD-tree
point-to-plane ICP (Open3D), FPFH + RANSAC global registration when no start converges, and
the choice among hypotheses by the valid-pixel gate (reconstruction/track_view.py). Every
result is T_tgt_src (maps src's camera frame into tgt's).

Measured and not used: projective point-to-plane ICP against the model's vertex/normal map
(KinectFusion's association, numpy): 5x cheaper, but between lab video frames 3.2 mm median /
24 mm worst error against 1.6 / 6.3 mm for this ICP (it slides along the table plane)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import open3d as o3d

from reconstruction.track_view import Mat4, TrackingSettings, View, gate

_legacy = o3d.pipelines.registration
# CPU seconds spent inside Open3D's ICP (which runs without Python's GIL), for benchmarks
_icp_cpu_s = [0.0]


def icp_cpu_seconds() -> float:
    """CPU seconds spent in ICP solves so far in this process (all threads)."""
    return _icp_cpu_s[0]


@dataclass
class Hypothesis:
    T: Mat4  # T_ref_camera
    ratio: float
    overlap: float
    method: str
    tight: float = 0.0


def icp(
    s: TrackingSettings,
    src: View,
    tgt: View,
    init: Mat4,
    levels: int = 3,
    first: int = 0,
    src_fine: float = 1.0,
    eps: float = 1e-5,
) -> Mat4 | None:
    """Coarse-to-fine point-to-plane ICP (4, 2, 1 x voxel; levels `first` to `levels` - 1 of
    them) of src onto tgt: T_tgt_src, or None when either view is too small or the solve
    diverged. src's points at no finer than `src_fine` x voxel; each level stops at a
    relative change of fitness and RMSE under `eps`."""
    v = s.voxel
    if src.size() < 50 or tgt.size() < 50:
        return None
    T = np.asarray(init, np.float64)
    steps = list(zip((4 * v, 2 * v, v), s.corr, (30, 20, 15), strict=True))[first:levels]
    t0 = time.thread_time()
    for scale, dist, iters in steps:
        r = _legacy.registration_icp(
            src.level(max(scale, src_fine * v)),
            tgt.level(scale),
            dist,
            T,
            _legacy.TransformationEstimationPointToPlane(),
            _legacy.ICPConvergenceCriteria(eps, eps, iters),
        )
        T = np.asarray(r.transformation, np.float64)
    _icp_cpu_s[0] += time.thread_time() - t0
    return T if np.isfinite(T).all() else None


def global_registration(s: TrackingSettings, src: View, tgt: View) -> Mat4 | None:
    """FPFH + RANSAC registration (seeded) of src onto tgt, or None when it finds nothing."""
    gv = max(0.02, s.depth_max / 60)
    try:
        ps, fs = src.global_features(gv)
        pt, ft = tgt.global_features(gv)
        if len(ps.points) < 30 or len(pt.points) < 30:
            return None
        o3d.utility.random.seed(0)
        r = _legacy.registration_ransac_based_on_feature_matching(
            ps,
            pt,
            fs,
            ft,
            True,
            1.5 * gv,
            _legacy.TransformationEstimationPointToPoint(False),
            3,
            [
                _legacy.CorrespondenceCheckerBasedOnEdgeLength(0.9),
                _legacy.CorrespondenceCheckerBasedOnDistance(1.5 * gv),
            ],
            _legacy.RANSACConvergenceCriteria(100000, 0.999),
        )
    except RuntimeError:
        return None
    T = np.asarray(r.transformation, np.float64)
    if not np.isfinite(T).all() or np.allclose(T, np.eye(4)) and r.fitness == 0:
        return None
    return T


def best_hypothesis(
    s: TrackingSettings,
    src: View,
    tgt: View,
    inits: list[tuple[Mat4, str]],
    glob: bool,
    extra: list[tuple[Mat4, str]] | None = None,
    always: bool = False,
) -> Hypothesis:
    """ICP from each start in `inits` (and each ready-made T_tgt_src in `extra`); global
    registration as one more start when none passes (or `always`, or always if so set). The
    winner:
    among those passing the gate, the highest lenient + tight inlier ratio; else the
    highest ratio (failing); else an empty hypothesis."""
    cands: list[Hypothesis] = []

    def consider(T: Mat4 | None, name: str) -> None:
        if T is None:
            return
        ratio, ov, tight = gate(s, src, tgt, T)
        if ov >= s.min_overlap:
            cands.append(Hypothesis(T, ratio, ov, name, tight))

    for init, name in inits:
        consider(icp(s, src, tgt, init), name)
    for T, name in extra or []:
        consider(T, name)

    def passing() -> list[Hypothesis]:
        return [h for h in cands if h.ratio >= s.min_inlier_ratio]

    if glob and (not passing() or always or s.global_registration == "always"):
        Tg = global_registration(s, src, tgt)
        if Tg is not None:
            consider(icp(s, src, tgt, Tg), "global")
    ok = passing()
    if ok:
        # the lenient ratio says "consistent", the tight one "precise": both rank
        return max(ok, key=lambda h: h.ratio + 0.5 * h.tight)
    if cands:
        return max(cands, key=lambda h: h.ratio)
    return Hypothesis(np.eye(4), 0.0, 0.0, "")


def passes(s: TrackingSettings, h: Hypothesis | None) -> bool:
    """Whether a hypothesis passes the tracking gate."""
    return h is not None and h.ratio >= s.min_inlier_ratio and h.overlap >= s.min_overlap
