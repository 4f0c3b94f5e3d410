"""Dynamixel X-series arms (Koch-style) on `dynamixel-sdk`, Protocol 2.0.

`DynamixelSdkBus` is the `ServoBus` adapter (devices/robots/agent/drivers/servo_bus.py): one
GroupSyncRead of present current, velocity and position (addresses 126-135), one
GroupSyncWrite of profile velocity and goal position (112-119: the joint's speed limit travels
with every goal), torque by sync write (64), the calibrated range written to Min/Max Position
Limit (52/48, EEPROM, torque off), the velocity-based profile selected (Drive Mode 10, bit 2
cleared: with the time-based one, Profile Velocity is a duration and a far goal a fast move),
and the servo's own Bus Watchdog (98, 20 ms units) so the servos stop by themselves if the
agent goes quiet. The SDK is imported at first use.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.agent.drivers.arm_calibration import ArmCalibration
from devices.robots.agent.drivers.arm_description import bundle
from devices.robots.agent.drivers.servo_bus import RETRIES, BusError, Reading, ServoArmDriver

DRIVE_MODE, OPERATING_MODE, MAX_POS, MIN_POS, TORQUE_ENABLE, BUS_WATCHDOG = 10, 11, 48, 52, 64, 98
PROFILE_VELOCITY, GOAL_POSITION = 112, 116
PRESENT_CURRENT, READ_LEN = 126, 10  # current(2) velocity(4) position(4)
TIME_BASED_PROFILE = 0x04  # Drive Mode bit 2
VEL_UNIT_TICKS_S = 0.229 * 4096 / 60.0  # 0.229 rpm
CURRENT_UNIT_A, STALL_CURRENT_A = 2.69e-3, 2.3  # XM430-W350
WRITE_TRIES = 3
READ_WAIT_S = 0.002  # pyserial read timeout under the SDK's polling loop


class DynamixelSdkBus:
    vendor = "dynamixel"

    def __init__(self, port: str, baud: int = 1_000_000) -> None:
        self.port, self.baud = port, baud
        self._ph: Any = None
        self._pk: Any = None
        self._reads: dict[tuple[int, ...], Any] = {}
        self._profile: dict[int, int] = {}  # Profile Velocity (0.229 rpm units) per servo

    def open(self) -> None:
        import dynamixel_sdk as sdk
        import serial

        self._sdk = sdk
        self._ph = sdk.PortHandler(self.port)
        self._pk = sdk.PacketHandler(2.0)
        self._ph.baudrate = self.baud
        try:
            ok = self._ph.openPort()
        except (serial.SerialException, OSError) as exc:
            raise DeviceError(f"dynamixel bus {self.port}: cannot open the port ({exc})") from None
        if not ok:
            raise DeviceError(f"dynamixel bus {self.port}: baud rate {self.baud} not supported")
        # The SDK polls with non-blocking reads (a busy loop until a status packet or its
        # packet timeout); a short blocking read lets the loop sleep in select() instead:
        # 7x less CPU and sync-read p99 from ~20 ms to ~3 ms on a loaded machine (measured)
        self._ph.ser.timeout = READ_WAIT_S

    def close(self) -> None:
        if self._ph is not None and self._ph.is_open:
            self._ph.closePort()

    def _result(self, what: str, sid: int, res: int, err: int) -> None:
        if res != self._sdk.COMM_SUCCESS:
            raise DeviceError(
                f"dynamixel bus {self.port}: {what} servo {sid}: {self._pk.getTxRxResult(res)}"
            )
        if err:
            raise DeviceError(
                f"dynamixel bus {self.port}: {what} servo {sid}: {self._pk.getRxPacketError(err)}"
            )

    def _retry(self, write: Any, sid: int, addr: int, v: int) -> tuple[int, int]:
        """A register write with bounded retries on a missing or bad status packet."""
        res, err = self._sdk.COMM_RX_TIMEOUT, 0
        for _ in range(WRITE_TRIES):
            res, err = write(self._ph, sid, addr, v)
            if res == self._sdk.COMM_SUCCESS:
                break
        return int(res), int(err)

    def ping(self, sid: int) -> str:
        try:
            _, res, _ = self._pk.ping(self._ph, sid)
        except IndexError:  # the SDK indexes a too-short reply (a late packet of another id)
            self._ph.is_using = False
            return "corrupt"
        if res == self._sdk.COMM_SUCCESS:
            return "ok"
        return "timeout" if res == self._sdk.COMM_RX_TIMEOUT else "corrupt"

    def sync_read(self, ids: list[int]) -> Reading:
        key = tuple(ids)
        group = self._reads.get(key)
        if group is None:
            group = self._sdk.GroupSyncRead(self._ph, self._pk, PRESENT_CURRENT, READ_LEN)
            for i in ids:
                group.addParam(i)
            self._reads[key] = group
        for i in ids:
            group.data_dict[i] = []
        res = group.txRxPacket()
        if res != self._sdk.COMM_SUCCESS:
            bad = next((i for i in ids if len(group.data_dict[i]) != READ_LEN), None)
            kind = "timeout" if res == self._sdk.COMM_RX_TIMEOUT else "corrupt"
            raise BusError(kind, bad, self._pk.getTxRxResult(res))
        raw = [struct.unpack("<hii", bytes(group.data_dict[i])) for i in ids]
        cur, vel, pos = (np.array(c, dtype=float) for c in zip(*raw, strict=True))
        return Reading(pos, vel * VEL_UNIT_TICKS_S, cur * CURRENT_UNIT_A / STALL_CURRENT_A)

    def _sync_write(self, addr: int, size: int, ids: list[int], values: list[int]) -> None:
        group = self._sdk.GroupSyncWrite(self._ph, self._pk, addr, size)
        for i, v in zip(ids, values, strict=True):
            group.addParam(i, list(int(v).to_bytes(size, "little", signed=True)))
        res = group.txPacket()
        if res != self._sdk.COMM_SUCCESS:
            raise OSError(
                f"dynamixel bus {self.port}: sync write failed: {self._pk.getTxRxResult(res)}"
            )

    def sync_write_goal(self, ids: list[int], ticks: NDArray[np.int64]) -> None:
        if not all(i in self._profile for i in ids):
            self._sync_write(GOAL_POSITION, 4, ids, [int(t) for t in ticks])
            return
        group = self._sdk.GroupSyncWrite(self._ph, self._pk, PROFILE_VELOCITY, 8)
        for i, t in zip(ids, ticks, strict=True):
            group.addParam(i, list(struct.pack("<Ii", self._profile[i], int(t))))
        res = group.txPacket()
        if res != self._sdk.COMM_SUCCESS:
            raise OSError(
                f"dynamixel bus {self.port}: sync write failed: {self._pk.getTxRxResult(res)}"
            )

    def set_speed_limit(
        self, ids: list[int], ticks_per_s: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """Velocity-based profile at each servo's `ticks_per_s` (rounded down; torque off).
        Two bus transactions for the arm (one sync read, one sync write) unless a servo is on
        the time-based profile: starting on a loaded machine stays as likely as it was."""
        units = [max(1, min(32767, math.floor(v / VEL_UNIT_TICKS_S))) for v in ticks_per_s]
        group = self._sdk.GroupSyncRead(self._ph, self._pk, DRIVE_MODE, 1)
        for sid in ids:
            group.addParam(sid)
        res = self._sdk.COMM_RX_TIMEOUT
        for _ in range(WRITE_TRIES):
            for sid in ids:
                group.data_dict[sid] = []
            res = group.txRxPacket()
            if res == self._sdk.COMM_SUCCESS:
                break
        if res != self._sdk.COMM_SUCCESS:
            raise DeviceError(
                f"dynamixel bus {self.port}: reading the drive mode of servos {ids}: "
                f"{self._pk.getTxRxResult(res)}"
            )
        for sid in ids:
            mode = int(group.data_dict[sid][0])
            if mode & TIME_BASED_PROFILE:
                res, err = self._retry(
                    self._pk.write1ByteTxRx, sid, DRIVE_MODE, mode & ~TIME_BASED_PROFILE
                )
                self._result("selecting the velocity-based profile of", sid, res, err)
        self._sync_write(PROFILE_VELOCITY, 4, ids, units)
        self._profile = dict(zip(ids, units, strict=True))
        return np.array(units, dtype=float) * VEL_UNIT_TICKS_S

    def set_torque(self, ids: list[int], on: bool) -> None:
        self._sync_write(TORQUE_ENABLE, 1, ids, [int(on)] * len(ids))

    def set_position_limits(self, sid: int, low: int, high: int) -> None:
        for addr, v in ((OPERATING_MODE, 3), (MAX_POS, high), (MIN_POS, low)):
            write = self._pk.write1ByteTxRx if addr == OPERATING_MODE else self._pk.write4ByteTxRx
            res, err = self._retry(write, sid, addr, v)
            self._result(f"writing register {addr} of", sid, res, err)

    def set_watchdog(self, ids: list[int], timeout_s: float) -> bool:
        units = max(1, min(127, math.ceil(timeout_s / 0.020)))
        for sid in ids:
            for v in (0, units):  # 0 first: clears a watchdog that tripped earlier
                res, err = self._retry(self._pk.write1ByteTxRx, sid, BUS_WATCHDOG, v)
                self._result("setting the bus watchdog of", sid, res, err)
        return True


def make_driver(
    port: str,
    calibration: ArmCalibration | Path,
    rate_hz: float = 100.0,
    baud: int = 1_000_000,
    urdf: Path | None = None,
    retries: int = RETRIES,
) -> ServoArmDriver:
    """A Koch-style Dynamixel arm on `port` with its calibration (object or JSON file)."""

    cal = (
        calibration if isinstance(calibration, ArmCalibration) else ArmCalibration.load(calibration)
    )
    return ServoArmDriver(
        DynamixelSdkBus(port, baud), cal, rate_hz, retries=retries, bundle=bundle(cal, urdf)
    )
