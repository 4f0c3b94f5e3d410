"""The guided wrist-camera scan and calibration of a CONNECTED robot (virtual lab or
hardware, reached only through the robot protocol), as Qt-free jobs shared by the CLI, the
Scan page and `bench scan`. This is the one guided scan: the lab is just another robot.

- `calibrate_robot(client, ...)`: hand-eye calibration of the wrist camera from views of a
  ChArUco board lying on the table (reconstruction/calibration.py), plus every fixed camera
  that sees the same board (its T_base_camera). Views that turn the wrist about one axis
  only (a board laid where the path cannot look at it from enough directions) get views
  tilted about another axis added by the calibration itself, not asked of the user.
- `scan_robot(client, options, record=..., calibration=...)`: move the arm through the
  planned view path (reconstruction/scan_path.py), wait until it settles, grab a
  wrist-camera frame over the protocol and pair it with the joint state at the frame's
  timestamp (same robot clock), camera pose = FK(q) @ T_hand_camera (FK from the robot's own
  description, twins/), fixed-camera frames at their calibrated pose, TSDF integration and
  object segmentation (reconstruction pipeline) -> ScanResult.
- `scan_lab(...)`: the virtual lab started as its own processes (`lab serve`): the
  calibration set-up (board on the table), then the workspace; calibrate, then scan.

The numbers of the path (workspace centre, exclusion box, board centre, calibration orbit,
views added for rotation, second pass) live in app/workflows/scan_plan.py only; the arm's
moves, frame pairing and camera waits (sized to the camera's rate and the machine's load,
reported while they last) in app/workflows/connected_arm.py. The robot is left stopped at
the end, on error and on cancel (`gen.close()`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from app.workflows.connected_arm import ConnectedArm, camera_poses
from app.workflows.scan_frames import ScanOptions, reconstruct_frames
from app.workflows.scan_plan import (
    CalibrationPlan,
    Orbit,
    RobotScanError,
    RobotScanPlan,
)
from devices.cameras.software import SoftwareCamera
from devices.frames import Intrinsics, RGBDFrame
from devices.poses import rotation_angle_deg
from devices.robots.agent.launch import start_lab_process
from devices.robots.client import RobotClient
from reconstruction.calibration import (
    LacksRotationError,
    detect_board,
    fixed_camera,
    intrinsics_check,
    refine_with_depth,
)
from reconstruction.handeye import hand_eye, rotation_spread
from reconstruction.scan_path import tilted_views
from reconstruction.scan_process import ScanProcess
from reconstruction.scan_result import ScanResult
from reconstruction.tsdf import TSDFSettings
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress, sub_job

if TYPE_CHECKING:
    from reconstruction.board import BoardView
    from reconstruction.calibration import CalibrationResult
    from reconstruction.handeye import RotationSpread


class _Recorder:
    """Frames through the SDK's software device into a .db3 (with the scan's sidecar),
    renumbered: wrist and fixed frames become one gap-free stream."""

    def __init__(self, path: Path, first: RGBDFrame, name: str, meta: dict[str, Any]) -> None:
        self.cam = SoftwareCamera(first.intrinsics, first.depth_scale, record_path=path, name=name)
        self.cam.info.meta.update(meta)
        self.count = 0

    def push(self, frame: RGBDFrame) -> RGBDFrame:
        self.count += 1
        pushed: RGBDFrame = self.cam.push(
            replace(frame, index=self.count, timestamp=self.count / 30.0)
        )
        return pushed

    def close(self) -> None:
        self.cam.close()


def _jsonable(c: dict[str, Any]) -> dict[str, Any]:
    return {k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v) for k, v in c.items()}


def _stopped(opt: ScanOptions) -> bool:
    return opt.stop is not None and opt.stop.is_set()


def scan_robot(
    client: RobotClient,
    options: ScanOptions | None = None,
    record: Path | None = None,
    plan: RobotScanPlan | None = None,
    calibration: dict[str, Any] | None = None,
) -> Job[ScanResult]:
    """Guided wrist scan of the connected robot. `calibration` ({"T_hand_camera": 4x4, and
    "T_base_fixed" + "fixed_camera" when a fixed camera was calibrated} from
    `calibrate_robot`), or else the robot's NOMINAL camera mount pose."""
    opt = options or ScanOptions()
    plan = plan or RobotScanPlan()
    opt.exclude = opt.exclude or [
        (np.array(lo, float), np.array(hi, float)) for lo, hi in plan.exclude
    ]
    arm = ConnectedArm(client, plan.camera)
    rec: _Recorder | None = None
    sess: ScanProcess | None = None
    try:
        X, calib, T_fixed = _camera_calibration(arm, calibration)
        fixed = calib.get("fixed_camera")
        log: dict[str, Any] = {"unreachable": 0, "unsettled": 0, "paired": []}
        yield Progress(
            0.0,
            f"scanning with {arm.info.name} camera '{arm.camera}' ({calib['hand_camera_source']})",
        )
        sess = ScanProcess(TSDFSettings(voxel_size=opt.voxel_size, depth_max=opt.depth_max))
        first_pass = [T for orbit in plan.orbits() for T in orbit.targets(plan.centre)]
        fixed_frames: list[RGBDFrame] = []
        arm.prime_camera()  # the wrist camera starts while the fixed one is read
        if T_fixed is not None and plan.fixed_frames:
            yield Progress(0.0, f"fixed camera '{fixed}': {plan.fixed_frames} frames")
            grabbed = yield from arm.grab_fixed(str(fixed), plan.fixed_frames)
            fixed_frames = [replace(f, T_world_camera=T_fixed) for f in grabbed]
        yield from arm.wait_camera()
        stream: Iterator[RGBDFrame] = _chain(
            fixed_frames, camera_poses(arm, first_pass, X, plan, log)
        )
        if record is not None:
            rec, stream = _start_recording(record, stream, arm, X, calib, opt, T_fixed)
        second_share = 0.4 if plan.object_views else 0.0
        yield from sub_job(
            reconstruct_frames(
                stream,
                None,
                opt,
                session=sess,
                finish=False,
                total=len(first_pass) + len(fixed_frames),
            ),
            0.0,
            0.9 - second_share,
            "orbit: ",
        )
        if plan.object_views and plan.object_elevations_deg and not _stopped(opt):
            yield from _object_pass(arm, sess, plan, opt, X, log, rec)
        arm.stop()  # the arm is still for the segmentation
        res = yield from sub_job(
            reconstruct_frames(
                iter(()), None, opt, session=sess, T_base_camera=T_fixed, calibration=calib
            ),
            0.9,
            1.0,
        )
        assert res is not None
        return _with_scan_report(res, log, client, arm, len(fixed_frames), rec)
    finally:
        if rec is not None:
            rec.close()
        if sess is not None:
            sess.close()
        arm.stop()


def _camera_calibration(
    arm: ConnectedArm, calibration: dict[str, Any] | None
) -> tuple[NDArray[np.float64], dict[str, Any], NDArray[np.float64] | None]:
    """The wrist camera's pose on the hand (hand-eye, or else the nominal mount pose), the
    calibration as the scan stores it (JSON-ready, saying where T_hand_camera came from), and
    the fixed camera's pose when it was calibrated and the robot has it."""
    X = np.asarray((calibration or {}).get("T_hand_camera", arm.T_mount_camera_nominal))
    calib = _jsonable(calibration or {})
    calib.setdefault("T_hand_camera", X.tolist())
    calib["hand_camera_source"] = "hand-eye" if calibration else "nominal mount pose"
    fixed = calib.get("fixed_camera")
    T_fixed = np.asarray(calib["T_base_fixed"]) if fixed in arm.fixed_cameras else None
    return X, calib, T_fixed


def _start_recording(
    record: Path,
    stream: Iterator[RGBDFrame],
    arm: ConnectedArm,
    X: NDArray[np.float64],
    calib: dict[str, Any],
    opt: ScanOptions,
    T_fixed: NDArray[np.float64] | None,
) -> tuple[_Recorder, Iterator[RGBDFrame]]:
    """A recording of the scan's frames at `record` (opened on the first frame, with what
    a replay of it needs: camera mount, calibration, exclusion boxes, the fixed camera's
    pose), and the stream that passes every frame through it."""
    first = next(stream, None)
    if first is None:
        raise RobotScanError(f"robot {arm.info.name}: no view of the path is reachable")
    rec = _Recorder(
        record,
        first,
        f"Twinbench {arm.info.name} {arm.camera}",
        {
            "T_hand_camera": X.tolist(),
            "source": "robot",
            "robot": arm.info.name,
            "calibration": calib,
            "exclude": [[lo.tolist(), hi.tolist()] for lo, hi in opt.exclude],
            **({"T_base_camera": T_fixed.tolist()} if T_fixed is not None else {}),
        },
    )
    return rec, (rec.push(f) for f in _chain([first], stream))


def _object_pass(
    arm: ConnectedArm,
    sess: ScanProcess,
    plan: RobotScanPlan,
    opt: ScanOptions,
    X: NDArray[np.float64],
    log: dict[str, Any],
    rec: _Recorder | None,
) -> Job[None]:
    """The second pass: an orbit around each object the first pass found on the table, at
    the plan's elevations, into the same session (and recording)."""
    try:
        plane, clusters = sess.table_objects(opt.seed, list(opt.exclude))
    except TwinbenchError as exc:
        clusters = []
        yield Progress(None, f"no objects for a second pass ({exc})")
    second = [
        T
        for cl in clusters
        for el in plan.object_elevations_deg
        for T in Orbit(
            plan.object_distance, el, plan.object_views, plan.object_azimuth_deg
        ).targets(tuple(cl.footprint_centre(plane)), base_azimuth_deg=0)
    ]
    more = camera_poses(arm, second, X, plan, log)
    if rec is not None:
        more = (rec.push(f) for f in more)
    yield from sub_job(
        reconstruct_frames(more, None, opt, session=sess, finish=False, total=len(second)),
        0.5,
        0.9,
        "objects: ",
    )


def _with_scan_report(
    res: ScanResult,
    log: dict[str, Any],
    client: RobotClient,
    arm: ConnectedArm,
    n_fixed_frames: int,
    rec: _Recorder | None,
) -> ScanResult:
    """The result with what the scan met (views out of reach, views before the arm settled)
    among its warnings, and how it was captured (robot, camera, views, paired joint states,
    the recording's SDK and device) in its capture record."""
    warnings = list(res.warnings)
    if log["unreachable"]:
        warnings.append(f"{log['unreachable']} views of the path were out of reach")
    if log["unsettled"]:
        warnings.append(f"{log['unsettled']} views taken before the arm had settled")
    capture = {
        **res.capture,
        "source": "robot",
        "robot": arm.info.name,
        "robot_address": client.address,
        "camera": arm.camera,
        "views": len(log["paired"]),
        "fixed_frames": n_fixed_frames,
        "paired_states": log["paired"],
    }
    if rec is not None:
        capture.update({"sdk_version": rec.cam.info.sdk_version, "device": rec.cam.info.device})
    return replace(res, warnings=tuple(warnings), capture=capture)


def _chain(first: list[RGBDFrame], rest: Iterator[RGBDFrame]) -> Iterator[RGBDFrame]:
    yield from first
    yield from rest


def calibrate_robot(
    client: RobotClient,
    views: int | None = None,
    board_centre: tuple[float, float, float] | None = None,
    plan: RobotScanPlan | None = None,
    calibration_plan: CalibrationPlan | None = None,
) -> Job[dict[str, Any]]:
    """Hand-eye calibration of the wrist camera from ChArUco board views (the board lying on
    the table near the plan's board centre: the lab's panda_calib scene), robot moved along
    the guided calibration path; then every fixed camera that sees the board gets its
    T_base_camera from the board's base pose ("T_base_fixed", "fixed_camera", "fixed").
    Views that turn the wrist about one axis only get views tilted about another added
    ("extra_views", see `CalibrationPlan`). Raises RobotScanError when no view is reachable
    or the added views still lack that rotation (CalibrationError from too few boards)."""

    plan = plan or RobotScanPlan()
    cp = calibration_plan or CalibrationPlan()
    cp = replace(
        cp,
        views=views if views is not None else cp.views,
        board_centre=board_centre if board_centre is not None else cp.board_centre,
    )
    arm = ConnectedArm(client, plan.camera)
    try:
        X0 = arm.T_mount_camera_nominal
        targets = cp.targets()
        taken: list[_CalibView] = []
        missed: list[int] = []
        intr = None
        q = client.latest_state().joint_pos
        arm.prime_camera()
        for i, T in enumerate(targets):
            qt = arm.solve(T, X0, q, roll_free=not cp.hold_roll)
            if qt is not None:
                q = qt
                f, cv, _ = yield from _calibration_view(arm, i, qt, plan)
                intr = f.intrinsics
                if cv is None:
                    missed.append(i)
                else:
                    taken.append(cv)
            yield Progress(
                0.9 * (i + 1) / len(targets),
                f"calibration view {i + 1}/{len(targets)}: {len(taken)} boards found",
            )
        if intr is None:
            raise RobotScanError(f"robot {arm.info.name}: no calibration view is reachable")
        he, used, unsteady, extra = yield from _hand_eye_turning_enough(
            arm, taken, missed, intr, cp, plan, first_index=len(targets)
        )
        found = [v.view for v in used]
        out: dict[str, Any] = {
            "T_hand_camera": he.T,
            "hand_eye": he.summary(),
            "board_missed_views": missed,
            "unsteady_views_left_out": unsteady,
            "intrinsics_check": intrinsics_check(found, intr),
        }
        if extra["rounds"]:
            out["extra_views"] = extra
        for name in arm.fixed_cameras:
            yield Progress(0.95, f"fixed camera '{name}': looking for the board")
            fviews = []
            frames = yield from arm.grab_fixed(name, cp.fixed_frames)
            for f in frames:
                v = detect_board(f)
                if v is not None:
                    fviews.append(refine_with_depth(v, f))
            if not fviews:
                out.setdefault("fixed_not_calibrated", []).append(name)
                continue
            fc = fixed_camera(fviews, he.T_base_board, frames[0].intrinsics, depth_refined=True)
            if "fixed_camera" not in out:  # the scan uses the first one
                out.update({"fixed_camera": name, "T_base_fixed": fc.T, "fixed": fc.summary()})
        yield Progress(1.0, f"hand-eye from {len(found)} board views")
        return out
    finally:
        arm.stop()


@dataclass
class _CalibView:
    """One calibration view with the board found: the wrist pose at the frame's time, the
    board, how far the arm moved over the grab window, the joint target it was taken at."""

    index: int
    hand: NDArray[np.float64]
    view: BoardView
    motion: float
    q: NDArray[np.float64]


def _calibration_view(
    arm: ConnectedArm, index: int, qt: NDArray[np.float64], plan: RobotScanPlan
) -> Job[tuple[RGBDFrame, _CalibView | None, bool]]:
    """Move to `qt`, grab a frame when still: (frame, the view if the board is in it,
    whether the arm got to `qt`: every joint within `REACHED_RAD`)."""

    t_settled, _ = arm.move(qt, plan)
    yield from arm.wait_camera()
    f, qf = arm.grab(t_settled)
    reached = bool(np.max(np.abs(qf - qt)) < REACHED_RAD)
    v = detect_board(f)
    if v is None:
        return f, None, reached
    view = _CalibView(index, arm.fk(qf), v, arm.last_motion_rad, np.asarray(qt, float))
    return f, view, reached


def _steady(views: list[_CalibView], min_rotation_deg: float) -> tuple[list[_CalibView], int]:
    """Views where the arm never held still (a loaded machine: the joints read at the
    frame's time may be off) are left out while enough steady ones remain: at least
    `MIN_STEADY_VIEWS`, and turning the wrist about two axes where all the views do.
    Returns (views kept, how many left out)."""

    steady = [v for v in views if v.motion <= UNSTEADY_RAD]
    if len(steady) == len(views) or len(steady) < MIN_STEADY_VIEWS:
        return list(views), 0

    def lacking(vs: list[_CalibView]) -> bool:
        return rotation_spread([v.hand for v in vs]).lacking_axis(min_rotation_deg) is not None

    if lacking(steady) and not lacking(views):
        return list(views), 0
    return steady, len(views) - len(steady)


def _hand_eye_turning_enough(
    arm: ConnectedArm,
    views: list[_CalibView],
    missed: list[int],
    intr: Intrinsics,
    cp: CalibrationPlan,
    plan: RobotScanPlan,
    first_index: int,
) -> Job[tuple[CalibrationResult, list[_CalibView], int, dict[str, Any]]]:
    """Hand-eye from the steady views; while they turn the wrist about one axis only (the
    second axis of their rotation spread under `cp.min_rotation_deg`, or the closed form
    finds the motion degenerate), add views tilted about the lacking axis (reachable ones,
    within the plan's bounds) and solve again. When no more can be added: the hand-eye
    with a warning if it solves and the views turn at least `cp.fail_rotation_deg` about
    a second axis, else RobotScanError saying what was tried. Returns
    (result, views used, unsteady views left out, what was added)."""

    X0 = arm.T_mount_camera_nominal
    extra: dict[str, Any] = {"rounds": 0, "tried": 0, "reachable": 0, "added": 0, "boards": 0}
    tried: list[NDArray[np.float64]] = []
    no_more = False
    while True:
        used, unsteady = _steady(views, cp.min_rotation_deg)
        hands = [v.hand for v in used]
        spread = rotation_spread(hands) if len(hands) >= 3 else None
        lacking = spread.lacking_axis(cp.min_rotation_deg) if spread is not None else None
        exhausted = (
            no_more or extra["added"] >= cp.max_extra_views or extra["tried"] >= cp.max_extra_tries
        )
        hopeless = (
            exhausted and spread is not None and float(spread.std_deg[1]) < cp.fail_rotation_deg
        )
        if (lacking is None or exhausted) and not hopeless:
            try:
                he = hand_eye(hands, [v.view for v in used], intr)
            except LacksRotationError:
                if spread is None:
                    raise
                lacking = 1
            else:
                if lacking is not None and spread is not None:
                    he.warnings.append(
                        f"{_turns_about_one_axis(spread, lacking)}, even after "
                        f"{extra['added']} views added tilted about it: the calibration "
                        "is weakly determined along that axis"
                    )
                return he, used, unsteady, extra
        assert spread is not None and lacking is not None
        axis = spread.axis_name(lacking)
        why = _turns_about_one_axis(spread, lacking)
        if exhausted:
            raise RobotScanError(
                f"robot {arm.info.name}: hand-eye calibration needs the wrist turned about "
                f"two axes, but {why}, and the calibration could not add enough views "
                f"tilted about it: it tried {extra['tried']} poses turned ±{cp.tilt_deg:g} "
                f"deg about it through the board centre ({extra['reachable']} reachable, "
                f"{extra['added']} taken, {extra.get('not_reached', 0)} not reached by the "
                f"arm, {extra['boards']} with the board found; {unsteady} views left out "
                "where the arm never held still). Lay the board where the arm can look at it "
                "from more directions (nearer the robot, in front of it) and calibrate again."
            )
        extra["rounds"] += 1
        extra.setdefault("why", []).append(why)
        candidates = tilted_views(
            [v.hand @ X0 for v in used],
            spread.axis_in_base(lacking),
            cp.board_centre,
            (cp.tilt_deg, -cp.tilt_deg),
            cp.min_elevation_deg,
        )
        yield Progress(0.9, f"{why}: adding views tilted ±{cp.tilt_deg:g} deg about it")
        tried_now = got = 0
        for i, T in candidates:
            if (
                got >= cp.extra_per_round
                or extra["added"] >= cp.max_extra_views
                or extra["tried"] >= cp.max_extra_tries
            ):
                break
            if any(_same_pose(T, t) for t in tried):
                continue
            tried.append(T)
            extra["tried"] += 1
            tried_now += 1
            qt = arm.solve(T, X0, used[i].q, roll_free=False)
            if qt is None:
                continue
            extra["reachable"] += 1
            index = first_index + extra["added"]
            _, cv, reached = yield from _calibration_view(arm, index, qt, plan)
            extra["added"] += 1
            if not reached:  # stopped short (a safety limit, a stopped robot): no new turn
                extra["not_reached"] = extra.get("not_reached", 0) + 1
            elif cv is None:
                missed.append(index)
            else:
                views.append(cv)
                extra["boards"] += 1
                got += 1
            yield Progress(
                0.9,
                f"extra view {extra['added']} tilted about {axis}: "
                + (
                    "the arm did not get there"
                    if not reached
                    else "board found"
                    if cv is not None
                    else "no board"
                ),
            )
        no_more = tried_now == 0


def _turns_about_one_axis(spread: RotationSpread, k: int) -> str:
    return (
        f"the views turn the wrist about one axis only (±{spread.std_deg[k]:.1f} deg "
        f"about {spread.axis_name(k)}, ±{spread.std_deg[2]:.1f} deg about "
        f"{spread.axis_name(2)})"
    )


def _same_pose(a: NDArray[np.float64], b: NDArray[np.float64]) -> bool:
    return bool(np.linalg.norm(a[:3, 3] - b[:3, 3]) < 0.01 and rotation_angle_deg(a, b) < 2.0)


REACHED_RAD = 0.01  # an added calibration view counts where every joint got this close
UNSTEADY_RAD = 2e-3  # a calibration view whose joints moved more over its grab window...
MIN_STEADY_VIEWS = 8  # ... is left out while at least this many steady views remain
LAB_CAMERA_SIZE = "640x480"  # the lab cameras render D435-like 640x480 for scans


def _lab_robot(scene: str, config: Path | None, what: str) -> Job[tuple[Any, RobotClient]]:
    """Start `lab serve` for `scene` as its own process and connect to it."""

    yield Progress(None, f"starting the virtual lab ({what}: {scene})…")
    lab = start_lab_process(scene, config, camera_size=LAB_CAMERA_SIZE, camera_fps=15)
    try:
        client = RobotClient(lab.host, lab.port, lab.token, name="twinbench-scan")
        client.connect()
    except BaseException:
        lab.terminate()
        raise
    return lab, client


def scan_lab(
    options: ScanOptions | None = None,
    config: Path | None = None,
    record: Path | None = None,
    quick: bool = False,
    calibration_config: Path | None = None,
    calibration: dict[str, Any] | None = None,
) -> Job[ScanResult]:
    """Scan the virtual lab through the robot protocol, as a user would a real cell: with
    the board on the table (lab scene panda_calib, truth `calibration_config`) calibrate the
    wrist and fixed cameras, then (scene panda_table, truth `config`) run the guided scan.
    Each lab is its own process, stopped before this returns. `calibration` skips the
    first step."""
    plan = RobotScanPlan.quick() if quick else RobotScanPlan()
    if calibration is None:
        lab, client = yield from _lab_robot("panda_calib", calibration_config, "calibration")
        try:
            calibration = yield from sub_job(
                calibrate_robot(client, plan=plan),  # 12 views even when quick: ~30 s
                0.0,
                0.25,
                "calibrating: ",
            )
        finally:
            client.close()
            lab.terminate()
    lab, client = yield from _lab_robot("panda_table", config, "scan")
    try:
        res = yield from sub_job(
            scan_robot(client, options, record, plan, calibration), 0.25, 1.0, "scan: "
        )
    finally:
        client.close()
        lab.terminate()
    return replace(res, capture={**res.capture, "source": "lab"})
