"""`ServoArmDriver`: a RobotDriver for an arm of serial-bus position servos (Dynamixel X,
Feetech STS), over a small `ServoBus` adapter around the vendor SDK.

Every control tick the agent reads (one sync read of position, speed and load of all
servos) and writes (one sync write of all goal positions); all bus traffic is under one lock
on the caller's thread, so a stop is on the wire as soon as `hold()` returns. Bus errors are
retried `retries` times; then the arm is held at its last measured pose, the fault names
the joint and servo (a diagnostic ping finds which stopped answering), and every later read
or command raises it (reads: once; then they return the last good state so the agent keeps
reporting why it stopped), so the agent stops and stays stopped. At start each servo must answer
and sit inside its calibrated range (else nothing is enabled); the range is also written to
the servo's own position limits, and the joint's velocity limit to the servo's own speed limit
(Dynamixel Profile Velocity, Feetech Goal Speed) at SPEED_CAP of it, carried again with every
goal. The envelope bounds each goal's step per control tick, not per second: ticks that come
late and then bunched up (a loaded computer) put goals on the wire faster than the limit, and
a servo left at its top speed chased them at 1.1-1.24x the joint's limit (a goal as far ahead
as the envelope lets a target lead: at its top speed, 1.74x Feetech, 2.6x Dynamixel). Capped
by the servo itself, no timing on this side makes it move faster than the limit.
`close()` holds, then turns torque off.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.agent.drivers.arm_calibration import ArmCalibration
from devices.robots.wire.robot_types import CommandMode, JointLimits, RobotInfo, RobotState

Vec = NDArray[np.float64]
RANGE_TOLERANCE = 0.02  # rad a joint may sit outside its calibrated range at start
# extra tries per bus transaction: a burst of two bad packets plus one late reply (a loaded
# machine) is absorbed; a dead servo is found within 4 x the SDK's 34 ms packet timeout
RETRIES = 3
# the servos' own speed limit, as a fraction of the joint's velocity limit: above the
# envelope's soft speed (0.88), so a servo can catch up with its target, and a little below
# the limit, for a real servo's tracking overshoot of its profile and its speed readings' noise
SPEED_CAP = 0.97


class BusError(Exception):
    """One failed bus transaction: `kind` is 'timeout' or 'corrupt'; `sid` the first servo
    whose status packet was missing or bad (None: unknown)."""

    def __init__(self, kind: str, sid: int | None, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.sid, self.detail = kind, sid, detail


@dataclass(frozen=True)
class Reading:
    position: NDArray[np.float64]  # ticks, per servo in the order asked
    speed: NDArray[np.float64]  # ticks/s
    load: NDArray[np.float64]  # fraction of the servo's rated torque, signed


class ServoBus(Protocol):
    """What the driver needs from a vendor SDK (devices/robots/agent/drivers/dynamixel.py, feetech.py)."""

    vendor: str
    port: str

    def open(self) -> None: ...
    def close(self) -> None: ...
    def ping(self, sid: int) -> str: ...  # 'ok', 'timeout' or 'corrupt'
    def sync_read(self, ids: list[int]) -> Reading: ...
    def sync_write_goal(self, ids: list[int], ticks: NDArray[np.int64]) -> None: ...
    # the servos' own speed limit (ticks/s); rounded down to the register's unit, the values
    # set are returned; every later goal write carries it again (a reset servo forgets RAM)
    def set_speed_limit(
        self, ids: list[int], ticks_per_s: NDArray[np.float64]
    ) -> NDArray[np.float64]: ...
    def set_torque(self, ids: list[int], on: bool) -> None: ...
    def set_position_limits(self, sid: int, low: int, high: int) -> None: ...
    def set_watchdog(self, ids: list[int], timeout_s: float) -> bool: ...


class ServoArmDriver:
    """A RobotDriver over a `ServoBus` with a per-joint `ArmCalibration`."""

    def __init__(
        self,
        bus: ServoBus,
        calibration: ArmCalibration,
        rate_hz: float = 100.0,
        retries: int = RETRIES,
        watchdog_s: float = 0.2,
        bundle: dict[str, Any] | None = None,
    ) -> None:
        self.bus, self.cal = bus, calibration
        self.retries = max(0, int(retries))
        self.watchdog_s = watchdog_s
        self.ids = calibration.ids
        self._lock = threading.RLock()
        self._seq = 0
        self._last: RobotState | None = None
        self._last_ticks: NDArray[np.float64] | None = None
        self._held_ticks: NDArray[np.int64] | None = None
        self._started = False
        self.fault: str | None = None
        self._fault_reported = False
        self.bus_retries = 0  # transactions that succeeded only after a retry
        self.servo_watchdog = False
        self.speed_cap: NDArray[np.float64] | None = None  # rad/s the servos hold themselves to
        limits = JointLimits(
            np.array([j.min for j in calibration.joints]),
            np.array([j.max for j in calibration.joints]),
            np.array([j.velocity for j in calibration.joints]),
            np.array([j.effort for j in calibration.joints]),
        )
        meta: dict[str, Any] = {
            "driver": bus.vendor,
            "device": bus.port,
            "calibration_file": calibration.source,
        }
        if bundle is not None:
            meta["bundle"] = bundle
        self._info = RobotInfo(
            name=calibration.robot,
            joint_names=calibration.names,
            limits=limits,
            control_rate_hz=rate_hz,
            command_modes=("position",),
            description=f"{calibration.robot} ({bus.vendor} servo arm on {bus.port})",
            meta=meta,
        )

    def _joint(self, sid: int | None) -> str:
        for j in self.cal.joints:
            if j.id == sid:
                return f"joint '{j.name}' (servo id {sid})"
        return "an unknown servo" if sid is None else f"servo id {sid}"

    # -- RobotDriver -----------------------------------------------------------------------
    def info(self) -> RobotInfo:
        return self._info

    def start(self) -> None:
        """Open the bus, check every servo, write the servos' own limits, enable torque.
        Raises DeviceError (torque left off, port closed) naming the joint at fault."""
        with self._lock:
            if self._started:
                return
            self.bus.open()
            try:
                missing = [j for j in self.cal.joints if self._ping(j.id) != "ok"]
                if missing:
                    names = ", ".join(self._joint(j.id) for j in missing)
                    raise DeviceError(
                        f"{self.bus.vendor} bus {self.bus.port}: no answer from {names} "
                        "(check power, cabling, id and baud rate)"
                    )
                self.bus.set_torque(self.ids, False)
                reading = self._read_retrying()
                q = self.cal.to_rad(reading.position)
                for j, qj in zip(self.cal.joints, q, strict=True):
                    if not j.min - RANGE_TOLERANCE <= qj <= j.max + RANGE_TOLERANCE:
                        raise DeviceError(
                            f"{self.bus.vendor} bus {self.bus.port}: joint '{j.name}' (servo id "
                            f"{j.id}) is at {qj:+.3f} rad, outside its calibrated range "
                            f"[{j.min:+.3f}, {j.max:+.3f}] rad ({self.cal.source}); torque stays "
                            "off: move it into range by hand or fix the calibration"
                        )
                for j in self.cal.joints:
                    self.bus.set_position_limits(j.id, *self.cal.tick_range(j))
                self.servo_watchdog = self.bus.set_watchdog(self.ids, self.watchdog_s)
                cap = self.bus.set_speed_limit(self.ids, SPEED_CAP * self.cal.velocity_ticks())
                self.speed_cap = np.abs(self.cal.speed_to_rad(cap))
                self._held_ticks = np.rint(reading.position).astype(np.int64)
                self.bus.sync_write_goal(self.ids, self._held_ticks)
                self.bus.set_torque(self.ids, True)
                self._store(reading)
            except BaseException:
                self._torque_off_quietly()
                self.bus.close()
                raise
            self._started = True

    def close(self) -> None:
        """Hold, then torque off (a servo arm is left limp, as on disconnect), close the port."""
        with self._lock:
            if not self._started:
                return
            try:
                self.hold()
            finally:
                self._torque_off_quietly()
                self.bus.close()
                self._started = False

    def read_state(self) -> RobotState:
        """The newest measurement (one sync read). After a fault has been raised once, the
        last good state again (unchanged `t` and `seq`), so the agent keeps reporting its
        stop; commands stay refused."""
        with self._lock:
            if self.fault is not None and self._fault_reported and self._last is not None:
                return self._last
            try:
                self._check()
            except DeviceError:
                self._fault_reported = True
                raise
            try:
                reading = self._read_retrying()
            except BusError as exc:
                self._fault_reported = True
                raise DeviceError(self._fail(exc)) from None
            return self._store(reading)

    def write_command(self, mode: CommandMode, values: Vec) -> None:
        if mode != "position":
            raise DeviceError(f"{self._info.name}: servo arms take position commands, not '{mode}'")
        v = np.asarray(values, dtype=float)
        if v.shape != (len(self.ids),) or not np.all(np.isfinite(v)):
            raise DeviceError(f"{self._info.name}: bad position command {v!r}")
        with self._lock:
            self._check()
            self.bus.sync_write_goal(self.ids, self.cal.to_ticks(v))
            self._held_ticks = None

    def hold(self) -> None:
        """Goal := last measured position for every servo (once per stop)."""
        with self._lock:
            if not self._started or self._last_ticks is None or self._held_ticks is not None:
                return
            ticks = np.rint(self._last_ticks).astype(np.int64)
            try:
                self.bus.sync_write_goal(self.ids, ticks)
            except OSError as exc:
                self.fault = self.fault or f"{self.bus.vendor} bus {self.bus.port}: {exc}"
                return
            self._held_ticks = ticks

    def forward_kinematics(self, joint_pos: Vec) -> Vec | None:
        return None

    # -- internals ---------------------------------------------------------------------------
    def _check(self) -> None:
        if not self._started:
            raise DeviceError(f"{self._info.name}: driver not started")
        if self.fault is not None:
            raise DeviceError(self.fault)

    def _ping(self, sid: int) -> str:
        """'ok', or how the last of `retries` + 1 pings failed."""
        res = "timeout"
        for _ in range(self.retries + 1):
            res = self.bus.ping(sid)
            if res == "ok":
                break
        return res

    def _read_retrying(self) -> Reading:
        last: BusError | None = None
        for attempt in range(self.retries + 1):
            try:
                r = self.bus.sync_read(self.ids)
            except BusError as exc:
                last = exc
                continue
            if attempt:
                self.bus_retries += 1
            return r
        assert last is not None
        raise last

    def _store(self, r: Reading) -> RobotState:
        self._last_ticks = r.position.astype(float)
        self._seq += 1
        effort = r.load * np.array([j.effort for j in self.cal.joints])
        state = RobotState(
            t=time.monotonic(),
            seq=self._seq,
            joint_pos=self.cal.to_rad(r.position),
            joint_vel=self.cal.speed_to_rad(r.speed),
            joint_effort=self.cal._vec("direction") * effort,
        )
        self._last = state
        return state

    def _fail(self, exc: BusError) -> str:
        """Hold the arm where it was last measured, find who is silent, latch and return the
        fault message."""
        self._held_ticks = None
        self.hold()
        probe = {j.id: self._ping(j.id) for j in self.cal.joints}
        silent = [i for i, r in probe.items() if r == "timeout"]
        garbled = [i for i, r in probe.items() if r == "corrupt"]
        where = f"{self.bus.vendor} bus {self.bus.port}"
        tries = self.retries + 1
        if silent and len(silent) == len(self.ids):
            msg = f"{where}: no servo answers (bus timeout after {tries} tries): cable or power"
        elif silent:
            names = ", ".join(self._joint(i) for i in silent)
            msg = f"{where}: {names} stopped answering ({exc.kind} after {tries} tries)"
        elif garbled:
            names = ", ".join(self._joint(i) for i in garbled)
            msg = f"{where}: corrupt status packets from {names} {tries} times in a row"
        else:
            msg = (
                f"{where}: {exc.kind} status packets from {self._joint(exc.sid)} "
                f"{tries} times in a row"
            )
        self.fault = msg + "; arm held at its last measured pose"
        return self.fault

    def _torque_off_quietly(self) -> None:
        try:
            self.bus.set_torque(self.ids, False)
        except (BusError, OSError, DeviceError):
            pass
