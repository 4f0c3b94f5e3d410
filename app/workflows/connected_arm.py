"""The connected robot as a guided scan sees it (app/workflows/scan_robot.py): forward
kinematics of its own description, guarded moves that wait until the arm is still, and
wrist-camera frames paired with the joint state at their timestamp — all through the robot
protocol."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.workflows.scan_plan import RobotScanError, RobotScanPlan
from devices.errors import DeviceError
from devices.frames import RGBDFrame
from devices.robots.client import RobotClient


class ConnectedArm:
    """The connected robot as a scan sees it: FK of its description, guarded moves,
    frames paired with joint states."""

    def __init__(self, client: RobotClient, camera: str | None = None) -> None:
        from devices.poses import pose_to_matrix
        from twins.kinematics import RobotKinematics

        info = client.info
        if info is None:
            raise RobotScanError(f"robot at {client.address}: not connected")
        self.client, self.info = client, info
        self.last_motion_rad = 0.0  # how far the arm moved over the last `grab`'s window
        cams = [c for c in info.cameras if f"camera/{c}/nominal_T_mount_camera" in info.meta]
        if camera is None:
            if not cams:
                raise RobotScanError(
                    f"robot {info.name} at {client.address} reports no wrist "
                    f"camera with a mount pose (cameras: {list(info.cameras)})"
                )
            camera = cams[0]
        if camera not in cams:
            raise RobotScanError(
                f"robot {info.name}: camera '{camera}' has no mount pose (wrist cameras: {cams})"
            )
        self.camera = camera
        self.fixed_cameras = [c for c in info.cameras if c not in cams]
        self.mount = str(info.meta.get(f"camera/{camera}/mount_body", ""))
        self.T_mount_camera_nominal = pose_to_matrix(
            info.meta[f"camera/{camera}/nominal_T_mount_camera"]
        )
        self.kin = RobotKinematics.from_description(info.description, info.joint_names)
        self.lower, self.upper = np.asarray(info.limits.lower), np.asarray(info.limits.upper)
        self._frames: Iterator[RGBDFrame] | None = None
        self._primer: Any = None

    def prime_camera(self) -> None:
        """Subscribe to the camera now, in the background: its first frame can take seconds
        (the robot side starts its renderer / sensor) and overlaps the first move."""
        import threading

        frames = self.frames()
        self._prime_error: BaseException | None = None

        def prime() -> None:
            try:
                next(frames)
            except BaseException as exc:  # noqa: BLE001 - re-raised by grab()
                self._prime_error = exc

        self._primer = threading.Thread(target=prime, name="scan-camera-prime", daemon=True)
        self._primer.start()

    def fk(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.kin.link_pose(self.mount, q)

    def frames(self) -> Iterator[RGBDFrame]:
        if self._frames is None:
            # generous: the first frame may wait for the robot side to start its camera
            self._frames = self.client.camera_frames(self.camera, timeout_s=15.0)
        return self._frames

    def solve(
        self, T_base_camera: NDArray[np.float64], X: NDArray[np.float64], q0: NDArray[np.float64]
    ) -> NDArray[np.float64] | None:
        from reconstruction.scan_path import solve_view

        q, pe, ae = solve_view(self.fk, q0, T_base_camera, X, self.lower, self.upper)
        return q if pe <= 0.005 and ae <= 2.0 else None

    def move(self, q_target: NDArray[np.float64], plan: RobotScanPlan) -> tuple[float, bool]:
        """Interpolate position commands to `q_target`, then wait until settled.
        Returns (robot time when settled, settled within the timeout)."""
        import time

        q0 = self.client.latest_state().joint_pos
        dur = max(float(np.max(np.abs(q_target - q0))) / plan.speed_rad_s, 0.05)
        t0 = time.monotonic()
        while (s := (time.monotonic() - t0) / dur) < 1.0:
            self.client.command_position(q0 + (q_target - q0) * (3 * s * s - 2 * s**3))
            time.sleep(0.01)
        self.client.command_position(q_target)
        end = time.monotonic() + plan.settle_timeout_s
        while True:
            st = self.client.latest_state()
            ok = (
                np.max(np.abs(st.joint_pos - q_target)) < plan.settle_tol_rad
                and np.max(np.abs(st.joint_vel)) < plan.settle_vel_rad_s
            )
            if ok or time.monotonic() > end:
                return st.t, ok
            time.sleep(0.01)

    def grab(
        self, t_after: float, window_s: float = 0.3, still_rad: float = 1e-3, tries: int = 8
    ) -> tuple[RGBDFrame, NDArray[np.float64]]:
        """A frame taken after robot time `t_after` while the arm is still (no joint moves
        more than `still_rad` over the window; else the stillest of `tries` windows), with
        the joint positions at its timestamp: a line through the window's states, per joint,
        read at the frame's time (averages the encoder noise, follows a slow creep)."""
        frames = self.frames()
        if self._primer is not None:
            self._primer.join(timeout=20.0)
            self._primer = None
            if self._prime_error is not None:
                raise self._prime_error
        found: tuple[float, RGBDFrame, NDArray[np.float64]] | None = None
        for _ in range(tries):
            traj = self.client.stream(window_s)
            t, q = traj.t, traj.channels["robot/joint_pos"]
            best = None
            for _ in range(12):
                f = next(frames, None)
                if f is None:
                    raise RobotScanError(
                        f"robot {self.info.name}: camera '{self.camera}' stream ended"
                    )
                if f.timestamp < t_after or f.timestamp < t[0]:
                    continue
                if f.timestamp > t[-1]:
                    break
                best = f
            if best is None or len(t) < 3:
                continue
            slope, qf = np.polyfit(t - best.timestamp, q, 1)
            motion = float(np.max(np.abs(slope)) * (t[-1] - t[0]))
            if found is None or motion < found[0]:
                found = (motion, best, np.asarray(qf, float))
            if motion <= still_rad:
                break
        if found is None:
            raise RobotScanError(
                f"robot {self.info.name}: camera '{self.camera}' frame timestamps "
                f"never fall inside the state stream (different clocks?)"
            )
        self.last_motion_rad = found[0]
        return found[1], found[2]

    def grab_fixed(self, camera: str, n: int) -> list[RGBDFrame]:
        """`n` consecutive frames of fixed camera `camera` (the first one skipped: it may
        predate the subscription)."""
        frames = self.client.camera_frames(camera, timeout_s=15.0)
        try:
            next(frames)
            return [next(frames) for _ in range(n)]
        finally:
            frames.close()

    def stop(self) -> None:
        """Stop and release the robot; never raises (used in finally blocks)."""
        if self._primer is not None:
            self._primer.join(timeout=20.0)
            self._primer = None
        if self._frames is not None:
            try:
                self._frames.close()  # type: ignore[attr-defined]
            except ValueError:  # still waiting for its first frame in the primer
                pass
            self._frames = None
        try:
            if self.client.connected:
                self.client.stop("scan finished")
        except DeviceError:
            pass
        self.kin.close()


def camera_poses(
    arm: ConnectedArm,
    targets: list[NDArray[np.float64]],
    X: NDArray[np.float64],
    plan: RobotScanPlan,
    out: dict[str, Any],
) -> Iterator[RGBDFrame]:
    """Frames at the targets with T_world_camera = FK(q at the frame) @ X."""
    q = arm.client.latest_state().joint_pos
    arm.prime_camera()
    for T in targets:
        qt = arm.solve(T, X, q)
        if qt is None:
            out["unreachable"] += 1
            continue
        q = qt
        t_settled, ok = arm.move(qt, plan)
        if not ok:
            out["unsettled"] += 1
        f, qf = arm.grab(t_settled)
        out["paired"].append({"frame_t": f.timestamp, "joint_pos": qf.tolist()})
        yield replace(f, T_world_camera=arm.fk(qf) @ X)
