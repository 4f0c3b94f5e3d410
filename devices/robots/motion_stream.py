"""The one way the workbench streams a planned joint motion to a robot (issue 25):
record's library motions, the lab's demo motion, Add robot's test motion and the guided
scan's moves all go through `MotionStream`.

    stream = MotionStream(client, motion)        # checked here: MotionError, nothing moved
    for progress in stream.play():               # takes control, streams, stops the arm
        ...

Before the first command, always: the plan is for this robot's joints and a command mode
it takes, it starts where the arm is (position motions), it fits the limits the robot
reports narrowed by the envelope settings its agent reports (`motion.limits_for`,
`check_motion`), and it keeps the arm inside the robot's workspace box, judged by the
robot's own kinematics (`check_poses`, position plans); a plan that does not is refused with a `MotionError` naming the robot, the
joint and the limit. The robot's own envelope still guards every command (§7). `play()`
streams at `rate_hz` (default the robot's control rate, at most `MAX_SEND_HZ`), yields
`Progress` (resources/jobs.py) about ten times a second, and stops
(holds) the arm on error, on cancel (`close()` of the generator) and on `stop_event`; at
the end too unless `stop_when_done=False` (a caller that holds the last pose itself).

It lives on the workbench side of devices/robots, below app/: every caller above (workflows, the robot link, the GUI's dialogs) can use it.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from devices.errors import DeviceError
from devices.robots.client import RobotClient
from devices.robots.motion import Limits, Motion, MotionError, check_motion, limits_for
from resources.jobs import Job, Progress

log = logging.getLogger(__name__)

START_TOL_RAD = 0.02  # a position motion must start this close to where the arm is
MAX_SEND_HZ = 250.0
BOX_POSES = 500  # plan samples checked against the workspace box (the agent's limit)
BOX_TOL_M = 0.002  # the envelope's own tolerance for measured overshoot


class MotionStopped(DeviceError):
    """The operator stopped a streaming motion (`stop_event`); the robot is held."""


def robot_limits(client: RobotClient) -> Limits:
    """The limits a motion streamed to `client`'s robot must fit: the limits it reports,
    narrowed by the envelope settings its agent reports (its own limits alone when the agent
    reports none)."""
    info = client.info
    if info is None:
        raise DeviceError(f"robot at {client.address}: not connected")
    try:
        safety = client.status().get("safety")
    except DeviceError as exc:  # an agent that does not report it: the robot's own limits
        log.info("robot %s reports no envelope settings (%s); checking its limits", info.name, exc)
        safety = None
    return limits_for(info, safety if isinstance(safety, dict) else None)


class MotionStream:
    """`motion` checked for `client`'s robot (at construction) and streamed by `play()`.
    `sent` counts the commands sent; `t_robot_start` is the robot time at which the plan's
    t=0 was first commanded (NaN before)."""

    def __init__(
        self,
        client: RobotClient,
        motion: Motion,
        *,
        rate_hz: float | None = None,
        pre_s: float = 0.0,
        post_s: float = 0.0,
        stop_event: threading.Event | None = None,
        stop_when_done: bool = True,
        start_tol_rad: float = START_TOL_RAD,
        take_control: bool = True,
    ) -> None:
        info = client.info
        if info is None:
            raise DeviceError(f"robot at {client.address}: not connected")
        self.client, self.motion, self.info = client, motion, info
        self.pre_s, self.post_s = float(pre_s), float(post_s)
        self.stop_event, self.stop_when_done = stop_event, stop_when_done
        self.start_tol_rad = float(start_tol_rad)
        self.take_control = take_control
        self.rate_hz = float(min(rate_hz or info.control_rate_hz, MAX_SEND_HZ))
        self.sent = 0
        self.t_robot_start = float("nan")
        self.limits = self.check()

    @property
    def where(self) -> str:
        return f"robot {self.info.name} at {self.client.address}"

    def check(self) -> Limits:
        """Refuse (MotionError naming the robot and what breaks) a plan this robot must not
        get: other joints, a mode it does not take, a start away from the arm, or a plan
        outside the limits it reports. Returns the limits checked against."""
        info, motion = self.info, self.motion
        if tuple(info.joint_names) != tuple(motion.joint_names):
            raise MotionError(
                f"motion '{motion.name}' was planned for joints {list(motion.joint_names)}, "
                f"robot {info.name} has {list(info.joint_names)}; plan it for this robot"
            )
        if motion.mode not in info.command_modes:
            raise MotionError(
                f"robot {info.name} does not take {motion.mode} commands "
                f"({list(info.command_modes)})"
            )
        if len(motion.t) < 2 or not np.all(np.diff(motion.t) > 0):
            raise MotionError(f"motion '{motion.name}': its times must increase")
        limits = robot_limits(self.client)
        problems = check_motion(motion, limits)
        if problems:
            more = "" if len(problems) <= 6 else f" (and {len(problems) - 6} more)"
            raise MotionError(
                f"{self.where} refused '{motion.name}' before moving: "
                + "; ".join(problems[:6])
                + more
            )
        self._check_box()
        self._check_start()
        return limits

    def _check_box(self) -> None:
        """Refuse a position plan that takes the arm out of the robot's workspace box (or a
        link below its floor) further than it starts, judged by the robot itself: its
        envelope's box and its driver's kinematics (`RobotClient.box_distances`) on up to
        `BOX_POSES` samples of the plan. An agent without that request is only logged: its
        envelope still stops the arm at the box."""
        motion = self.motion
        if motion.mode != "position":
            return
        n = len(motion.t)
        idx = np.unique(np.linspace(0, n - 1, min(n, BOX_POSES)).round().astype(int))
        try:
            out = self.client.box_distances(motion.command[idx])
        except DeviceError as exc:
            log.info("%s: plan not checked against the workspace box (%s)", self.where, exc)
            return
        if out is None:  # no box, or no kinematics on the robot's side
            return
        d = np.asarray(out, float)
        worse = d > d[0] + BOX_TOL_M
        if worse.any():
            k = int(np.argmax(d))
            first = int(np.argmax(worse))
            raise MotionError(
                f"{self.where} refused '{motion.name}' before moving: it takes the arm out of "
                f"the robot's workspace box from t={motion.t[idx[first]]:.2f} s, by up to "
                f"{d[k] * 1e3:.0f} mm at t={motion.t[idx[k]]:.2f} s (the robot would stop it "
                "there); plan a smaller motion, or widen the box in the robot's safety settings"
            )

    def _check_start(self) -> None:
        if self.motion.mode != "position":
            return
        q_now = self.client.latest_state().joint_pos
        off = np.abs(q_now - self.motion.start)
        if float(off.max()) > self.start_tol_rad:
            j = int(np.argmax(off))
            raise MotionError(
                f"robot {self.info.name} moved since '{self.motion.name}' was planned (joint "
                f"{self.info.joint_names[j]} is {off[j]:.3f} rad from the start pose); plan "
                "it again"
            )

    def play(self) -> Job[None]:
        """Take control (unless `take_control` is off: a caller that holds it for a series
        of moves, where a stop in between must end the series, not be cleared by the next
        move) and stream the checked plan: `pre_s` holding its start, the plan, `post_s`
        holding its end. Yields Progress; stops the arm on error, cancel and
        `stop_event` (MotionStopped), and at the end unless `stop_when_done` is off."""
        motion, client = self.motion, self.client
        self._check_start()  # the arm may have moved since the plan was checked
        hold = motion.at(0.0)
        total = self.pre_s + motion.duration + self.post_s
        yield Progress(
            0.0,
            f"{motion.name}: "
            + (f"taking control of {self.info.name}" if self.take_control else "moving"),
        )
        done = False
        try:
            if self.take_control:
                client.take_control()
            session = client.epoch  # a link that drops and reconnects mid-motion ends it
            every = max(int(self.rate_hz / 10), 1)
            t0 = time.monotonic()
            while True:
                now = time.monotonic() - t0
                if self.stop_event is not None and self.stop_event.is_set():
                    raise MotionStopped(
                        f"'{motion.name}' stopped by the operator after {now:.1f} s; "
                        f"{self.info.name} is held"
                    )
                if now >= total:
                    break
                tm = now - self.pre_s
                if tm < 0:
                    u = hold
                else:
                    if not np.isfinite(self.t_robot_start):
                        self.t_robot_start = client.latest_state().t
                    u = motion.at(min(tm, motion.duration))
                client.check(session)
                client.command(motion.mode, u)
                self.sent += 1
                if self.sent % every == 0:
                    yield Progress(
                        min(now / total, 0.99) if total > 0 else 0.99,
                        f"{motion.name}: {max(tm, 0.0):.1f} / {motion.duration:.1f} s",
                    )
                time.sleep(max(0.0, t0 + self.sent / self.rate_hz - time.monotonic()))
            client.check(session)
            done = True
        finally:
            if not done or self.stop_when_done:
                self.halt(f"'{motion.name}' ended" + ("" if done else " before its end"))
        yield Progress(1.0, f"{motion.name}: done ({self.sent} commands)")

    def halt(self, reason: str) -> None:
        """Stop (hold) the robot; never raises (used in finally blocks)."""
        try:
            if self.client.connected:
                self.client.stop(reason)
        except DeviceError as exc:
            log.warning("could not stop %s after '%s': %s", self.where, self.motion.name, exc)


def ramp_to(
    name: str,
    joint_names: tuple[str, ...],
    q0: np.ndarray,
    q1: np.ndarray,
    limits: Limits,
    speed_rad_s: float,
    rate_hz: float = 100.0,
    use: float = 0.9,
) -> Motion:
    """A smooth move (smoothstep, zero speed at both ends) from q0 to q1 at about
    `speed_rad_s` on the joint that moves most, slowed where needed to keep within `use` of
    `limits`' speed and acceleration."""
    q0, q1 = np.asarray(q0, float), np.asarray(q1, float)
    d = np.abs(q1 - q0)
    dur = max(float(d.max()) / max(speed_rad_s, 1e-9), 0.05)
    # smoothstep: peak speed 1.5 d / T, peak acceleration 6 d / T^2
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.concatenate(
            [1.5 * d / (use * limits.velocity), np.sqrt(6 * d / (use * limits.accel))]
        )
    need = need[np.isfinite(need)]  # a joint that cannot move at all: the check refuses it
    dur = max(dur, float(need.max()) if need.size else 0.0)
    n = max(int(np.ceil(dur * rate_hz)) + 1, 2)
    t = np.linspace(0.0, dur, n)
    s = t / dur
    shape = 3 * s**2 - 2 * s**3
    return Motion(
        name,
        {"speed_rad_s": speed_rad_s},
        t,
        q0 + np.outer(shape, q1 - q0),
        tuple(joint_names),
        description=f"move to a pose at up to {speed_rad_s:g} rad/s",
    )
