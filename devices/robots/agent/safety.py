"""The safety envelope: every command passes through it, whatever its source.

Limits act on two things. On the **command**: NaN/inf (always stops), joint position
limits, joint velocity limits, maximum change per control tick, joint effort limits, and the
end-effector workspace box (via the driver's forward kinematics). On the **measured state**,
every tick, so that the limits hold on what the robot does and not only on what it is told:
position targets move at most at SOFT_SPEED x the limit (the measured joint overshoots its
target's speed) and may lead the measured joints by at most `lead_s` of full speed and not at
all while a joint is at its speed limit, the lead shrinking at a bounded deceleration (a
target snapped back brakes the big joints so hard that they fling the wrist); every mode approaches a position limit no faster
than it can brake there (`brake_decel`); torque commands get a velocity-dependent torque
limit (damping injection near the speed limit); and a measured speed above
`measured_velocity_factor` x its limit, a joint moving further past its position limit, or
the end effector moving further out of the box stops the robot. A command that moves back
towards the safe set (inside the limits and the box) is always let through, so the robot
is never stranded at an edge. On a command violation the envelope either clamps the command
to the nearest safe value or asks for a stop, as configured, and always reports which
limits acted.

Limits default to the robot's own (`RobotInfo.limits`; workspace box from
`RobotInfo.meta["workspace"] = {"lower": [x, y, z], "upper": [x, y, z]}` when present). A
configuration sent with a policy may only tighten them (`SafetyConfig.tightened`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.agent.safety_config import SafetyConfig, default_config
from devices.robots.wire.robot_types import RobotInfo, RobotState

Vec = NDArray[np.float64]
LIMIT_NAMES = ("nonfinite", "position", "velocity", "max_step", "effort", "workspace")
SOFT_SPEED = 0.88  # governors on the measured state aim at this fraction of the speed limit
DAMPING_BAND = 1.0  # torque falls from full to zero over this fraction of the speed limit
BRAKE_MARGIN = 0.02  # rad: velocity and torque motion brakes to a stop this far inside a limit
LEAD_FULL, LEAD_ZERO = 0.9, 1.02  # position lead tapers to 0 between these speed fractions
# joints drag each other (position mode): while any joint nears its speed limit (predicted
# speed from DRAG_FULL x the limit) or brakes with more than SAT_FROM x its effort limit
# (at SAT_FULL its actuator is as good as saturated: the lab's wrist tops out at 11 of 12
# N*m), every target's speed changes at no more than down to DRAG_FLOOR x max_accel and
# drifts towards what its joint is doing (coasting): the big joints stop pulling on a wrist
# that can no longer brake itself
DRAG_FULL, DRAG_FLOOR = 0.85, 0.3
SAT_FROM, SAT_FULL = 0.6, 0.8
LEAD_BRAKE = 3.0  # x max_accel: how hard the lead governor may decelerate a position target
TARGET_MARGIN = 0.005  # rad: position targets stay this far inside the limits (tracking overshoot)
LIMIT_PULLBACK = 4.0  # target correction (rad per rad, or rad/s per rad) past a limit
VGLOBAL_FULL, VGLOBAL_ZERO = 0.8, 0.95  # velocity mode: the same, for commanded speeds
NEAR_LIMIT_FLOOR = 0.2  # of the speed limit, added to the braking speed near a limit
GLOBAL_FULL, GLOBAL_ZERO = 0.7, 0.9  # torque mode: all-joint scaling between these speed ratios
TORQUE_SOFT = 0.55  # torque mode governs to this fraction of the (soft) speed
TORQUE_RISE_S = 0.1  # s for a torque that speeds a joint up to rise from 0 to full
BRAKE_BAND = 0.5  # above the governed speed, full braking torque is reached this far over it
PREDICT_S = 0.008  # s: command latency + one control period, typical of the lab and arms
MAX_ACCEL = 50.0  # rad/s^2: larger measured accelerations are glitches, not motion
VEL_PULLBACK = 10.0  # rad/s per rad: velocity mode's pull out of the braking margin (the
# lab's velocity servo holds a loaded joint only with a steady error)
TORQUE_PREDICT_S = 0.08  # s: the same for torque mode (its braking takes longer to bite:
# 0.05 s let a wrist joint 0.9-2.2 mrad past its limit in random torque sequences)
DRAG_MIN_SPEED = 0.05  # rad/s: a joint moving against its command faster is being dragged
BRAKE_PREDICT_S = 0.05  # s: velocity/torque braking is judged from the predicted position
BOX_MARGIN = 0.01  # m: targets brake to a stop this far inside the workspace box
BOX_DECEL = 2.0  # m/s^2: how hard a target's end effector may brake before a box face
BOX_CREEP = 0.02  # m/s: outward speed allowed within the margin's inner half
BOX_LAG_S = 0.1  # s: the measured end effector is judged where it will be this far ahead


@dataclass(frozen=True)
class SafetyResult:
    """What the envelope decided for one command."""

    command: Vec  # the command to send (valid only when stop is None)
    acted: tuple[str, ...]  # names of the limits that changed or refused the command
    stop: str | None  # a human-readable reason when the robot must stop instead
    measured: bool = False  # the stop was judged on the measured state (the agent latches it)


class SafetyEnvelope:
    """Applies `SafetyConfig` for one robot at control period `dt` (s)."""

    def __init__(
        self,
        info: RobotInfo,
        config: SafetyConfig | None = None,
        fk: Callable[[Vec], Vec | None] | None = None,
    ) -> None:
        self.info = info
        self.dt = 1.0 / float(info.control_rate_hz)
        self.fk = fk
        self.configure(config or default_config(info))

    def configure(self, config: SafetyConfig) -> None:
        lim = self.info.limits
        n = len(self.info.joint_names)
        self.config = config
        self.lower = np.asarray(lim.lower, float) + config.position_margin
        self.upper = np.asarray(lim.upper, float) - config.position_margin
        if np.any(self.lower > self.upper):
            raise DeviceError(
                f"safety config: position_margin {config.position_margin} rad "
                "leaves no room between the joint limits"
            )
        self.vmax = np.asarray(lim.velocity, float) * config.velocity_scale
        self.eff_hw = np.asarray(lim.effort, float)  # the actuators' own (saturation)
        self.effmax = self.eff_hw * config.effort_scale
        self.step_pos = self.vmax * self.dt
        self.step_vel = np.minimum(
            self.vmax * self.dt / max(config.velocity_ramp_s, self.dt), config.max_accel * self.dt
        )
        self.step_is_config = False
        if config.max_step is not None:
            ms = np.asarray(config.max_step, float)
            if ms.shape != (n,) or np.any(ms <= 0):
                raise DeviceError(f"safety config: max_step must be {n} positive values")
            self.step_is_config = bool(np.any(ms < self.step_pos))
            self.step_pos = np.minimum(self.step_pos, ms)
            self.step_vel = np.minimum(self.step_vel, ms)
        self.box: tuple[Vec, Vec] | None = None
        if config.workspace_lower is not None and config.workspace_upper is not None:
            self.box = (
                np.asarray(config.workspace_lower, float),
                np.asarray(config.workspace_upper, float),
            )
        # measured-state governors (see the module docstring)
        self.v_soft = SOFT_SPEED * self.vmax  # governors aim here, below the limit
        self.lead = self.vmax * config.lead_s
        self.kd = self.effmax / (DAMPING_BAND * self.vmax)  # N*m*s/rad below the speed limit
        self.kd_brake = self.effmax / (BRAKE_BAND * self.vmax)  # and above it
        self._min_box_dist = 0.0
        self._vp = np.zeros(n)
        self._v_prev: Vec | None = None
        self._last_step = np.zeros(len(self.info.joint_names))
        self._t_prev = 0.0

    def start(self, state: RobotState) -> None:
        """Motion starts from `state`: measured checks judge changes from here on."""
        self._min_box_dist = self.box_distance(state.joint_pos)
        self._v_prev, self._t_prev = state.joint_vel.copy(), state.t
        self._last_step = np.zeros_like(state.joint_pos)

    def _points(self, joint_pos: Vec) -> Vec | None:
        """(K, 3): the end effector (row 0) and, where the driver gives them, points of
        every moving link's collision geometry (`collision_points`), at joint_pos."""
        if self.fk is None:
            return None
        p = self.fk(joint_pos)
        return None if p is None else np.atleast_2d(np.asarray(p, float))

    def _faces(self, pts: Vec) -> Vec:
        """(K, 6) room (m) from each point to each face of the box (lower x, y, z, then
        upper), negative past it. The end effector is held to the whole box, the links to
        its floor only (the table plane): a box drawn for the tool's work does not fit a
        Panda's own elbow, which sits behind its base."""
        assert self.box is not None
        room = np.concatenate([pts - self.box[0], self.box[1] - pts], axis=1)
        room[1:, [0, 1, 3, 4, 5]] = np.inf
        return room

    def box_distance(self, joint_pos: Vec) -> float:
        """How far (m) the end effector at joint_pos is outside the box, or a link below its
        floor, whichever is more (0 inside, or when there is no box or no kinematics)."""
        if self.box is None:
            return 0.0
        pts = self._points(joint_pos)
        if pts is None:
            return 0.0
        out = np.maximum(-self._faces(pts), 0.0)
        return float(np.max(np.linalg.norm(out[:, :3] + out[:, 3:], axis=1)))

    def in_workspace(self, joint_pos: Vec) -> bool:
        """True when there is no box, no kinematics, or the end effector is inside the box."""
        return self.box_distance(joint_pos) == 0.0

    def _allowed_in_box(self, target: Vec, here: Vec) -> bool:
        """A target is fine inside the box, or when it is no further out than `here`."""
        d = self.box_distance(target)
        return d == 0.0 or d <= self.box_distance(here) + 1e-6

    def braking_speed(
        self, joint_pos: Vec, margin: float = 0.0, cap: Vec | None = None
    ) -> tuple[Vec, Vec]:
        """(up, down): the speeds (>= 0, rad/s, at most `cap`, default the governed speed)
        from which each joint can still brake to a stop at brake_decel `margin` rad before
        its upper / lower limit; 0 from there on."""
        a = self.config.brake_decel
        up = np.sqrt(2 * a * np.maximum(self.upper - margin - joint_pos, 0.0))
        down = np.sqrt(2 * a * np.maximum(joint_pos - self.lower - margin, 0.0))
        top = self.v_soft if cap is None else cap
        return np.minimum(up, top), np.minimum(down, top)

    def predicted_velocity(self, state: RobotState) -> Vec:
        """Measured velocity extrapolated PREDICT_S ahead with the measured acceleration:
        what a command sent now meets when it takes effect (latency + one period)."""
        v = state.joint_vel
        prev, tp = self._v_prev, self._t_prev
        if prev is None or not state.t > tp:
            return v
        acc = np.clip((v - prev) / (state.t - tp), -MAX_ACCEL, MAX_ACCEL)
        return v + acc * PREDICT_S

    def check_measured(self, state: RobotState) -> str | None:
        """A reason to stop now, judged on the measured state alone, or None."""
        q, v = state.joint_pos, state.joint_vel
        names = self.info.joint_names
        lim = self.info.limits
        over = np.abs(v) > self.config.measured_velocity_factor * np.asarray(lim.velocity)
        if np.any(over):
            j = int(np.argmax(np.abs(v) / np.asarray(lim.velocity)))
            return (
                f"measured velocity {v[j]:.2f} rad/s of {names[j]} exceeds "
                f"{self.config.measured_velocity_factor:g}x its limit {lim.velocity[j]:g}"
            )
        tol, eps = self.config.limit_tolerance, 0.05  # rad/s: moving further out, not noise
        out = ((q > np.asarray(lim.upper) + tol) & (v > eps)) | (
            (q < np.asarray(lim.lower) - tol) & (v < -eps)
        )
        if np.any(out):
            j = int(np.flatnonzero(out)[0])
            return (
                f"measured position {q[j]:.3f} rad of {names[j]} is moving further past its limit"
            )
        d = self.box_distance(q)
        self._min_box_dist = min(self._min_box_dist, d)
        if d > tol and d > self._min_box_dist + tol:
            return f"end effector {d * 1e3:.1f} mm outside the workspace box and moving out"
        return None

    def apply(self, mode: str, command: Vec, state: RobotState, prev: Vec) -> SafetyResult:
        """Check `command` (mode: position | velocity | torque) given the measured `state` and
        the previous command actually sent `prev` (for position: the previous target, or the
        measured position when motion starts; for velocity: the previous velocity)."""
        if not np.all(np.isfinite(command)):
            bad = [self.info.joint_names[i] for i in np.flatnonzero(~np.isfinite(command))]
            return SafetyResult(prev, ("nonfinite",), f"command has NaN/inf for {', '.join(bad)}")
        mef = self.config.measured_effort_factor
        if mef is not None and np.any(np.abs(state.joint_effort) > mef * self.effmax):
            j = int(np.argmax(np.abs(state.joint_effort) / self.effmax))
            return SafetyResult(
                prev,
                ("effort",),
                f"measured effort {state.joint_effort[j]:.1f} "
                f"N*m on {self.info.joint_names[j]} exceeds {mef:g}x its limit",
                measured=True,
            )
        measured = self.check_measured(state)
        self._vp = self.predicted_velocity(state)
        if state.t > self._t_prev:
            self._v_prev, self._t_prev = state.joint_vel.copy(), state.t
        if measured is not None:
            kind = next(k for k in ("velocity", "workspace", "position") if k in measured)
            return SafetyResult(prev, (kind,), measured, measured=True)
        if mode == "position":
            return self._position(command, state, prev)
        if mode == "velocity":
            return self._velocity(command, state, prev)
        if mode == "torque":
            return self._torque(command, state, prev)
        return SafetyResult(prev, (), f"command mode '{mode}' is not supported by the envelope")

    def _finish(self, out: Vec, acted: list[str]) -> SafetyResult:
        if acted and self.config.on_violation == "stop":
            return SafetyResult(out, tuple(acted), f"{', '.join(acted)} limit exceeded")
        return SafetyResult(out, tuple(acted), None)

    def _position(self, cmd: Vec, state: RobotState, prev: Vec) -> SafetyResult:
        acted: list[str] = []
        q, v = state.joint_pos, state.joint_vel
        lower, upper = self.lower + TARGET_MARGIN, self.upper - TARGET_MARGIN
        out = np.clip(cmd, lower, upper)
        if np.any(out != cmd):
            acted.append("position")
        # towards a limit no faster than the joint can brake before it, and at most at the
        # soft speed: the measured joint overshoots its target's speed (PD lag, latency,
        # the other joints' pull), so targets keep a margin below the hard limit
        up, down = self.braking_speed(prev, TARGET_MARGIN)
        step_hi = np.minimum(self.step_pos, up * self.dt)
        step_lo = np.minimum(self.step_pos, down * self.dt)
        want = out - prev
        step = np.clip(want, -step_lo, step_hi)
        # and with bounded acceleration: a target that reverses at once makes the big joints
        # brake so hard that they fling the small ones past their speed limits. It slows
        # down in time to stop at the goal, and never passes it.
        amax = self.config.max_accel
        dstep = amax * self.dt * self.dt
        # largest step s with s + (s - dstep) + (s - 2 dstep) + ... <= distance to go
        reach = dstep * (np.sqrt(0.25 + 2 * np.abs(want) / dstep) - 0.5)
        step = np.clip(step, -reach, reach)
        # towards a face of the workspace box no faster than the end effector can brake
        # before it; ahead of the acceleration bound, so the target slows down smoothly
        # (cut after it, the big joints braked hard and flung the wrist past 1.0x)
        if (boxed := self._box_step(prev, step, state)) is not None:
            acted.append("workspace")
            step = boxed
        # joints drag each other: while any joint nears its speed limit or brakes at nearly
        # full torque, every target changes speed more gently and coasts with its joint (a
        # dragged wrist at full braking torque is flung by its neighbours' accelerations,
        # either way: bench safety's random streams reached 1.10x), even past its goal
        ratio = float(np.max(np.abs(self._vp) / self.vmax))
        gentle = float(np.clip((LEAD_ZERO - ratio) / (LEAD_ZERO - DRAG_FULL), DRAG_FLOOR, 1.0))
        eff = state.joint_effort
        braking = (eff * v < 0) & (np.abs(v) > DRAG_MIN_SPEED)
        sat = float(np.max(np.where(braking, np.abs(eff) / self.eff_hw, 0.0)))
        gentle = min(gentle, float(np.interp(sat, [SAT_FROM, SAT_FULL], [1.0, DRAG_FLOOR])))
        # (the fast or straining joints themselves do not coast: their targets slow down)
        own = (np.abs(self._vp) > DRAG_FULL * self.vmax) | (
            braking & (np.abs(eff) > SAT_FROM * self.eff_hw)
        )
        coast = np.where(own, 0.0, 1.0 - gentle)
        centre = self._last_step + coast * (v * self.dt - self._last_step)
        step = np.clip(step, centre - gentle * dstep, centre + gentle * dstep)
        if gentle >= 1.0:
            step = np.where(want >= 0, np.minimum(step, want), np.maximum(step, want))
        else:  # coasting never outruns the braking before a limit or a face of the box
            step = np.clip(step, -step_lo, step_hi)
            if (boxed := self._box_step(prev, step, state)) is not None:
                acted.append("workspace")
                step = boxed
        if np.any(step != out - prev):
            acted.append("max_step" if self.step_is_config else "velocity")
            out = prev + step
        # the target leads the MEASURED joint by a bounded amount, and not at all in the
        # direction of motion while a joint is at its speed limit or could not brake in time
        # judged on the speed each joint will have when this target takes effect, where it
        # is speeding up (braking on the command alone let a dragged wrist reach 1.1x)
        vp = self._vp
        sp = np.maximum(np.abs(v), np.where(vp * v > 0, np.abs(vp), 0.0))
        mup, mdown = self.braking_speed(q, cap=self.vmax)
        taper = (LEAD_ZERO * self.vmax - sp) / ((LEAD_ZERO - LEAD_FULL) * self.vmax)
        # joints drag each other: while any joint nears its speed limit, every lead shrinks
        ratio = float(np.max(sp / self.vmax))
        taper = np.minimum(taper, (LEAD_ZERO - ratio) / (LEAD_ZERO - LEAD_FULL))
        lead = self.lead * np.clip(taper, 0.0, 1.0)
        ahead = np.where((v > 0) & (v > mup), 0.0, np.where(v > 0, lead, self.lead))
        behind = np.where((v < 0) & (-v > mdown), 0.0, np.where(v < 0, lead, self.lead))
        # a joint measured past a limit (a load the controller cannot hold there) gets a
        # target pulled back in proportion, towards the safe set
        hi = np.minimum(q + ahead, upper - np.minimum(LIMIT_PULLBACK * (q - self.upper), 0.1))
        lo = np.maximum(q - behind, lower + np.minimum(LIMIT_PULLBACK * (self.lower - q), 0.1))
        hi = np.maximum(hi, lo)
        led = np.clip(out, lo, hi)
        # ... but the target itself still moves no more than the step limit per tick
        led = np.clip(led, prev - self.step_pos, prev + self.step_pos)
        # ... and slows down at a bounded rate: a target snapped back onto its joint brakes the
        # big joints so hard that the wrist, dragged along, overshoots its own speed limit
        kd = LEAD_BRAKE * dstep
        led = prev + np.clip(led - prev, self._last_step - kd, self._last_step + kd)
        if np.any(led != out):
            if "velocity" not in acted:
                acted.append("velocity")
            out = led
        # never further outside the limits than the previous target
        np.clip(out, np.minimum(prev, lower), np.maximum(prev, upper), out=out)
        if (boxed := self._box_step(prev, out - prev, state, hard=True)) is not None:
            acted.append("workspace")
            out = prev + boxed
        if not self._allowed_in_box(out, prev):
            acted.append("workspace")
            out = self._towards_box(prev, out)
        self._last_step = out - prev
        return self._finish(out, acted)

    def _box_gaps(self, *joint_pos: Vec) -> Vec | None:
        """(K, 6) room (m) from each checked point to each face it is held to (`_faces`),
        of the box shrunk by BOX_MARGIN, the least over the given poses; negative past a
        face. None without a box or kinematics."""
        if self.box is None:
            return None
        gaps = []
        for q in joint_pos:
            pts = self._points(q)
            if pts is None:
                return None
            gaps.append(self._faces(pts))
        return np.min(gaps, axis=0) - BOX_MARGIN

    def _box_cap(self, gaps: Vec) -> Vec:
        """Outward speed (m/s) towards each face from which the end effector can still brake
        to a stop at BOX_DECEL inside the shrunk box: 0 at or past it."""
        return np.sqrt(2.0 * BOX_DECEL * np.maximum(gaps, 0.0))

    def _outward(self, q: Vec, qdot: Vec) -> Vec | None:
        """(K, 6) speed (m/s) of each checked point towards each face (negative: away) for
        joint velocity qdot at q (finite difference)."""
        h = 0.01
        p0, p1 = self._points(q), self._points(q + h * qdot)
        if p0 is None or p1 is None:
            return None
        v = (p1 - p0) / h
        return np.concatenate([-v, v], axis=1)

    def _outward_scale(self, outward: Vec, cap: Vec) -> float:
        """The factor (0..1) that brings every outward speed within its cap."""
        over = outward > np.maximum(cap, 1e-9)
        if not np.any(over):
            return 1.0
        return float(np.clip(np.min(cap[over] / outward[over]), 0.0, 1.0))

    def _box_step(self, prev: Vec, step: Vec, state: RobotState, hard: bool = False) -> Vec | None:
        """The part of `step` (a position target's move this tick) with which the end
        effector approaches each face of the box no faster than it can brake to a stop
        BOX_MARGIN inside it, at BOX_DECEL; None when all of it may go. The room left is
        judged from the target and from where the measured end effector will be BOX_LAG_S
        from now (it lags its target and overshoots it). From beyond that inner face (after
        an overshoot, or a restart from outside) no motion towards the face at all: a pose
        outside is never a new baseline to move on from. Inside, the whole step is scaled
        down; past the margin, of that and the largest set of single-joint moves that keeps
        to the caps the one that moves more is kept (single moves in part where the whole
        would not fit), so a robot outside still moves back in along any joint that helps.
        `hard`: the last line of defence, once the step limits have shaped the target."""
        gaps = self._box_gaps(prev, state.joint_pos + BOX_LAG_S * state.joint_vel)
        if gaps is None:
            return None
        if hard:
            cap = self._box_cap(gaps + 0.5 * BOX_MARGIN)
        else:  # and a creep out to half the margin: a robot resting at the margin (where
            # braking leaves it) may still move along the face, not only straight in
            creep = (gaps <= 0.0) & (gaps > -0.5 * BOX_MARGIN)
            cap = self._box_cap(gaps) + np.where(creep, BOX_CREEP, 0.0)

        def scale(s: Vec) -> float:
            out = self._outward(prev, s / self.dt)
            return 1.0 if out is None else self._outward_scale(out, cap)

        k = scale(step)
        if k >= 1.0:
            return None
        scaled = k * step
        if np.all(gaps > 0.0):
            return scaled  # inside: slow down smoothly (a switching subset flings joints)
        best = np.zeros_like(step)
        for j in np.argsort(-np.abs(step)):
            if step[j] == 0.0:
                break
            for part in (1.0, 0.5, 0.25, 0.1):  # as much of this joint's move as fits
                trial = best.copy()
                trial[j] = part * step[j]
                if scale(trial) >= 1.0:
                    best = trial
                    break
        return best if np.abs(best).sum() > np.abs(scaled).sum() else scaled

    def _towards_box(self, prev: Vec, target: Vec) -> Vec:
        """The part of the step prev -> target that keeps the end effector in the box (or
        brings it no further out): joint by joint, the moves that do not take it out. So
        a robot at the edge keeps moving along it, or back in, rather than freezing."""
        best, d_best = prev.copy(), self.box_distance(prev)
        for j in np.argsort(-np.abs(target - prev)):
            trial = best.copy()
            trial[j] = target[j]
            d = self.box_distance(trial)
            if d == 0.0 or d <= d_best + 1e-9:
                best, d_best = trial, d
        return best

    def _velocity(self, cmd: Vec, state: RobotState, prev: Vec) -> SafetyResult:
        acted: list[str] = []
        q, v = state.joint_pos, state.joint_vel
        out = np.clip(cmd, -self.vmax, self.vmax)
        if np.any(out != cmd):
            acted.append("velocity")
        # braking distance to the position limits, on the measured position; slower while a
        # joint measures over its soft speed
        # from where the joint will be when this command takes effect (it may be dragged
        # along by the others even while its own command is 0)
        qp = q + v * BRAKE_PREDICT_S
        up, down = self.braking_speed(qp, BRAKE_MARGIN)
        up = np.where(v > self.v_soft, np.minimum(up, 2 * self.v_soft - v), up)
        down = np.where(-v > self.v_soft, np.minimum(down, 2 * self.v_soft + v), down)
        braked = np.clip(out, -np.maximum(down, 0.0), np.maximum(up, 0.0))
        # joints drag each other: while any joint nears its speed limit (or, near a position
        # limit, the speed it can still brake from), all slow down
        room = np.maximum(np.where(v >= 0, up, down), 0.0) + NEAR_LIMIT_FLOOR * self.vmax
        ratio = float(max(np.max(np.abs(v) / self.vmax), np.max(np.abs(v) / room)))
        # a joint dragged towards its limit against its own command has no floor: the
        # joints dragging it must slow down before it gets there
        dragged = (v * out <= 0) & (np.abs(v) > DRAG_MIN_SPEED)
        if np.any(dragged):
            bare = np.maximum(np.where(v >= 0, up, down), 1e-3)
            ratio = max(ratio, float(np.max(np.abs(v[dragged]) / bare[dragged])))
        braked = braked * float(
            np.clip((VGLOBAL_ZERO - ratio) / (VGLOBAL_ZERO - VGLOBAL_FULL), 0.0, 1.0)
        )
        # a joint predicted inside its braking margin is driven back out of it: a joint
        # commanded to stand still there is still dragged along by the others
        edge_hi, edge_lo = self.upper - BRAKE_MARGIN, self.lower + BRAKE_MARGIN
        back_hi = np.minimum(braked, VEL_PULLBACK * (edge_hi - qp))
        back_lo = np.maximum(braked, VEL_PULLBACK * (edge_lo - qp))
        braked = np.where(qp > edge_hi, back_hi, np.where(qp < edge_lo, back_lo, braked))
        if np.any(braked != out):
            acted.append("position")
            out = braked
        gaps = self._box_gaps(q, q + BOX_LAG_S * v)
        vt = None if gaps is None else self._outward(q, out)
        if gaps is not None and vt is not None:
            k = self._outward_scale(vt, self._box_cap(gaps))
            if k < 1.0:  # towards a face no faster than the tool can brake before it
                acted.append("workspace")
                out = out * k
        # speed changes (slowing down included) are ramped: an abrupt stop of the big joints
        # would kick the small ones past their limits
        step = np.clip(out - prev, -self.step_vel, self.step_vel)
        if np.any(step != out - prev):
            acted.append("max_step")
            out = prev + step
        return self._finish(out, acted)

    def _torque(self, cmd: Vec, state: RobotState, prev: Vec) -> SafetyResult:
        acted: list[str] = []
        q, v = state.joint_pos, state.joint_vel
        out = np.clip(cmd, -self.effmax, self.effmax)
        if np.any(out != cmd):
            acted.append("effort")
        # the commanded torque changes no faster than full scale in TORQUE_RISE_S: a sudden
        # step would kick the other joints (they drag each other) faster than the governor
        # below sees it one period later; the governor's own braking is never slowed
        rise = self.effmax * self.dt / TORQUE_RISE_S
        slewed = np.clip(out, prev - rise, prev + rise)
        braking = (slewed * v < 0) & (np.abs(v) > 0.1 * self.vmax)
        if np.any(slewed != out):
            acted.append("max_step")
            out = slewed
        # joints drag each other: while any joint nears its speed limit, torque that speeds
        # joints up is scaled down on ALL joints (braking torque is never reduced)
        # (near a position limit the speed that counts is the one it can still brake from)
        qp = q + v * TORQUE_PREDICT_S  # where the joint will be when this torque has acted
        up0, down0 = self.braking_speed(qp, BRAKE_MARGIN)
        room = np.where(v >= 0, up0, down0) + NEAR_LIMIT_FLOOR * self.vmax
        ratio = float(max(np.max(np.abs(v) / self.vmax), np.max(np.abs(v) / room)))
        scale = float(np.clip((GLOBAL_ZERO - ratio) / (GLOBAL_ZERO - GLOBAL_FULL), 0.0, 1.0))
        if scale < 1.0:
            out = np.where(braking, out, out * scale)
            acted.append("velocity")
        # velocity-dependent torque limit: full torque well below the speed limit, less as
        # the joint nears it (or the speed from which it can brake before a position limit),
        # braking torque above it
        up, down = self.braking_speed(qp, BRAKE_MARGIN)
        up, down = up * TORQUE_SOFT, down * TORQUE_SOFT
        hi = np.where(v < up, self.kd * (up - v), self.kd_brake * (up - v))
        lo = np.where(-v < down, -self.kd * (down + v), -self.kd_brake * (down + v))
        limited = np.clip(out, np.clip(lo, -self.effmax, 0.0), np.clip(hi, 0.0, self.effmax))
        limited = np.where(hi < 0, np.maximum(hi, -self.effmax), limited)
        limited = np.where(lo > 0, np.minimum(lo, self.effmax), limited)
        if np.any(np.abs(limited - out) > 1e-9):
            acted.append("velocity")
            out = limited
        gaps = self._box_gaps(q, q + BOX_LAG_S * v)
        vt = None if gaps is None else self._outward(q, v)
        if gaps is not None and vt is not None:
            if self._outward_scale(vt, self._box_cap(gaps)) < 1.0:
                acted.append("workspace")  # too fast towards a face: brake every joint
                out = np.clip(-self.kd * v, -self.effmax, self.effmax)
        return self._finish(out, acted)
