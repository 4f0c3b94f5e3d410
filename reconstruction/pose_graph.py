"""Keyframe loop closure and pose-graph optimisation for handheld tracking.

Each new keyframe is registered to older keyframes nearby (`loop_edges_for`). `optimise`
solves the keyframe pose graph (odometry + loop edges, Open3D's `global_optimization` with
line-process pruning), keeps the solution only when the keyframes agree clearly better under
it (`loop_min_gain`), and moves every tracked frame with its keyframe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import open3d as o3d
from numpy.typing import NDArray

from devices.poses import invert, rotation_angle_deg
from reconstruction.registration import best_hypothesis
from reconstruction.track_view import Mat4, TrackingSettings, View, gate

_legacy = o3d.pipelines.registration
LoopEdge = tuple[int, int, Mat4, float]  # (source node, target node, T_t_s, inlier ratio)


@dataclass
class Keyframe:
    node: int
    frame_index: int
    pose: Mat4  # T_world_camera as tracked
    view: View


def loop_edges_for(s: TrackingSettings, keyframes: list[Keyframe], kf: Keyframe) -> list[LoopEdge]:
    """Registrations of `kf` to older keyframes within `loop_radius_m` / `loop_max_deg`:
    the oldest neighbours close loops, the recent ones stiffen the chain."""
    near = []
    for o in keyframes[: kf.node - 1]:
        dist = float(np.linalg.norm(o.pose[:3, 3] - kf.pose[:3, 3]))
        ang = float(np.degrees(np.arccos(np.clip(o.pose[:3, 2] @ kf.pose[:3, 2], -1.0, 1.0))))
        if dist < s.loop_radius_m and ang < s.loop_max_deg:
            near.append((dist + ang / 90.0, o))
    near.sort(key=lambda x: x[0])
    old = [o for _, o in near if kf.node - o.node >= 10][:3]
    recent = [o for _, o in near if kf.node - o.node < 10][: s.loop_candidates - len(old)]
    edges: list[LoopEdge] = []
    for o in old + recent:
        init = invert(o.pose) @ kf.pose
        hyp = best_hypothesis(s, kf.view, o.view, [(init, "loop")], glob=kf.node - o.node >= 10)
        if hyp.ratio < max(s.min_inlier_ratio, 0.7) or hyp.overlap < 0.3:
            continue
        # no further from the tracked chain than its drift can be: the path walked between
        # the two keyframes x `loop_drift_ratio` (plain or repeated surfaces register to a
        # wrong place with a good score; a few such edges bend the whole graph)
        centres = np.array([k.pose[:3, 3] for k in keyframes[o.node : kf.node + 1]])
        walked = float(np.linalg.norm(np.diff(centres, axis=0), axis=1).sum())
        off_m = float(np.linalg.norm(hyp.T[:3, 3] - init[:3, 3]))
        off_deg = rotation_angle_deg(hyp.T, init)
        if off_m <= s.loop_drift_m + s.loop_drift_ratio * walked and off_deg <= (
            s.loop_drift_deg + 100 * s.loop_drift_ratio * walked
        ):
            edges.append((kf.node, o.node, hyp.T, hyp.ratio))
    return edges


def optimise(
    s: TrackingSettings, keyframes: list[Keyframe], tracks: list[Any], loop_edges: list[LoopEdge]
) -> dict[str, Any]:
    """Solve the keyframe pose graph; on success move keyframes and every tracked frame
    (`tracks`: FrameTrack records with `keyframe` and `T_kf_camera`). Returns a summary
    (edges, pruned, largest correction in m and deg, or why the solution was rejected)."""
    n = len(keyframes)
    if n < 3 or not loop_edges:
        return {"keyframes": n, "loop_edges": len(loop_edges), "optimised": False}
    off = _loop_offset_m(keyframes, loop_edges)
    if off is not None and off < s.loop_min_offset_m:
        return {
            "keyframes": n,
            "loop_edges": len(loop_edges),
            "optimised": False,
            "loop_offset_m": round(off, 4),
            "rejected": f"the loops close within {off * 1000:.0f} mm of the tracked path (median), "
            f"inside their own noise ({s.loop_min_offset_m * 1000:.0f} mm): no drift to correct "
            "(the path is kept as tracked)",
        }
    pg = _legacy.PoseGraph()
    for kf in keyframes:
        pg.nodes.append(_legacy.PoseGraphNode(kf.pose.copy()))
    dist = 3 * s.voxel
    for a, b in zip(keyframes[:-1], keyframes[1:], strict=True):
        T = invert(b.pose) @ a.pose  # maps a's camera frame into b's
        info = _information(a.view, b.view, T, dist)
        pg.edges.append(_legacy.PoseGraphEdge(a.node, b.node, T, info, uncertain=False))
    for s_node, t_node, T, _ in loop_edges:
        info = _information(keyframes[s_node].view, keyframes[t_node].view, T, dist)
        pg.edges.append(_legacy.PoseGraphEdge(s_node, t_node, T, info, uncertain=True))
    opt = _legacy.GlobalOptimizationOption(
        max_correspondence_distance=dist,
        edge_prune_threshold=0.25,
        preference_loop_closure=2.0,
        reference_node=0,
    )
    with o3d.utility.VerbosityContextManager(o3d.utility.VerbosityLevel.Error):
        _legacy.global_optimization(
            pg,
            _legacy.GlobalOptimizationLevenbergMarquardt(),
            _legacy.GlobalOptimizationConvergenceCriteria(),
            opt,
        )
    new = [np.asarray(nd.pose, np.float64) for nd in pg.nodes]
    # keep the solution only if the keyframes agree better with each other under it
    before = _consistency(s, keyframes, loop_edges, [kf.pose for kf in keyframes])
    after = _consistency(s, keyframes, loop_edges, new)
    if after < before + s.loop_min_gain:
        return {
            "keyframes": n,
            "loop_edges": len(loop_edges),
            "optimised": False,
            "rejected": f"keyframe consistency {after:.3f}, {before:.3f} before: not clearly "
            "better (the path is kept as tracked)",
        }
    moved_m = max(
        float(np.linalg.norm(P[:3, 3] - k.pose[:3, 3])) for k, P in zip(keyframes, new, strict=True)
    )
    moved_deg = max(rotation_angle_deg(P, k.pose) for k, P in zip(keyframes, new, strict=True))
    for ft in tracks:
        if ft.pose is not None and ft.T_kf_camera is not None and ft.keyframe >= 0:
            ft.pose = new[ft.keyframe] @ ft.T_kf_camera
    for kf, P in zip(keyframes, new, strict=True):
        kf.pose = P
    kept = sum(1 for e in pg.edges if e.uncertain and e.confidence > 0.25)
    return {
        "keyframes": n,
        "loop_edges": len(loop_edges),
        "loop_edges_kept": kept,
        "optimised": True,
        "consistency": [round(before, 4), round(after, 4)],
        "max_correction_m": round(moved_m, 4),
        "max_correction_deg": round(moved_deg, 3),
    }


def _loop_offset_m(keyframes: list[Keyframe], loop_edges: list[LoopEdge]) -> float | None:
    """Median distance between where the loop edges that close a loop (10 or more keyframes
    apart) put a keyframe and where the tracked path has it; None without such edges."""
    offs = [
        float(np.linalg.norm(T[:3, 3] - (invert(keyframes[t].pose) @ keyframes[s_].pose)[:3, 3]))
        for s_, t, T, _ in loop_edges
        if s_ - t >= 10
    ]
    return float(np.median(offs)) if offs else None


def _consistency(
    s: TrackingSettings, keyframes: list[Keyframe], loop_edges: list[LoopEdge], poses: list[Mat4]
) -> float:
    """Mean tight inlier ratio of linked keyframe pairs under `poses`."""
    pairs = [(a.node, a.node + 1) for a in keyframes[:-1]]
    pairs += [(s_, t_) for s_, t_, _, _ in loop_edges]
    vals = []
    for s_, t_ in pairs:
        T = invert(poses[t_]) @ poses[s_]
        _, ov, tight = gate(s, keyframes[s_].view, keyframes[t_].view, T)
        vals.append(tight if ov > 0 else 0.0)
    return float(np.mean(vals)) if vals else 0.0


def _information(src: View, tgt: View, T: Mat4, dist: float) -> NDArray[np.float64]:
    M = np.asarray(
        _legacy.get_information_matrix_from_point_clouds(src.cloud, tgt.cloud, dist, T),
        np.float64,
    )
    return M if np.isfinite(M).all() and np.trace(M) > 0 else np.eye(6)
