"""Feetech STS servos (STS3215 memory table, as in SO-100/SO-101 arms) on the SCS serial
protocol, emulated on a pty.

Frames are `FF FF id len inst params checksum` with checksum = ~(id + len + inst + params);
the emulator answers ping, read, write, sync read and sync write, keeps the STS3215 table
(little-endian words, speeds and loads sign-magnitude in bit 15) and clamps a goal outside
the Min/Max Angle Limit registers to the limit and flags the angle error bit, as the servo
does. A servo moves no faster than its Goal Speed (46, steps/s; 0: its top speed, 3400).
Feetech STS servos have no bus watchdog.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable

from devices.robots.agent.emulators.pty_bus import PtyServoBus, ServoModel, check_ids

BROADCAST = 0xFE
INST_PING, INST_READ, INST_WRITE, INST_SYNC_READ, INST_SYNC_WRITE = 0x01, 0x02, 0x03, 0x82, 0x83
ERRBIT_ANGLE, ERRBIT_OVERLOAD = 0x02, 0x20
MODEL_STS3215 = 777
MIN_ANGLE, MAX_ANGLE, TORQUE_ENABLE, GOAL_POSITION, GOAL_SPEED = 9, 11, 40, 42, 46
TOP_SPEED = 3400.0  # steps/s: the STS3215's no-load speed at 12 V (5.2 rad/s)
LOCK, PRESENT_POSITION, PRESENT_SPEED, PRESENT_LOAD, MOVING = 55, 56, 58, 60, 66
READ_ONLY = set(range(0, 5)) | set(range(56, 71))
TABLE_SIZE = 71


def checksum(data: bytes | bytearray) -> int:
    return ~sum(data) & 0xFF


def packet(sid: int, first: int, params: bytes = b"") -> bytes:
    """A frame: `first` is the instruction (client) or the error byte (status)."""
    body = bytes([sid, len(params) + 2, first]) + params
    return b"\xff\xff" + body + bytes([checksum(body)])


def to_sm(v: int) -> int:
    """Signed value -> sign-magnitude word (bit 15)."""
    return (min(-v, 0x7FFF) | 0x8000) if v < 0 else min(v, 0x7FFF)


class FeetechServo(ServoModel):
    def __init__(self, sid: int, position: float) -> None:
        super().__init__(sid=sid, position=position, goal=position, max_speed=TOP_SPEED)
        t = bytearray(TABLE_SIZE)
        struct.pack_into("<H", t, 3, MODEL_STS3215)
        t[5], t[6] = sid, 0  # id, 1 Mbps
        struct.pack_into("<HH", t, MIN_ANGLE, 0, 4095)
        struct.pack_into("<H", t, GOAL_POSITION, int(round(position)))
        t[LOCK] = 1
        self.table = t
        self.error = 0

    def u16(self, addr: int) -> int:
        return int(struct.unpack_from("<H", self.table, addr)[0])

    def refresh(self, now: float) -> None:
        speed = self.u16(GOAL_SPEED) & 0x7FFF
        self.max_speed = min(float(speed), TOP_SPEED) if speed else TOP_SPEED
        self.advance(now)
        struct.pack_into("<H", self.table, PRESENT_POSITION, int(round(self.position)) & 0xFFFF)
        struct.pack_into("<H", self.table, PRESENT_SPEED, to_sm(int(round(self.velocity))))
        load = int(round(2.0 * (self.goal - self.position))) if self.torque_on else 0
        struct.pack_into("<H", self.table, PRESENT_LOAD, to_sm(max(-1000, min(1000, load))))
        self.table[MOVING] = int(abs(self.velocity) > 10)

    def write(self, addr: int, data: bytes, log: list[tuple[int, int]]) -> int:
        """Write `data` at `addr`; returns the status error byte."""
        end = addr + len(data)
        if end > TABLE_SIZE or not data or any(a in READ_ONLY for a in range(addr, end)):
            return 0  # the STS ignores writes it cannot do
        self.table[addr:end] = data
        self.torque_on = bool(self.table[TORQUE_ENABLE])
        err = 0
        if addr <= GOAL_POSITION < end:
            raw = self.u16(GOAL_POSITION)
            log.append((self.sid, raw))
            lo, hi = self.u16(MIN_ANGLE), self.u16(MAX_ANGLE)
            goal = min(max(raw, lo), hi)
            if goal != raw:
                err |= ERRBIT_ANGLE
                struct.pack_into("<H", self.table, GOAL_POSITION, goal)
            self.goal = float(goal)
        if addr <= TORQUE_ENABLE < end and self.torque_on and not addr <= GOAL_POSITION < end:
            self.goal = self.position
            struct.pack_into("<H", self.table, GOAL_POSITION, int(round(self.position)))
        return err


class FeetechBus(PtyServoBus):
    """An SCS-protocol bus of STS3215 servos. `positions` (ticks) sets where each starts."""

    name = "feetech bus"

    def __init__(
        self,
        ids: Iterable[int],
        positions: Iterable[float] | None = None,
        baud: int = 1_000_000,
        return_delay_us: float = 0.0,
    ) -> None:
        super().__init__(baud, return_delay_us)
        id_list = check_ids(ids, self.name)
        pos = list(positions) if positions is not None else [2048.0] * len(id_list)
        self.servos = {i: FeetechServo(i, float(p)) for i, p in zip(id_list, pos, strict=True)}

    def ids(self) -> list[int]:
        return list(self.servos)

    def servo(self, sid: int) -> FeetechServo:
        return self.servos[sid]

    def _idle(self, now: float) -> None:
        for s in self.servos.values():
            s.refresh(now)

    def _frame(self, buf: bytearray) -> tuple[bytes | None, int]:
        start = buf.find(b"\xff\xff")
        if start < 0:
            return None, max(0, len(buf) - 1)
        if start > 0:
            return None, start
        if len(buf) < 4:
            return None, 0
        if buf[2] == 0xFF:  # a third 0xFF: the header starts one byte later
            return None, 1
        total = buf[3] + 4
        if buf[3] < 2:
            return None, 2
        if len(buf) < total:
            return None, 0
        pkt = bytes(buf[:total])
        if checksum(pkt[2:-1]) != pkt[-1]:
            return None, total
        return pkt, total

    def _handle(self, pkt: bytes) -> list[tuple[int, bytes]]:
        sid, inst, params = pkt[2], pkt[4], pkt[5:-1]
        now = time.monotonic()
        self._idle(now)
        if inst == INST_SYNC_READ and sid == BROADCAST and len(params) >= 2:
            addr, n = params[0], params[1]
            out = []
            for i in params[2:]:
                s = self.servos.get(i)
                if s is not None and addr + n <= TABLE_SIZE:
                    out.append((i, packet(i, 0, bytes(s.table[addr : addr + n]))))
            return out
        if inst == INST_SYNC_WRITE and sid == BROADCAST and len(params) >= 2:
            addr, n = params[0], params[1]
            body = params[2:]
            log: list[tuple[int, int]] = []
            for k in range(0, len(body) - n, n + 1):
                s = self.servos.get(body[k])
                if s is not None:
                    s.write(addr, body[k + 1 : k + 1 + n], log)
            for i, raw in log:
                self.log_goal(i, raw)
            return []
        s = self.servos.get(sid)
        if s is None:
            return []
        if inst == INST_PING:
            return [(sid, packet(sid, 0))]
        if inst == INST_READ and len(params) == 2:
            addr, n = params[0], params[1]
            if addr + n > TABLE_SIZE:
                return [(sid, packet(sid, 0))]
            return [(sid, packet(sid, 0, bytes(s.table[addr : addr + n])))]
        if inst == INST_WRITE and len(params) >= 2:
            log = []
            err = s.write(params[0], params[1:], log)
            for i, raw in log:
                self.log_goal(i, raw)
            return [(sid, packet(sid, err))]
        return [(sid, packet(sid, 0))]
