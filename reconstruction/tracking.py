"""Handheld camera tracking that holds on real data (frame-to-frame RGB-D odometry
drifts and its `fitness` counts pixels without depth: docs/TRAPS.md).

Each frame is registered to the fused model, not to the previous frame: the TSDF is raycast
near the previous pose and the frame is aligned to that view.

- Video frames (`video_dt_s` apart) first take a fast path: coarse-to-fine ICP
  against the model view, from "no motion", then constant velocity.
  The model view is reused for a few frames while the camera stays near the pose it was
  raycast at (`reuse_view_*`): the raycast is the costliest step of a tracked frame.
- Otherwise (large motion, or the fast path failing): coarse-to-fine KD-tree point-to-plane
  ICP against a fresh model view from constant velocity, "no motion" and the frame-to-frame
  registration as starts, and FPFH + RANSAC global registration (reconstruction/
  registration.py): always between frames more than `video_dt_s` apart, at video rate
  only when none of the starts passes.

The winning hypothesis is the one with the highest **valid-pixel inlier ratio**
(reconstruction/track_view.py `gate`). A frame below the gate is not fused; tracking is then
lost, and each next frame is first relocalised against the keyframes (global registration +
ICP against each keyframe's own view). Keyframes are taken every `keyframe_m` /
`keyframe_deg`; loop closure and the keyframe pose graph are in reconstruction/pose_graph.py
(off by default). The first frame defines the world.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import open3d as o3d
from numpy.typing import NDArray

from devices.frames import RGBDFrame
from devices.poses import invert, rotation_angle_deg
from reconstruction import pose_graph
from reconstruction.depth_range import choose_depth_range
from reconstruction.errors import clean_message
from reconstruction.pose_graph import Keyframe, LoopEdge
from reconstruction.registration import Hypothesis, best_hypothesis, icp, passes
from reconstruction.track_view import Mat4, TrackingSettings, View, gate, make_view

__all__ = [
    "FrameTrack",
    "HandheldTracker",
    "Keyframe",
    "TrackingSettings",
    "View",
    "choose_depth_range",
]


@dataclass
class FrameTrack:
    """How one frame was tracked. `pose` is None when it was not."""

    index: int
    timestamp: float
    pose: Mat4 | None
    inlier_ratio: float = 0.0
    method: str = ""  # first | model | global | relocalised
    reason: str = ""
    keyframe: int = -1  # node of the reference keyframe
    T_kf_camera: Mat4 | None = None


@dataclass
class _ModelView:
    view: View
    T_world_ref: Mat4  # the pose it was raycast at
    frame: int  # tracked-frame count when it was raycast
    down: int  # rendered at 1/down of the frame's resolution


class HandheldTracker:
    """Tracks frames against a model raycaster; see the module docstring."""

    def __init__(self, settings: TrackingSettings | None = None) -> None:
        self.s = settings or TrackingSettings()
        self.tracks: list[FrameTrack] = []
        self.keyframes: list[Keyframe] = []
        self.loop_edges: list[LoopEdge] = []
        self.relocalisations = 0
        self.raycasts = 0
        self.revisits = 0
        self.lost = False
        self._last: FrameTrack | None = None
        self._velocity = np.eye(4)  # T_prev_cur of the last tracked step
        self._last_view: View | None = None
        self._model: _ModelView | None = None
        self._prepared: dict[int, tuple[RGBDFrame, View]] = {}
        self._prep_lock = threading.Lock()

    # --- views -------------------------------------------------------------------------------
    def view_of_frame(self, f: RGBDFrame) -> View:
        """The frame as a View (camera frame), depth limited to the tracking range."""
        d = f.depth_m
        d = np.where((d > self.s.depth_min) & (d < self.s.depth_max), d, 0).astype(np.float32)
        return make_view(d, f.intrinsics.K, self.s.voxel)

    def prepare(self, f: RGBDFrame) -> None:
        """Build `f`'s view and its ICP levels ahead of `track(f)` (on a reader thread: the
        view depends only on the frame and the settings)."""
        v = self.view_of_frame(f)
        s = self.s
        for scale in {4 * s.voxel, 2 * s.voxel, s.voxel, max(1.0, s.fast_src_fine) * s.voxel}:
            v.level(scale)
        with self._prep_lock:
            self._prepared[id(f)] = (f, v)
            while len(self._prepared) > 8:  # frames skipped before tracking
                self._prepared.pop(next(iter(self._prepared)))

    def _view_for(self, f: RGBDFrame) -> View:
        with self._prep_lock:
            got = self._prepared.pop(id(f), None)
        return got[1] if got is not None and got[0] is f else self.view_of_frame(f)

    def view_of_depth(self, depth_m: NDArray[np.float32], K: NDArray[np.float64]) -> View:
        """A rendered depth image (a model raycast) as a View, its ICP levels built."""
        v = make_view(depth_m, K, self.s.voxel)
        for scale in (4 * self.s.voxel, 2 * self.s.voxel, self.s.voxel):
            v.level(scale)
        return v

    def _icp(self, src: View, tgt: View, init: Mat4) -> Mat4 | None:
        """Coarse-to-fine KD-tree ICP of src onto tgt (T_tgt_src)."""
        return icp(self.s, src, tgt, init)

    def gate(self, src: View, tgt: View, T_tgt_src: Mat4) -> tuple[float, float]:
        """(inlier ratio, overlap) of `src` seen from `tgt` (see track_view.gate)."""
        r, ov, _ = gate(self.s, src, tgt, T_tgt_src)
        return r, ov

    # --- tracking ----------------------------------------------------------------------------
    def track(self, f: RGBDFrame, model_view: Any) -> FrameTrack:
        """Track one frame. `model_view(T_world_camera, frame, down) -> View | None` renders the
        fused model (camera frame of T_world_camera) at 1/down of the frame's resolution.
        Returns the FrameTrack (pose None if lost).
        Open3D's own console chatter (range-map reallocations, empty KD-trees on hopeless
        hypotheses) is silenced: the outcome is in the FrameTrack."""
        with o3d.utility.VerbosityContextManager(o3d.utility.VerbosityLevel.Error):
            return self._track(f, model_view)

    def _track(self, f: RGBDFrame, model_view: Any) -> FrameTrack:
        src = self._view_for(f)
        npts = src.size()
        if npts < 100:
            return self._fail(f, f"tracking failed: only {npts} usable depth points in range")
        if not self.keyframes:
            ft = FrameTrack(f.index, f.timestamp, np.eye(4), 1.0, "first")
            self._last_view = src
            self._add_keyframe(f, ft, src)
            return self._accept(ft)
        hyp: Hypothesis | None = None
        T_world_ref = np.eye(4)
        glob = self.s.global_registration != "never"
        last = self._last.pose if self._last is not None else None
        if not self.lost and self._last is not None and last is not None:
            video = abs(f.timestamp - self._last.timestamp) <= self.s.video_dt_s
            if video:
                hyp, T_world_ref = self._fast(f, src, model_view, last)
            if hyp is None:
                always = not video and self.s.global_registration == "sparse"
                hyp, T_world_ref = self._full(f, src, model_view, last, glob, always)
        if hyp is None and self.s.relocalise:
            # lost, or the model view failed: try the keyframes before giving up on this frame
            hyp, T_world_ref = self._relocalise(src, glob)
        if hyp is None:
            return self._fail(
                f,
                "tracking failed: no registration passed the gate "
                f"({self.s.min_inlier_ratio:.0%} of valid pixels within the inlier distance)",
            )
        T = T_world_ref @ hyp.T
        why = self._implausible(f, T)
        if why and self.s.relocalise and not self.lost:
            # a second opinion from the keyframes before losing the frame: with global
            # registration among the hypotheses a wrong one can win the gate and jump
            h2, ref2 = self._relocalise(src, glob)
            if h2 is not None and not self._implausible(f, ref2 @ h2.T):
                hyp, T_world_ref, T, why = h2, ref2, ref2 @ h2.T, ""
        if why:
            return self._fail(f, why)
        if self.lost:
            self.relocalisations += 1
        ft = FrameTrack(f.index, f.timestamp, T, hyp.ratio, hyp.method)
        self._last_view = src
        kf = self.keyframes[-1]
        if (
            np.linalg.norm(T[:3, 3] - kf.pose[:3, 3]) > self.s.keyframe_m
            or rotation_angle_deg(T, kf.pose) > self.s.keyframe_deg
        ):
            self._add_keyframe(f, ft, src)
        return self._accept(ft)

    def _render(
        self, f: RGBDFrame, model_view: Any, T_world_ref: Mat4, down: int = 1
    ) -> _ModelView | None:
        tgt = model_view(T_world_ref, f, down)
        self.raycasts += 1
        self._model = None if tgt is None else _ModelView(tgt, T_world_ref, len(self.tracks), down)
        return self._model

    def _fast(
        self, f: RGBDFrame, src: View, model_view: Any, last: Mat4
    ) -> tuple[Hypothesis | None, Mat4]:
        """Video-rate motion: coarse ICP against a (possibly reused) model view, from no
        motion, then constant velocity (hand tremor flips the velocity every few frames, and
        a constant-velocity start that ICP only half corrects along a dominant plane fed
        back into the next start: measured, diverged in 5 frames on the lab table). The
        first that passes wins; after a step over `fast_both_above_m` both are tried and
        the better by the gate wins."""
        s, m = self.s, self._model
        if (
            m is None
            or len(self.tracks) - m.frame >= s.reuse_view_frames
            or np.linalg.norm(last[:3, 3] - m.T_world_ref[:3, 3]) > s.reuse_view_m
            or rotation_angle_deg(last, m.T_world_ref) > s.reuse_view_deg
        ):
            m = self._render(f, model_view, last, s.raycast_down)
        if m is None:
            return None, np.eye(4)
        C = np.eye(4) if m.view.correction is None else m.view.correction
        Ci = invert(C)
        # exactly "no motion" when the view was rendered at the last pose: ICP is chaotic
        # here (a 1e-16 change of the start moved the lab path by centimetres in 30 frames)
        T_ref_last = np.eye(4) if m.T_world_ref is last else invert(m.T_world_ref) @ last
        fast = float(np.linalg.norm(self._velocity[:3, 3])) > s.fast_both_above_m
        best: Hypothesis | None = None
        for init in (T_ref_last, T_ref_last @ self._velocity):
            T = icp(
                s,
                src,
                m.view,
                Ci @ init,
                s.fast_icp_levels,
                s.fast_icp_first,
                s.fast_src_fine,
                s.fast_icp_eps,
            )
            if T is None:
                continue
            ratio, ov, tight = gate(s, src, m.view, T)
            if ratio >= s.fast_accept_ratio and ov >= s.min_overlap:
                h = Hypothesis(C @ T, ratio, ov, "model", tight)
                if not fast:
                    return h, m.T_world_ref
                if best is None or h.ratio + 0.5 * h.tight > best.ratio + 0.5 * best.tight:
                    best = h
        return (best, m.T_world_ref) if best is not None else (None, np.eye(4))

    def _full(
        self,
        f: RGBDFrame,
        src: View,
        model_view: Any,
        last: Mat4,
        glob: bool,
        always: bool = False,
    ) -> tuple[Hypothesis | None, Mat4]:
        """Large motion: KD-tree ICP against a model view rendered at the last pose (at full
        resolution whatever `raycast_down` says: with half resolution here the TUM cabinet's
        first two runs lost track near frame 43, 27-28 cm ATE), from constant velocity, no
        motion and the frame-to-frame registration."""
        m = self._model
        if (
            m is None
            or m.frame != len(self.tracks)
            or m.down != 1
            or not np.allclose(m.T_world_ref, last)
        ):
            m = self._render(f, model_view, last)
        if m is None:
            return None, np.eye(4)
        C = np.eye(4) if m.view.correction is None else m.view.correction
        Ci = invert(C)
        extra = []
        if self._last_view is not None:
            # frame-to-frame as one more start: where the model view is poor
            Tf = icp(self.s, src, self._last_view, self._velocity)
            if Tf is not None:
                extra.append((Ci @ Tf, "model"))
        hyp = best_hypothesis(
            self.s,
            src,
            m.view,
            [(Ci @ self._velocity, "model"), (Ci, "model")],
            glob,
            extra,
            always=always,
        )
        hyp.T = C @ hyp.T
        return self._revisit(src, last, hyp if passes(self.s, hyp) else None)

    def _revisit(
        self, src: View, last: Mat4, hyp: Hypothesis | None
    ) -> tuple[Hypothesis | None, Mat4]:
        """Where the camera returns to a place it saw `revisit_gap` keyframes ago, the fused
        model there holds both the old surfaces and the drifted new ones (ghosts), and ICP
        against it slides. Register the frame to the oldest keyframe seen from nearby instead
        and keep that pose when it agrees at least as well as the model's (`hyp`, relative to
        `last`): the path snaps back onto the old map."""
        s = self.s
        if s.revisit_gap <= 0 or len(self.keyframes) <= s.revisit_gap:
            return hyp, last
        pred = last @ self._velocity
        near = [
            k
            for k in self.keyframes[: -s.revisit_gap]
            if np.linalg.norm(k.pose[:3, 3] - pred[:3, 3]) < s.loop_radius_m
            and rotation_angle_deg(k.pose, pred) < s.loop_max_deg
        ]
        if not near:
            return hyp, last
        kf = min(near, key=lambda k: k.node)
        h = best_hypothesis(
            s,
            src,
            kf.view,
            [(invert(kf.pose) @ pred, "revisit"), (invert(kf.pose) @ last, "revisit")],
            False,
        )
        score = (hyp.ratio + 0.5 * hyp.tight) if hyp is not None else 0.0
        if passes(s, h) and h.ratio >= s.revisit_min_ratio and h.ratio + 0.5 * h.tight >= score:
            self.revisits += 1
            return h, kf.pose
        return hyp, last

    def _relocalise(self, src: View, glob: bool) -> tuple[Hypothesis | None, Mat4]:
        """Register against the keyframes nearest to the last pose (and the newest), from the
        last pose and from constant velocity; keep the best that passes the gate."""
        if not self.keyframes:
            return None, np.eye(4)
        last = self._last.pose if self._last is not None and self._last.pose is not None else None
        kfs = list(self.keyframes)
        if last is not None:
            kfs.sort(key=lambda k: float(np.linalg.norm(k.pose[:3, 3] - last[:3, 3])))
        cand = kfs[:3]
        if self.keyframes[-1] not in cand:
            cand.append(self.keyframes[-1])
        # frames lost since the last tracked one: a short loss (a fast turn) is bridged by
        # extrapolating the last step; after a longer one only the last pose is a start
        missed = 0
        for t in reversed(self.tracks):
            if t.pose is not None:
                break
            missed += 1
        best: tuple[Hypothesis, Mat4] | None = None
        for kf in cand:
            Tk = invert(kf.pose)
            inits = [(Tk @ last if last is not None else np.eye(4), "relocalised")]
            if last is not None and missed <= 3:
                # from the keyframe, constant velocity over the frames missed too (the gate
                # keeps the better; TUM cabinet: a fast turn at frame 44 lost 1 run in 3)
                inits.append(
                    (Tk @ last @ np.linalg.matrix_power(self._velocity, missed + 1), "relocalised")
                )
            hyp = best_hypothesis(self.s, src, kf.view, inits, glob)
            if passes(self.s, hyp) and (
                best is None or hyp.ratio + 0.5 * hyp.tight > best[0].ratio + 0.5 * best[0].tight
            ):
                best = (hyp, kf.pose)
        if best is None:
            return None, np.eye(4)
        # the best keyframe by the gate, not the first that passes (one run relocalised the
        # TUM cabinet's frame 45 20 cm off against the nearest keyframe)
        hyp, T_world_kf = best
        hyp.method = "relocalised" if self.lost else hyp.method
        return hyp, T_world_kf

    def _implausible(self, f: RGBDFrame, T: Mat4) -> str:
        if self._last is None or self._last.pose is None:
            return ""
        dt = max(abs(f.timestamp - self._last.timestamp), 1 / 30)
        step = float(np.linalg.norm(T[:3, 3] - self._last.pose[:3, 3]))
        turn = rotation_angle_deg(T, self._last.pose)
        if not self.lost and step > self.s.max_speed_mps * dt + 0.05:
            return f"tracking rejected: a jump of {step:.2f} m in {dt:.2f} s"
        if not self.lost and turn > self.s.max_turn_dps * dt + 5:
            return f"tracking rejected: a turn of {turn:.0f} deg in {dt:.2f} s"
        return ""

    def _accept(self, ft: FrameTrack) -> FrameTrack:
        kf = self.keyframes[-1]
        assert ft.pose is not None
        ft.keyframe = kf.node
        ft.T_kf_camera = invert(kf.pose) @ ft.pose
        if self._last is not None and self._last.pose is not None and not self.lost:
            self._velocity = invert(self._last.pose) @ ft.pose
        else:
            self._velocity = np.eye(4)
        self.lost = False
        self._last = ft
        self.tracks.append(ft)
        return ft

    def _fail(self, f: RGBDFrame, why: str) -> FrameTrack:
        ft = FrameTrack(f.index, f.timestamp, None, 0.0, "", clean_message(why))
        if self.keyframes:
            self.lost = True
        self._model = None
        self.tracks.append(ft)
        return ft

    # --- keyframes, loops, pose graph ----------------------------------------------------------
    def _add_keyframe(self, f: RGBDFrame, ft: FrameTrack, view: View) -> None:
        assert ft.pose is not None
        kf = Keyframe(len(self.keyframes), f.index, ft.pose.copy(), view)
        self.keyframes.append(kf)
        if self.s.loop_closure and len(self.keyframes) > 2:
            self.loop_edges += pose_graph.loop_edges_for(self.s, self.keyframes, kf)

    def optimise(self) -> dict[str, Any]:
        """Solve the keyframe pose graph and move every tracked frame with its keyframe
        (reconstruction/pose_graph.py). Returns its summary."""
        return pose_graph.optimise(self.s, self.keyframes, self.tracks, self.loop_edges)

    # --- summary -------------------------------------------------------------------------------
    def tracked_ratio(self) -> float:
        return (
            sum(t.pose is not None for t in self.tracks) / len(self.tracks) if self.tracks else 0.0
        )

    def longest_lost_s(self) -> float:
        """Longest stretch of time without a tracked frame (s)."""
        worst, start = 0.0, None
        last_ok: float | None = None
        for t in self.tracks:
            if t.pose is None:
                start = last_ok if start is None and last_ok is not None else start
                if start is None:
                    start = t.timestamp
            else:
                if start is not None:
                    worst = max(worst, t.timestamp - start)
                start = None
                last_ok = t.timestamp
        if start is not None and self.tracks:
            worst = max(worst, self.tracks[-1].timestamp - start)
        return worst

    def summary(self) -> dict[str, Any]:
        methods: dict[str, int] = {}
        for t in self.tracks:
            methods[t.method or "lost"] = methods.get(t.method or "lost", 0) + 1
        tracked = [t.inlier_ratio for t in self.tracks if t.pose is not None]
        return {
            "frames": len(self.tracks),
            "tracked": len(tracked),
            "tracked_ratio": round(self.tracked_ratio(), 4),
            "longest_lost_s": round(self.longest_lost_s(), 3),
            "keyframes": len(self.keyframes),
            "loop_edges": len(self.loop_edges),
            "relocalisations": self.relocalisations,
            "raycasts": self.raycasts,
            "revisits": self.revisits,
            "methods": methods,
            "inlier_ratio_median": round(float(np.median(tracked)), 3) if tracked else 0.0,
            "depth_range_m": [self.s.depth_min, self.s.depth_max],
            "icp_voxel_m": self.s.voxel,
        }
