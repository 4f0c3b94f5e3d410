"""`FrankaDriver`: Franka FR3 / Panda arms through `franky-control` (libfranka underneath).

franky runs libfranka's 1 kHz loop itself; the agent hands it a new command every control
tick as an asynchronous `JointVelocityMotion` that replaces the running one (Ruckig re-plans
within the arm's velocity, acceleration and jerk limits x `dynamics_factor`), held for three
control periods only, so the arm stops by itself if the agent goes quiet. A position target
is servoed: velocity = `servo_gain` x (target - commanded position), no faster than the
arm can still stop at the target (sqrt(2 a |error|)) and within the velocity limits, both x
`dynamics_factor`. (A `JointMotion` per tick is a rest-to-rest plan that is
replaced before it gets up to speed: a stream of targets 0.05 rad ahead moved the joints at
~0.3 rad/s, see docs/TRAPS.md.) A stop (`hold`) is a zero-velocity motion. The library's collision thresholds stay at
franky's defaults; a reflex or other error the arm reports becomes a fault naming the arm
and the error, handed to `on_reflex` (`attach_estop`: the agent's latched e-stop); the
driver runs franky's error recovery as the agent halts, and the arm moves again only after
the operator resets the e-stop. A lost arm (network, controller) stays faulted.

The robot-description bundle carries the URDF the arm itself reports (`Robot.model_urdf`).
franky is imported when the driver connects.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.wire.robot_types import CommandMode, JointLimits, RobotInfo, RobotState

Vec = NDArray[np.float64]
FR3_LOWER = (-2.7437, -1.7837, -2.9007, -3.0421, -2.8065, 0.5445, -3.0159)
FR3_UPPER = (2.7437, 1.7837, 2.9007, -0.1518, 2.8065, 4.5169, 3.0159)
FR3_VEL = (2.62, 2.62, 2.62, 2.62, 5.26, 4.18, 5.26)
PANDA_VEL = (2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61)
# rad/s: the lower of the two arms' limits, what this driver reports and servos within. It
# cannot tell an FR3 from a Panda, and libfranka refuses a waypoint above the connected arm's
# own limit (franky-sim, a Panda, stopped a policy run: "Waypoint velocity [… 2.6268]
# exceeds maximum velocity [… 2.61]" with the FR3's 5.26 rad/s x 0.5 allowed on joint 7)
ARM_VEL = tuple(min(a, b) for a, b in zip(FR3_VEL, PANDA_VEL, strict=True))
FR3_EFFORT = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0)
FR3_ACC = (15.0, 7.5, 10.0, 12.5, 15.0, 20.0, 20.0)  # rad/s^2, the arm's joint limits
# 1/s: position error -> velocity (time constant 25 ms); with the stopping-distance cap
# it neither overshoots a step nor rings on a stream of targets (franky's jerk-limited
# velocity motions lag ~2 ticks at 100 Hz; without the cap a target held 0.05 rad ahead
# made the joints ring at +-0.2 rad)
SERVO_GAIN = 40.0
STALE_S = 0.25  # s without a new robot state during a motion: the arm is lost


def _first_line(exc: BaseException) -> str:
    """libfranka appends its log (e.g. control_command_success_rate) after the message."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def active_errors(errors: Any) -> list[str]:
    """Names of the flags set in a libfranka `Errors` value (e.g. 'joint_reflex')."""
    return [n for n in dir(errors) if not n.startswith("_") and getattr(errors, n) is True]


# how long the first connection may take: a reachable address that never answers (an FCI
# already serving another client; franky-sim serves one) otherwise blocks in libfranka, where
# no signal reaches it
CONNECT_TIMEOUT_S = 10.0


def _connect(franky: Any, host: str, timeout_s: float) -> Any:
    """franky.Robot(host), or DeviceError naming the host after `timeout_s`."""
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def go() -> None:
        try:
            robot = franky.Robot(host, realtime_config=franky.RealtimeConfig.Ignore)
        except Exception as exc:  # franky's own NetworkException, IncompatibleVersion…
            box["error"] = exc
            return
        with lock:
            if box.get("abandoned"):
                del robot  # connected too late: give the arm's one connection back
                return
            box["robot"] = robot

    th = threading.Thread(target=go, name=f"franka-connect-{host}", daemon=True)
    th.start()
    th.join(timeout_s)
    with lock:
        if "robot" in box:
            return box["robot"]
        box["abandoned"] = True
    if "error" in box:
        exc = box["error"]
        raise DeviceError(f"franka {host}: cannot connect ({type(exc).__name__}: {exc})")
    raise DeviceError(
        f"franka {host}: cannot connect (no answer within {timeout_s:g} s; is another client "
        "connected to the arm? It serves one at a time)"
    )


class FrankaDriver:
    """A RobotDriver for a Franka arm at `host` (its FCI address, or franky-sim's)."""

    def __init__(
        self,
        host: str,
        rate_hz: float = 250.0,
        dynamics_factor: float = 0.1,
        servo_gain: float = SERVO_GAIN,
    ) -> None:
        if not 0 < dynamics_factor <= 1:
            raise DeviceError(f"franka: dynamics factor must be in (0, 1], got {dynamics_factor}")
        if not 0 < servo_gain <= rate_hz:
            raise DeviceError(f"franka: servo gain must be in (0, rate {rate_hz:g}] 1/s")
        self.servo_gain = servo_gain
        self._vmax = np.array(ARM_VEL) * dynamics_factor
        self._amax = np.array(FR3_ACC) * dynamics_factor
        import franky

        self._f: Any = franky
        self.host, self.rate_hz = host, rate_hz
        self.robot: Any = _connect(franky, host, CONNECT_TIMEOUT_S)
        self.robot.relative_dynamics_factor = dynamics_factor
        try:
            urdf = str(self.robot.model_urdf)
        except Exception:
            urdf = ""
        self._lock = threading.RLock()
        self._kind: str | None = None  # 'position' | 'velocity' while a motion runs
        self._seq = 0
        self.fault: str | None = None
        self._fault_reported = False
        self._recoverable = False
        # called with the message when the arm reports a reflex; `agent serve` latches the
        # agent's e-stop with it (only the operator clears it), see attach_estop()
        self.on_reflex: Callable[[str], None] | None = None
        self._last: RobotState | None = None
        self.recoveries = 0
        self._stamp = (-1.0, time.monotonic())  # (robot time ms, when it last changed)
        limits = JointLimits(*(np.array(v) for v in (FR3_LOWER, FR3_UPPER, ARM_VEL, FR3_EFFORT)))
        names = re.findall(r'<joint\s+name="([^"]+)"\s+type="revolute"', urdf)
        self._info = RobotInfo(
            name="fr3",
            joint_names=tuple(names)
            if len(names) == 7
            else tuple(f"fr3_joint{i + 1}" for i in range(7)),
            limits=limits,
            control_rate_hz=rate_hz,
            command_modes=("position", "velocity"),
            description=f"Franka FR3 at {host} (franky-control)",
            meta={
                "driver": "franka",
                "device": host,
                "bundle": {
                    "format": 1,
                    "urdf": urdf,
                    "urdf_name": "fr3.urdf",
                    "limits": limits.to_dict(),
                    "calibration": None,
                },
            },
        )

    # -- RobotDriver -----------------------------------------------------------------------
    def info(self) -> RobotInfo:
        return self._info

    def start(self) -> None:
        self.read_state()

    def close(self) -> None:
        with self._lock:
            if self.robot is None:
                return
            self.hold()
            try:
                self.robot.join_motion(timeout=2.0)
            except Exception:
                pass
            # franky has no disconnect: the connection ends with the Robot object, and an
            # arm's FCI (and franky-sim) serves one client, so a closed driver lets it go now
            # rather than whenever the garbage collector gets to it
            self.robot = None
            if self.fault is None:
                self.fault = f"franka {self.host}: closed"

    def read_state(self) -> RobotState:
        """The newest libfranka state. A fault is raised once; then the last good state is
        returned again (same `t`, `seq`) so the agent keeps reporting why it stopped."""
        with self._lock:
            self._check_motion()
            if self.fault is not None:
                if self._reflex_handled() and self._last is not None:
                    return self._last
                if self._fault_reported and self._last is not None:
                    return self._last
                self._fault_reported = True
                raise DeviceError(self.fault)
            try:
                s = self.robot.state
            except Exception as exc:
                self._set_fault(f"state not readable ({type(exc).__name__}: {exc})")
                self._fault_reported = True
                raise DeviceError(self.fault) from None
            stamp, now = float(s.time.to_msec()), time.monotonic()
            if stamp != self._stamp[0]:
                self._stamp = (stamp, now)
            elif self._kind is not None and now - self._stamp[1] > STALE_S:
                # in motion, libfranka's state advances every ms: nothing new means the arm
                # (or the network to it) is gone
                self._set_fault(
                    f"no state from the arm for {(now - self._stamp[1]) * 1e3:.0f} ms "
                    "(network or controller lost)"
                )
                self._fault_reported = True
                raise DeviceError(self.fault)
            errors = active_errors(s.current_errors)
            if errors:  # a reflex (collision thresholds) or a limit the arm enforces itself
                self._set_fault(f"the arm reports {', '.join(errors)}", recoverable=True)
                if self._reflex_handled() and self._last is not None:
                    return self._last
                self._fault_reported = True
                raise DeviceError(self.fault)
            self._seq += 1
            self._last = RobotState(
                t=time.monotonic(),
                seq=self._seq,
                joint_pos=np.array(s.q, dtype=float),
                joint_vel=np.array(s.dq, dtype=float),
                joint_effort=np.array(s.tau_J, dtype=float),
            )
            return self._last

    def write_command(self, mode: CommandMode, values: Vec) -> None:
        v = np.asarray(values, dtype=float)
        if v.shape != (7,) or not np.all(np.isfinite(v)):
            raise DeviceError(f"franka {self.host}: bad {mode} command {v!r}")
        f = self._f
        with self._lock:
            if self.fault is not None:
                raise DeviceError(self.fault)
            if mode == "position":
                v = self._servo(v)
            elif mode != "velocity":
                raise DeviceError(f"franka {self.host}: '{mode}' commands are not supported")
            hold_ms = max(1, int(3000.0 / self.rate_hz))
            self._move(f.JointVelocityMotion(v.tolist(), duration=f.Duration(hold_ms)))
            self._kind = mode

    def hold(self) -> None:
        with self._lock:
            try:
                self._stop_motion()
            except Exception:
                pass
            if self.fault is None or not self._recoverable:
                return
            try:  # franky's automatic error recovery, once the agent has stopped
                if self.robot.has_errors:  # raises too when the arm is unreachable
                    self.robot.recover_from_errors()
                    self.recoveries += 1
                    self.fault = None  # stopped and recovered: a new command may move it
                    self._fault_reported = False
            except Exception:
                pass

    def forward_kinematics(self, joint_pos: Vec) -> Vec | None:
        return None

    # -- internals ---------------------------------------------------------------------------
    def _servo(self, target: Vec) -> Vec:
        """The velocity that servos towards a position target, from the commanded position
        (franky's q_d: where the motion generator is, not where the arm lags behind)."""
        try:
            q_d = np.array(self.robot.state.q_d, dtype=float)
        except Exception as exc:
            self._set_fault(f"state not readable ({type(exc).__name__}: {exc})")
            raise DeviceError(self.fault) from None
        e = target - q_d
        # no faster than the arm can still stop at the target: sqrt(2 a |e|)
        cap = np.minimum(self._vmax, np.sqrt(2.0 * self._amax * np.abs(e)))
        return np.clip(self.servo_gain * e, -cap, cap)

    def _move(self, motion: Any) -> None:
        try:
            self.robot.move(motion, asynchronous=True)
        except Exception as exc:
            self._kind = None
            name = type(exc).__name__
            self._set_fault(f"motion refused ({name}: {_first_line(exc)})", "Control" in name)
            if self._reflex_handled():
                return  # the e-stop has halted everything; this command is dropped
            raise DeviceError(self.fault) from None

    def _stop_motion(self) -> None:
        f = self._f
        if self._kind is not None:
            self.robot.move(
                f.JointVelocityMotion([0.0] * 7, duration=f.Duration(1)), asynchronous=True
            )
        self._kind = None

    def _check_motion(self) -> None:
        """Surface an error of the running asynchronous motion (reflex, network loss)."""
        try:
            self.robot.poll_motion()
        except Exception as exc:
            self._kind = None
            name = type(exc).__name__
            self._set_fault(f"{name}: {_first_line(exc)}", recoverable="Control" in name)

    def _reflex_handled(self) -> bool:
        """Hand a not yet reported reflex to `on_reflex` (the agent's e-stop); True if it
        was, and the caller then returns instead of raising (an agent that sees an error
        would turn its latched e-stop into a plain stop)."""
        if self.fault is None or not self._recoverable or self._fault_reported:
            return False
        if self.on_reflex is None:
            return False
        self._fault_reported = True
        self.on_reflex(self.fault)
        return True

    def _set_fault(self, what: str, recoverable: bool = False) -> None:
        """Latch a fault. Only errors the arm itself reports (reflexes, limits) are cleared
        by franky's error recovery; a lost arm stays faulted until a new connection. The
        first fault is kept (later errors are its consequences)."""
        if self.fault is not None:
            return
        self.fault = f"franka {self.host}: {what}; arm stopped"
        self._fault_reported = False
        self._recoverable = recoverable


def attach_estop(driver: FrankaDriver, agent: Any) -> None:
    """Map the arm's reflexes to the agent's latched e-stop: the arm is recovered (franky's
    automatic error recovery) as the agent halts, and moves again only after the operator
    resets the e-stop."""
    driver.on_reflex = lambda msg: agent.estop(f"reflex: {msg}")
