"""Scan workflows (Qt-free jobs shared by the CLI and the Scan page).

- `reconstruct_frames(frames, ...)`: any RGBDFrame stream -> ScanResult, yielding live
  previews (colour/depth, growing point cloud) at `preview_hz`.
- `scan_recording(path)`: a .db3/.bag; poses from the capture sidecar, else RGB-D odometry.
- `scan_realsense()`: a live camera, handheld (odometry).
- `scan_lab()`: the virtual lab in-process: hand-eye calibration of the wrist camera on a
  ChArUco board, the fixed camera from the same board, a guided wrist-camera scan path
  (orbit, then views around each object found), frames recorded to .db3 through the SDK.
- `save_scan(project, result)`: the ScanResult as a project artifact.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.jobs import Job, Progress
from app.project import Project
from devices.errors import DataFileError
from devices.frames import RGBDFrame
from reconstruction.pipeline import ScanSession, SegmentSettings
from reconstruction.scan_result import ScanResult
from reconstruction.tsdf import TSDFSettings

PoseFn = Callable[[RGBDFrame], NDArray[np.float64] | None]


@dataclass
class ScanOptions:
    voxel_size: float = 0.004
    depth_max: float = 1.1
    preview_hz: float = 10.0
    triangle_budget: int = 4000
    seed: int = 0
    max_frames: int | None = None
    stop: threading.Event | None = None  # set -> stop acquiring, reconstruct what we have
    exclude: list[tuple[NDArray[np.float64], NDArray[np.float64]]] = field(default_factory=list)


@dataclass
class FramePreview:
    """Partial result: the newest frame (for the colour/depth preview)."""

    color: NDArray[np.uint8]
    depth_m: NDArray[np.float32]
    index: int


@dataclass
class CloudPreview:
    """Partial result: the reconstruction so far (points in the base frame). `points` is the
    fused surface (refreshed as often as its extraction allows); `live` is the newest frame's
    depth in the base frame (every preview)."""

    points: NDArray[np.float32] | None
    colors: NDArray[np.uint8] | None
    frames: int
    camera: NDArray[np.float64] | None
    live: NDArray[np.float32] | None = None


def frame_points(
    f: RGBDFrame, T: NDArray[np.float64] | None, stride: int = 4
) -> NDArray[np.float32] | None:
    """The frame's depth as base-frame points (every `stride`-th pixel), for live previews."""
    if T is None:
        return None
    d = f.depth[::stride, ::stride].astype(np.float32) * np.float32(f.depth_scale)
    v, u = np.nonzero(d > 0)
    z = d[v, u]
    i = f.intrinsics
    p = np.column_stack([(u * stride - i.cx) / i.fx * z, (v * stride - i.cy) / i.fy * z, z])
    return (p @ T[:3, :3].T + T[:3, 3]).astype(np.float32)


class _Throttle:
    def __init__(self, hz: float) -> None:
        self.dt, self.last = 1.0 / hz if hz > 0 else 0.0, -1e9

    def ready(self) -> bool:
        now = time.perf_counter()
        if now - self.last >= self.dt:
            self.last = now
            return True
        return False


def reconstruct_frames(
    frames: Iterable[RGBDFrame],
    pose_of: PoseFn | None = None,
    options: ScanOptions | None = None,
    track: bool = False,
    session: ScanSession | None = None,
    finish: bool = True,
    T_base_camera: NDArray[np.float64] | None = None,
    calibration: dict[str, Any] | None = None,
    total: int | None = None,
) -> Job[ScanResult | None]:
    """Integrate a frame stream; a stream that breaks (truncated file) keeps what it had."""
    opt = options or ScanOptions()
    sess = session or ScanSession(
        TSDFSettings(voxel_size=opt.voxel_size, depth_max=opt.depth_max), track=track
    )
    thr = _Throttle(opt.preview_hz)
    fused_cost, last_fused = 0.0, -1e9
    warnings: list[str] = []
    n = 0
    it: Iterator[RGBDFrame] = iter(frames)
    while True:
        try:
            f = next(it)
        except StopIteration:
            break
        except DataFileError as exc:
            warnings.append(f"recording ended early: {exc}")
            yield Progress(None, f"recording broken after {n} frames; keeping them")
            break
        pose = pose_of(f) if pose_of is not None else f.T_world_camera
        sess.add(f, pose)
        n += 1
        if thr.ready():
            pts = cols = None
            now = time.perf_counter()
            if now - last_fused >= 5 * fused_cost:  # fused surface: <= 20 % of the time
                pv = sess.preview()
                pts, cols = pv.points, pv.colors
                fused_cost, last_fused = time.perf_counter() - now, time.perf_counter()
            frac = None if not total else min(n / total, 1.0) * 0.9
            yield Progress(
                frac,
                f"frame {f.index}: {sess.tsdf.frames_integrated} integrated, "
                f"{len(sess.skipped)} skipped",
                {
                    "frame": FramePreview(f.color, f.depth_m, f.index),
                    "cloud": CloudPreview(
                        pts,
                        cols,
                        sess.tsdf.frames_integrated,
                        sess.last_pose,
                        frame_points(f, sess.last_pose),
                    ),
                },
            )
        if opt.max_frames and n >= opt.max_frames:
            break
        if opt.stop is not None and opt.stop.is_set():
            warnings.append(f"stopped by the user after {n} frames")
            break
    if not finish:
        return None
    yield Progress(0.9, "segmenting table and objects")
    seg = SegmentSettings(
        seed=opt.seed,
        up=None if track else (0.0, 0.0, 1.0),
        triangle_budget=opt.triangle_budget,
        exclude=opt.exclude,
    )
    res = sess.finish(seg, T_base_camera, calibration)
    if warnings:
        from dataclasses import replace

        res = replace(res, warnings=tuple(warnings) + res.warnings)
    yield Progress(1.0, f"{len(res.objects)} objects, {len(res.scene_mesh.faces)} triangles")
    return res


def scan_recording(path: Path, options: ScanOptions | None = None) -> Job[ScanResult]:
    """Reconstruct a RealSense recording. Poses: the sidecar's (lab/robot scans), else
    odometry (handheld)."""
    from devices.cameras.playback import PlaybackSource

    src = PlaybackSource(Path(path))
    opt = options or ScanOptions()
    if src.info is not None and src.info.meta.get("exclude") and not opt.exclude:
        opt.exclude = [(np.asarray(lo), np.asarray(hi)) for lo, hi in src.info.meta["exclude"]]
    with src:
        track = src.info is None or not src.info.poses
        yield Progress(
            0.0,
            f"playing {path} ({src.duration_s:.1f} s, {'odometry' if track else 'recorded poses'})",
        )
        total = src.info.frames if src.info is not None else None
        res = yield from reconstruct_frames(src.frames(), None, opt, track=track, total=total)
        assert res is not None
        extra = [*src.warnings]
        if src.dropped:
            extra.append(
                f"{len(src.dropped)} frames missing from the recording (first: {src.dropped[:5]})"
            )
        from dataclasses import replace

        capture = {
            **res.capture,
            "recording": str(path),
            "sdk_version_recorded": src.info.sdk_version if src.info else None,
            "frames_read": src.frames_read,
            "dropped": src.dropped,
        }
        calib = src.info.meta.get("calibration", {}) if src.info else {}
        T = src.info.meta.get("T_base_camera") if src.info else None
        return replace(
            res,
            warnings=tuple(extra) + res.warnings,
            capture=capture,
            calibration=calib or res.calibration,
            T_base_camera=np.asarray(T) if T is not None else res.T_base_camera,
        )


def scan_realsense(
    options: ScanOptions | None = None, record: Path | None = None, frames: int = 300
) -> Job[ScanResult]:
    """Handheld scan with a live RealSense (odometry poses)."""
    from devices.cameras.realsense import RealSenseSource

    opt = options or ScanOptions()
    opt.max_frames = frames
    cam = RealSenseSource()
    if record is not None:
        cam.record_to(record)
    with cam:
        res = yield from reconstruct_frames(cam.frames(), None, opt, track=True, total=frames)
    assert res is not None
    return res


def rename_object(result: ScanResult, old: str, new: str) -> ScanResult:
    """The scan with object `old` called `new` (names must stay unique and file-safe)."""
    return result.renamed(old, new)


def drop_object(result: ScanResult, name: str) -> ScanResult:
    return result.without(name)


def recolor_object(result: ScanResult, name: str, rgb: tuple[int, int, int]) -> ScanResult:
    return result.recolored(name, rgb)


def save_scan(
    project: Project,
    result: ScanResult,
    recording: Path | None = None,
    inputs: tuple[str, ...] = (),
    settings: dict[str, Any] | None = None,
    parent: str | None = None,
) -> str:
    """Write `result` (and its recording + sidecar) as a new scan artifact; returns its id."""
    summary = f"{len(result.objects)} objects, {len(result.scene_mesh.faces)} triangles" + (
        f", {len(result.warnings)} warnings" if result.warnings else ""
    )
    with project.new_artifact(
        "scan", inputs=inputs, settings=settings or {}, summary=summary, parent=parent
    ) as folder:
        result.save(folder)
        if recording is not None and Path(recording).is_file():
            from devices.cameras.source import sidecar_path

            shutil.copy2(recording, folder / "recording.db3")
            if sidecar_path(recording).is_file():
                shutil.copy2(sidecar_path(recording), sidecar_path(folder / "recording.db3"))
    art = project.artifacts("scan")[-1]
    return art.id


BOARD_CENTRE = np.array([0.435, 0.0, 0.0])  # where the user laid the ChArUco board, roughly


@dataclass
class LabRig:
    """The in-process lab robot and cameras, as a scan sees them (no truth except the
    virtual board, see `board_frame`)."""

    sim: Any
    wrist: Any
    fixed: Any
    T_hand_camera_nominal: NDArray[np.float64]
    q: NDArray[np.float64]

    @classmethod
    def start(
        cls, config: Path | None, width: int = 640, height: int = 480, board: bool = False
    ) -> LabRig:
        """The lab's panda_table, or (`board`) the same robot and cameras with the ChArUco
        board lying on the table instead of the objects (the calibration set-up)."""
        import dataclasses

        from devices.lab import panda
        from devices.lab.camera import LabCamera
        from devices.lab.config import LabConfig
        from devices.lab.scenes import panda_calib_config, panda_table_config
        from devices.lab.sim import LabSim
        from devices.poses import pose_to_matrix

        cfg = LabConfig.load(config) if config is not None else panda_table_config()
        if board:
            cfg = dataclasses.replace(
                cfg, scene="panda_calib", objects=(), board=panda_calib_config().board
            )
        sim = LabSim(cfg.scene, cfg)
        X = pose_to_matrix(sim.info().meta["camera/wrist/nominal_T_mount_camera"])
        return cls(
            sim,
            LabCamera(sim, "wrist", width, height),
            LabCamera(sim, "fixed", width, height),
            X,
            np.array(panda.READY_POSE),
        )

    def fk(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        from devices.lab import panda

        return self.sim.body_pose(panda.HAND_BODY, q)  # type: ignore[no-any-return]

    def go(
        self, T_base_camera: NDArray[np.float64], T_hand_camera: NDArray[np.float64]
    ) -> NDArray[np.float64] | None:
        """Move so the wrist camera is at T_base_camera; returns the measured hand pose."""
        from reconstruction.scan_path import solve_view

        lim = self.sim.info().limits
        q, pe, ae = solve_view(self.fk, self.q, T_base_camera, T_hand_camera, lim.lower, lim.upper)
        if pe > 0.005 or ae > 2.0:
            return None
        self.q = q
        self.sim.write_command("position", q)
        self.sim.run_for(1.0)
        return self.fk(self.sim.read_state().joint_pos)

    def close(self) -> None:
        self.wrist.close()
        self.fixed.close()


def calibrate_lab(config: Path | None = None, views: int = 12) -> Job[dict[str, Any]]:
    """Hand-eye of the wrist camera and T_base_camera of the fixed camera, from views of the
    ChArUco board lying on the lab table (robot moved by the guided calibration path)."""
    rig = LabRig.start(config, board=True)
    try:
        return (yield from _calibrate(rig, views))
    finally:
        rig.close()


def _calibrate(rig: LabRig, views: int) -> Job[dict[str, Any]]:
    from reconstruction.calibration import (
        detect_board,
        fixed_camera,
        hand_eye,
        intrinsics_check,
        refine_with_depth,
    )
    from reconstruction.scan_path import orbit_targets

    centre = BOARD_CENTRE
    targets = orbit_targets(centre, 0.42, 60, views * 2 // 3, (-70, 70)) + orbit_targets(
        centre, 0.35, 75, views - views * 2 // 3, (-120, 120)
    )
    hands, found, missed = [], [], []
    for i, T in enumerate(targets):
        Th = rig.go(T, rig.T_hand_camera_nominal)
        if Th is None:
            continue
        v = detect_board(rig.wrist.grab())
        if v is None:
            missed.append(i)
        else:
            hands.append(Th)
            found.append(v)
        yield Progress(
            (i + 1) / len(targets),
            f"calibration view {i + 1}/{len(targets)}: {len(found)} boards found",
        )
    he = hand_eye(hands, found, rig.wrist.intrinsics)
    check = intrinsics_check(found, rig.wrist.intrinsics)
    fviews = []
    for _ in range(3):
        f = rig.fixed.grab()
        v = detect_board(f)
        if v is not None:
            fviews.append(refine_with_depth(v, f))
    fc = fixed_camera(fviews, he.T_base_board, rig.fixed.intrinsics, depth_refined=True)
    return {
        "T_hand_camera": he.T,
        "T_base_fixed": fc.T,
        "hand_eye": he.summary(),
        "fixed": fc.summary(),
        "board_missed_views": missed,
        "intrinsics_check": check,
    }


def lab_scan_job(
    opt: ScanOptions,
    config: Path | None,
    record: Path | None,
    quick: bool = False,
    calibration: dict[str, Any] | None = None,
) -> Job[ScanResult]:
    from devices.cameras.software import SoftwareCamera
    from reconstruction.scan_path import orbit_targets
    from reconstruction.segment import cluster_objects, fit_table_plane

    if calibration is None:
        calibration = yield from _sub(
            calibrate_lab(config, 8 if quick else 12), 0.0, 0.25, "calibrating: "
        )
    rig = LabRig.start(config)
    opt.exclude = opt.exclude or [(np.array([-0.3, -0.3, -0.1]), np.array([0.2, 0.3, 1.5]))]
    cam = None
    try:
        X, Tf = calibration["T_hand_camera"], calibration["T_base_fixed"]
        sess = ScanSession(TSDFSettings(voxel_size=opt.voxel_size, depth_max=opt.depth_max))
        cam = SoftwareCamera(
            rig.wrist.intrinsics, 0.001, record_path=record, name="Twinbench lab cameras"
        )
        cam.info.meta.update(
            {
                "T_hand_camera": np.asarray(X).tolist(),
                "T_base_camera": np.asarray(Tf).tolist(),
                "source": "lab",
                "exclude": [[lo.tolist(), hi.tolist()] for lo, hi in opt.exclude],
                "calibration": _json_calib(calibration),
            }
        )
        counter = [0]

        def shots(targets: list[NDArray[np.float64]]) -> Iterator[RGBDFrame]:
            for T in targets:
                Th = rig.go(T, X)
                if Th is None:
                    continue
                yield _through(cam, rig.wrist.grab(), Th @ X, counter)

        centre = np.array([0.57, 0.0, 0.03])
        n1 = 8 if quick else 10
        first = orbit_targets(centre, 0.55, 55, n1, (-80, 80)) + (
            [] if quick else orbit_targets(centre, 0.5, 70, 8, (-150, 150))
        )
        fixed_frames = [_through(cam, rig.fixed.grab(), Tf, counter) for _ in range(3)]
        yield from _sub(
            reconstruct_frames(
                chain(fixed_frames, shots(first)),
                None,
                opt,
                session=sess,
                finish=False,
                total=len(first) + 3,
            ),
            0.25,
            0.6,
            "orbit: ",
        )
        # guided second pass: views around each object found so far
        pts, cols = sess.tsdf.points()
        try:
            plane, _ = fit_table_plane(pts, seed=opt.seed, up=np.array([0.0, 0, 1]))
            clusters = cluster_objects(pts, cols, plane, exclude=opt.exclude)
        except Exception as exc:  # noqa: BLE001 - a failed preview only skips the 2nd pass
            clusters = []
            yield Progress(None, f"no objects for a second pass ({exc})")
        if opt.stop is not None and opt.stop.is_set():
            clusters = []
        second = [
            T
            for cl in clusters
            for el in ((40,) if quick else (35, 55))
            for T in orbit_targets(
                cl.footprint_centre(plane),
                0.5,
                el,
                6 if quick else 8,
                (-180, 135),
                base_azimuth_deg=0,
            )
        ]
        res = yield from _sub(
            reconstruct_frames(
                shots(second),
                None,
                opt,
                session=sess,
                T_base_camera=Tf,
                calibration=_json_calib(calibration),
                total=len(second),
            ),
            0.6,
            1.0,
            "objects: ",
        )
        assert res is not None
        from dataclasses import replace

        return replace(
            res,
            capture={
                **res.capture,
                "sdk_version": cam.info.sdk_version,
                "device": cam.info.device,
                "source": "lab",
            },
        )
    finally:
        if cam is not None:
            cam.close()
        rig.close()


def _through(cam: Any, frame: RGBDFrame, T: NDArray[np.float64], counter: list[int]) -> RGBDFrame:
    """Renumber, attach the pose and pass the frame through the SDK (and its recorder)."""
    from dataclasses import replace

    counter[0] += 1
    return cam.push(
        replace(
            frame,
            index=counter[0],
            timestamp=counter[0] / 30.0,  # type: ignore[no-any-return]
            T_world_camera=np.asarray(T, float),
        )
    )


def _json_calib(c: dict[str, Any]) -> dict[str, Any]:
    return {k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v) for k, v in c.items()}


def _sub(job: Job[Any], lo: float, hi: float, prefix: str) -> Job[Any]:
    from app.jobs import sub_job

    return (yield from sub_job(job, lo, hi, prefix))


def scan_lab(
    options: ScanOptions | None = None,
    config: Path | None = None,
    record: Path | None = None,
    quick: bool = False,
) -> Job[ScanResult]:
    """Scan the virtual lab in-process: calibrate, guided wrist scan, fixed camera."""
    return (yield from lab_scan_job(options or ScanOptions(), config, record, quick))
