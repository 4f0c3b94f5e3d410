"""Model-based tracking of scanned objects in a depth stream (one pose per object per frame).

Each frame's depth is lifted to world points (camera pose given by the caller: calibration for
a fixed camera, FK x hand-eye for a wrist camera). Points on the table (below
`table_clearance` over the table plane), outside the workspace box, or within `robot_margin`
of the robot's surface are dropped: the robot is given as world-frame points sampled on its
links at the frame's time (the caller runs the robot's forward kinematics; this layer knows
no robot). Every remaining point near an object's predicted pose is assigned to the nearest
predicted object surface, so neighbours do not pull each other.

Per object, point-to-plane ICP (robust Tukey kernel) runs coarse-to-fine from two guesses:
constant velocity from the last two tracked frames, then "no motion". The estimate is
checked against the frame by rendering the model's camera-facing surface into the depth
image: a pixel whose measured depth agrees explains the model, one measured *behind* the
model contradicts it, one in front is an occlusion (the robot's hand, another object) and
does not count. `quality` = explained / (explained + contradicted), times an inlier-RMSE
factor, scaled down when less than `min_visible` of the model's front pixels are seen at
all (a box behind the hand: the sliver left does not pin its pose), in 0..1; below
`lost_quality` (or with too few explained pixels) the object is lost for that frame. A lost object is re-detected by FPFH + RANSAC global registration of its
model against the unexplained points above the table, refined by ICP and accepted only
above `accept_quality`.

Poses are `T_world_object` of the model's own frame (the scan's object frame).
Open3D stays in this module; values in and out are numpy arrays and trimesh meshes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import open3d as o3d
import trimesh
from numpy.typing import NDArray
from scipy.spatial import cKDTree
from scipy.spatial.transform import Rotation

from devices.frames import RGBDFrame
from devices.poses import invert
from reconstruction.object_track_types import (
    FrameTracks,
    Mat4,
    ObjectModel,
    ObjectTrack,
    ObjectTrackingError,
    ObjectTrackSettings,
)
from reconstruction.segment import Plane

_reg = o3d.pipelines.registration


@dataclass
class _State:
    model: ObjectModel
    pts: NDArray[np.float64]  # (M, 3) object frame
    nrm: NDArray[np.float64]  # (M, 3) object frame
    radius: float
    centre: NDArray[np.float64]  # object frame
    fpfh: o3d.pipelines.registration.Feature
    down: o3d.geometry.PointCloud  # model downsampled for global registration
    history: list[tuple[float, Mat4]] = field(default_factory=list)  # tracked (t, T)
    lost: bool = False


def _model_samples(
    mesh: trimesh.Trimesh, n: int, seed: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    pts, face = trimesh.sample.sample_surface_even(mesh, n, seed=seed)
    if len(pts) < n // 2:  # even sampling can reject many on thin meshes
        pts, face = trimesh.sample.sample_surface(mesh, n, seed=seed)
    return np.asarray(pts, float), np.asarray(mesh.face_normals[face], float)


def _cloud(p: NDArray[np.float64], n: NDArray[np.float64] | None = None) -> o3d.geometry.PointCloud:
    pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.ascontiguousarray(p)))
    if n is not None:
        pc.normals = o3d.utility.Vector3dVector(np.ascontiguousarray(n))
    return pc


def _transform(T: Mat4, p: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.asarray(p @ T[:3, :3].T + T[:3, 3])


def _fpfh(pc: o3d.geometry.PointCloud, voxel: float) -> o3d.pipelines.registration.Feature:
    if not pc.has_normals():
        pc.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(2.5 * voxel, 30))
    return _reg.compute_fpfh_feature(  # type: ignore[call-arg]  # stubs demand `indices`
        pc, o3d.geometry.KDTreeSearchParamHybrid(5 * voxel, 100)
    )


class ObjectTracker:
    """Tracks `models` frame by frame (`update`). Not thread-safe; one per camera stream."""

    def __init__(
        self,
        models: Sequence[ObjectModel],
        table: Plane | None = None,
        settings: ObjectTrackSettings | None = None,
    ) -> None:
        if not models:
            raise ObjectTrackingError("object tracking: no object models given")
        self.settings = s = settings or ObjectTrackSettings()
        if not (len(s.voxels) == len(s.max_corr) == len(s.iterations)) or not s.voxels:
            raise ObjectTrackingError(
                "object tracking: voxels, max_corr and iterations need one value per ICP level"
            )
        self.table = table
        self.states: dict[str, _State] = {}
        for i, m in enumerate(models):
            if m.name in self.states:
                raise ObjectTrackingError(f"object tracking: object '{m.name}' given twice")
            if len(m.mesh.faces) == 0 or not np.isfinite(m.mesh.vertices).all():
                raise ObjectTrackingError(
                    f"object tracking: the mesh of object '{m.name}' is empty or not finite"
                )
            T0 = np.asarray(m.T_world_object, float)
            if T0.shape != (4, 4) or not np.isfinite(T0).all():
                raise ObjectTrackingError(
                    f"object tracking: initial pose of '{m.name}' must be a finite 4x4 matrix"
                )
            pts, nrm = _model_samples(m.mesh, s.model_points, s.seed + i)
            centre = 0.5 * (pts.min(0) + pts.max(0))
            down = _cloud(pts, nrm).voxel_down_sample(s.redetect_voxel)
            self.states[m.name] = _State(
                m,
                pts,
                nrm,
                float(np.max(np.linalg.norm(pts - centre, axis=1))),
                centre,
                _fpfh(down, s.redetect_voxel),
                down,
                [(float("nan"), T0)],
            )

    # -- points of one frame -------------------------------------------------------------------
    def _lift(
        self, frame: RGBDFrame, T_wc: Mat4, robot_points: NDArray[np.float64] | None
    ) -> tuple[NDArray[np.float64], NDArray[np.float32], NDArray[np.bool_]]:
        """(world points kept, depth image on the stride grid, robot-pixel mask)."""
        s = self.settings
        K = frame.intrinsics
        z = frame.depth_m[:: s.stride, :: s.stride]
        h, w = z.shape
        v, u = np.mgrid[0:h, 0:w]
        u, v = u * s.stride, v * s.stride
        valid = (z > s.depth_range[0]) & (z < s.depth_range[1])
        zc = z[valid].astype(float)
        pc = np.stack([(u[valid] - K.cx) / K.fx * zc, (v[valid] - K.cy) / K.fy * zc, zc], 1)
        pw = _transform(T_wc, pc)
        keep = np.ones(len(pw), bool)
        if self.table is not None:
            keep &= self.table.height(pw) > s.table_clearance
        if s.workspace is not None:
            lo, hi = np.asarray(s.workspace[0]), np.asarray(s.workspace[1])
            keep &= np.all((pw >= lo) & (pw <= hi), axis=1)
        robot = np.zeros((h, w), bool)
        if robot_points is not None and len(robot_points):
            # only above the table: the table and what is below it are never an object
            idx = np.flatnonzero(keep)
            rp = np.asarray(robot_points, float).reshape(-1, 3)
            d, _ = cKDTree(rp).query(pw[idx], distance_upper_bound=s.robot_margin)
            near = idx[np.isfinite(d)]
            keep[near] = False
            flat = np.zeros(len(pw), bool)
            flat[near] = True
            robot[valid] = flat
        return pw[keep], z, robot

    # -- the visibility check ----------------------------------------------------------------
    def _check(
        self,
        st: _State,
        T: Mat4,
        T_cw: Mat4,
        frame: RGBDFrame,
        z: NDArray[np.float32],
        robot: NDArray[np.bool_],
        rmse: float,
    ) -> tuple[float, int]:
        """(quality 0..1, explained pixels) of pose T against the frame's depth."""
        s = self.settings
        M = T_cw @ T
        p = _transform(M, st.pts)
        n = st.nrm @ M[:3, :3].T
        front = (np.sum(n * p, axis=1) < 0) & (p[:, 2] > 0.05)
        p = p[front]
        if not len(p):
            return 0.0, 0
        K = frame.intrinsics
        h, w = z.shape
        u = np.floor((p[:, 0] / p[:, 2] * K.fx + K.cx) / s.stride + 0.5).astype(int)
        v = np.floor((p[:, 1] / p[:, 2] * K.fy + K.cy) / s.stride + 0.5).astype(int)
        inside = (u >= 0) & (u < w) & (v >= 0) & (v < h)
        idx = v[inside] * w + u[inside]
        zb = np.full(h * w, np.inf)
        np.minimum.at(zb, idx, p[inside, 2])
        px = np.unique(idx)
        zm, zo = zb[px], z.reshape(-1)[px].astype(float)
        seen = (zo > 0) & ~robot.reshape(-1)[px]
        tau = s.agree_m + 0.004 * zm * zm
        diff = zo - zm
        explained = int(np.sum(seen & (np.abs(diff) <= tau)))
        contradicted = int(np.sum(seen & (diff > tau)))
        if explained + contradicted == 0:
            return 0.0, 0
        support = explained / (explained + contradicted)
        # mostly hidden (the hand in front of it): what is left may not pin the pose down
        visible = (explained + contradicted) / len(px)
        support *= min(1.0, visible / s.min_visible)
        fine = s.max_corr[-1]
        fit = float(np.clip(1.0 - rmse / (2 * fine), 0.0, 1.0)) if np.isfinite(rmse) else 0.0
        return support * fit, explained

    # -- ICP -----------------------------------------------------------------------------------
    def _icp(
        self, st: _State, T_guess: Mat4, obs: NDArray[np.float64], levels: int | None = None
    ) -> tuple[Mat4, float, int]:
        """(refined T_world_object, inlier RMSE at the last level run, inlier count);
        `levels`: only the first (coarsest) few levels."""
        s = self.settings
        target = _cloud(_transform(T_guess, st.pts), st.nrm @ T_guess[:3, :3].T)
        source_full = _cloud(obs)
        D = np.eye(4)  # maps observed points onto the model at T_guess
        rmse, count = float("nan"), 0
        schedule = list(zip(s.voxels, s.max_corr, s.iterations, strict=True))[:levels]
        for voxel, corr, iters in schedule:
            src = source_full.voxel_down_sample(voxel) if voxel > 0 else source_full
            if len(src.points) < 6:
                return T_guess, float("nan"), 0
            crit = _reg.ICPConvergenceCriteria(1e-5, 1e-5, iters)
            plane = _reg.TransformationEstimationPointToPlane(_reg.TukeyLoss(k=corr))
            res = _reg.registration_icp(src, target, corr, D, plane, crit)
            step = np.asarray(res.transformation) @ invert(D)
            if not len(res.correspondence_set) or np.linalg.norm(step[:3, 3]) > 2 * corr:
                # point-to-plane is singular when the visible surface leaves a direction
                # unconstrained (a cylinder lying on its side: along and about its axis) and
                # then diverges; point-to-point (closed form) just leaves that direction be
                point = _reg.TransformationEstimationPointToPoint(False)
                res = _reg.registration_icp(src, target, corr, D, point, crit)
            D = np.asarray(res.transformation)
            rmse, count = float(res.inlier_rmse), len(res.correspondence_set)
        return invert(D) @ T_guess, rmse, count

    def _predict(self, st: _State, t: float) -> list[Mat4]:
        """Constant-velocity guess from the last two tracked poses, then the last pose."""
        t1, T1 = st.history[-1]
        guesses = []
        if len(st.history) >= 2 and np.isfinite(t1) and not st.lost:
            t0, T0 = st.history[-2]
            if np.isfinite(t0) and t1 > t0 and np.isfinite(t):
                k = (t - t1) / (t1 - t0)
                T = np.eye(4)
                rot = Rotation.from_matrix(T1[:3, :3] @ T0[:3, :3].T).as_rotvec()
                T[:3, :3] = Rotation.from_rotvec(rot * k).as_matrix() @ T1[:3, :3]
                T[:3, 3] = T1[:3, 3] + (T1[:3, 3] - T0[:3, 3]) * k
                guesses.append(T)
        guesses.append(T1)
        return guesses

    # -- re-detection ------------------------------------------------------------------------
    def _redetect(self, st: _State, scene: NDArray[np.float64]) -> Mat4 | None:
        s = self.settings
        if len(scene) < s.min_points:
            return None
        pc = _cloud(scene).voxel_down_sample(s.redetect_voxel)
        if len(pc.points) < s.min_points:
            return None
        feat = _fpfh(pc, s.redetect_voxel)
        corr = 1.5 * s.redetect_voxel
        o3d.utility.random.seed(s.seed)
        with o3d.utility.VerbosityContextManager(o3d.utility.VerbosityLevel.Error):
            res = _reg.registration_ransac_based_on_feature_matching(
                st.down,
                pc,
                st.fpfh,
                feat,
                True,
                corr,
                _reg.TransformationEstimationPointToPoint(False),
                3,
                [
                    _reg.CorrespondenceCheckerBasedOnEdgeLength(0.9),
                    _reg.CorrespondenceCheckerBasedOnDistance(corr),
                ],
                _reg.RANSACConvergenceCriteria(40000, 0.999),
            )
        if res.fitness <= 0:
            return None
        return np.asarray(res.transformation)

    # -- one frame -----------------------------------------------------------------------------
    def update(
        self,
        frame: RGBDFrame,
        T_world_camera: Mat4,
        robot_points: NDArray[np.float64] | None = None,
    ) -> FrameTracks:
        """Track every object in `frame` seen from `T_world_camera` (4x4); `robot_points`
        (N, 3) world points on the robot's surface at the frame's time, or None."""
        T_wc = np.asarray(T_world_camera, float)
        if T_wc.shape != (4, 4) or not np.isfinite(T_wc).all():
            raise ObjectTrackingError(
                f"object tracking: frame {frame.index}: camera pose must be a finite 4x4 matrix"
            )
        s = self.settings
        t = float(frame.timestamp)
        pts, z, robot = self._lift(frame, T_wc, robot_points)
        T_cw = invert(T_wc)
        guesses = {n: self._predict(st, t) for n, st in self.states.items()}
        # assign each point near a predicted object to the nearest predicted surface
        names = list(self.states)
        best = np.full(len(pts), np.inf)
        owner = np.full(len(pts), -1)
        for i, n in enumerate(names):
            st = self.states[n]
            G = guesses[n][0]
            c = _transform(G, st.centre[None])[0]
            near = np.linalg.norm(pts - c, axis=1) < st.radius + s.crop_margin
            if not near.any():
                continue
            d, _ = cKDTree(_transform(G, st.pts)).query(pts[near])
            sub = np.flatnonzero(near)
            closer = d < best[sub]
            best[sub[closer]] = d[closer]
            owner[sub[closer]] = i
        out: dict[str, ObjectTrack] = {}
        explained = np.zeros(len(pts), bool)
        for i, n in enumerate(names):
            st = self.states[n]
            obs = pts[owner == i]
            track = None
            if len(obs) >= s.min_points:
                for j, G in enumerate(guesses[n]):
                    T, rmse, cnt = self._icp(st, G, obs)
                    q, sup = self._check(st, T, T_cw, frame, z, robot, rmse)
                    ok = q >= s.lost_quality and sup >= s.min_support_px and cnt >= s.min_points
                    cand = ObjectTrack(T, q, not ok, rmse, sup, "track" if j == 0 else "hold")
                    if track is None or cand.quality > track.quality:
                        track = cand
                    if ok and q >= s.confident_quality:
                        break  # else the next guess may explain the frame better
            if track is None or track.lost:
                track = self._found_again(st, pts, owner, i, explained, T_cw, frame, z, robot) or (
                    ObjectTrack(
                        st.history[-1][1], track.quality if track else 0.0, True, method="lost"
                    )
                )
            if not track.lost and track.T_world_object is not None:
                st.lost = False
                if track.method == "redetect":
                    st.history = []  # no velocity across a loss
                st.history = [*st.history[-1:], (t, track.T_world_object)]
                c = _transform(track.T_world_object, st.centre[None])[0]
                near = np.flatnonzero(np.linalg.norm(pts - c, axis=1) < st.radius + s.crop_margin)
                d, _ = cKDTree(_transform(track.T_world_object, st.pts)).query(pts[near])
                explained[near[d < s.max_corr[-1]]] = True
            else:
                st.lost = True
            out[n] = track
        return FrameTracks(t, int(frame.index), out)

    def _found_again(
        self,
        st: _State,
        pts: NDArray[np.float64],
        owner: NDArray[np.int64],
        i: int,
        explained: NDArray[np.bool_],
        T_cw: Mat4,
        frame: RGBDFrame,
        z: NDArray[np.float32],
        robot: NDArray[np.bool_],
    ) -> ObjectTrack | None:
        """Global re-detection among points no tracked object explains."""
        s = self.settings
        free = ~explained & ((owner == -1) | (owner == i))
        # first near where it was seen last (tipped, spun, knocked a few cm), then anywhere
        T_last = st.history[-1][1]
        c_last = _transform(T_last, st.centre[None])[0]
        near = free & (np.linalg.norm(pts - c_last, axis=1) < s.search_radius)
        guesses: list[Mat4] = []
        if near.sum() >= s.min_points:
            c = pts[near].mean(0)
            for R in _CUBE_ROTATIONS:
                G = np.eye(4)
                G[:3, :3] = T_last[:3, :3] @ R
                G[:3, 3] = c - G[:3, :3] @ st.centre
                guesses.append(G)
        # every orientation at the coarse level only; the best few all the way
        coarse = []
        for G in guesses:
            c = _transform(G, st.centre[None])[0]
            obs = pts[free & (np.linalg.norm(pts - c, axis=1) < st.radius + s.crop_margin)]
            if len(obs) >= s.min_points:
                T, rmse, cnt = self._icp(st, G, obs, levels=1)
                if cnt:
                    coarse.append((cnt / (1.0 + rmse / s.max_corr[0]), T))
        coarse.sort(key=lambda x: -x[0])
        best: ObjectTrack | None = None
        for _, G in coarse[:3]:
            cand = self._refine(st, G, pts, free, T_cw, frame, z, robot)
            if cand is not None and (best is None or cand.quality > best.quality):
                best = cand
        if best is None:
            found = self._redetect(st, pts[free])
            if found is not None:
                best = self._refine(st, found, pts, free, T_cw, frame, z, robot)
        return best

    def _refine(
        self,
        st: _State,
        G: Mat4,
        pts: NDArray[np.float64],
        free: NDArray[np.bool_],
        T_cw: Mat4,
        frame: RGBDFrame,
        z: NDArray[np.float32],
        robot: NDArray[np.bool_],
    ) -> ObjectTrack | None:
        """ICP from a re-detection guess over the free points around it; None unless the
        result passes the (stricter) acceptance check."""
        s = self.settings
        c = _transform(G, st.centre[None])[0]
        obs = pts[free & (np.linalg.norm(pts - c, axis=1) < st.radius + s.crop_margin)]
        if len(obs) < s.min_points:
            return None
        T, rmse, cnt = self._icp(st, G, obs)
        q, sup = self._check(st, T, T_cw, frame, z, robot, rmse)
        if q < s.accept_quality or sup < s.min_support_px or cnt < s.min_points:
            return None
        return ObjectTrack(T, q, False, rmse, sup, "redetect")


def _cube_rotations() -> list[NDArray[np.float64]]:
    """The 24 rotations mapping the coordinate axes onto themselves."""
    out = []
    for perm in ((0, 1, 2), (1, 2, 0), (2, 0, 1), (1, 0, 2), (0, 2, 1), (2, 1, 0)):
        for signs in np.ndindex(2, 2, 2):
            R = np.zeros((3, 3))
            for r, (c, sgn) in enumerate(zip(perm, signs, strict=True)):
                R[r, c] = -1.0 if sgn else 1.0
            if np.linalg.det(R) > 0:
                out.append(R)
    return out


_CUBE_ROTATIONS = _cube_rotations()
