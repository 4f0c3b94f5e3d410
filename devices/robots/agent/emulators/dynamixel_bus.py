"""Dynamixel X-series servos (XL430/XM430 control table) on Protocol 2.0, emulated on a pty.

Answers ping, read, write, sync read and sync write with CRC-16 (polynomial 0x8005) framed,
byte-stuffed status packets; refuses EEPROM writes while torque is on (access error), goal
positions outside the Min/Max Position Limit registers (data limit error; the goal is not
applied) and, with the Bus Watchdog (98) set, stops the servo and latches the watchdog at -1
when the bus goes quiet longer than its setting, as the real servos do. In position mode the
servo moves no faster than its Profile Velocity (112, 0.229 rpm units; 0: its top speed); with
the time-based profile (Drive Mode bit 2) that register is instead the time (ms) each move
takes, so a far goal is a fast move.

    with DynamixelBus([1, 2, 3, 4, 5, 6]) as bus:     # bus.port is e.g. /dev/pts/5
        PortHandler(bus.port) ...
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable

from devices.robots.agent.emulators.pty_bus import PtyServoBus, ServoModel, check_ids

HEADER = b"\xff\xff\xfd\x00"
BROADCAST = 0xFE
INST_PING, INST_READ, INST_WRITE, INST_REBOOT = 0x01, 0x02, 0x03, 0x08
INST_SYNC_READ, INST_SYNC_WRITE, INST_STATUS = 0x82, 0x83, 0x55
ERR_INSTRUCTION, ERR_CRC, ERR_DATA_LENGTH, ERR_DATA_LIMIT, ERR_ACCESS = 2, 3, 5, 6, 7
MODEL_XM430_W350 = 1020
# Control table (address, size) of the registers the emulator gives meaning to
TORQUE_ENABLE, HW_ERROR, BUS_WATCHDOG = 64, 70, 98
DRIVE_MODE, OPERATING_MODE, VELOCITY_LIMIT, MAX_POS, MIN_POS = 10, 11, 44, 48, 52
TIME_BASED_PROFILE = 0x04  # Drive Mode bit 2
PROFILE_VELOCITY, GOAL_POSITION, MOVING = 112, 116, 122
PRESENT_CURRENT, PRESENT_VELOCITY, PRESENT_POSITION = 126, 128, 132
EEPROM_END = 64  # addresses below are EEPROM: writable only with torque off
READ_ONLY = set(range(0, 7)) | set(range(120, 147)) | {HW_ERROR}
TABLE_SIZE = 148
VEL_UNIT_TICKS_S = 0.229 * 4096 / 60.0  # 0.229 rpm per unit
TOP_SPEED_UNITS = 330  # the emulated servo's no-load speed (~76 rpm, 7.9 rad/s)


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x8005) if c & 0x8000 else (c << 1)
        table.append(c & 0xFFFF)
    return table


CRC_TABLE = _crc_table()


def crc16(data: bytes | bytearray) -> int:
    """CRC-16 of Protocol 2.0 (poly 0x8005, init 0, not reflected)."""
    crc = 0
    for b in data:
        crc = ((crc << 8) ^ CRC_TABLE[((crc >> 8) ^ b) & 0xFF]) & 0xFFFF
    return crc


def stuff(body: bytes) -> bytes:
    return body.replace(b"\xff\xff\xfd", b"\xff\xff\xfd\xfd")


def unstuff(body: bytes) -> bytes:
    return body.replace(b"\xff\xff\xfd\xfd", b"\xff\xff\xfd")


def status_packet(sid: int, error: int, params: bytes = b"") -> bytes:
    body = stuff(bytes([INST_STATUS, error]) + params)
    head = HEADER + bytes([sid]) + struct.pack("<H", len(body) + 2)
    pkt = head + body
    return pkt + struct.pack("<H", crc16(pkt))


def instruction_packet(sid: int, inst: int, params: bytes = b"") -> bytes:
    """An instruction packet (what a client sends); for tests of the framing."""
    body = stuff(bytes([inst]) + params)
    pkt = HEADER + bytes([sid]) + struct.pack("<H", len(body) + 2) + body
    return pkt + struct.pack("<H", crc16(pkt))


class DynamixelServo(ServoModel):
    def __init__(self, sid: int, position: float) -> None:
        super().__init__(sid=sid, position=position, goal=position)
        t = bytearray(TABLE_SIZE)
        struct.pack_into("<H", t, 0, MODEL_XM430_W350)
        t[6], t[7], t[8], t[11] = 52, sid, 3, 3  # firmware, id, 1 Mbps, position mode
        struct.pack_into("<I", t, VELOCITY_LIMIT, 200)
        struct.pack_into("<i", t, MAX_POS, 4095)
        struct.pack_into("<i", t, MIN_POS, 0)
        struct.pack_into("<i", t, GOAL_POSITION, int(round(position)))
        self.table = t
        self.last_heard = time.monotonic()
        self._move_speed = 0.0  # ticks/s of the current move under a time-based profile

    def i32(self, addr: int) -> int:
        return int(struct.unpack_from("<i", self.table, addr)[0])

    def refresh(self, now: float) -> None:
        wd = self.table[BUS_WATCHDOG]
        if 0 < wd < 128 and self.torque_on and now - self.last_heard > wd * 0.020:
            self.goal = self.position  # the servo stops by itself
            self.table[BUS_WATCHDOG] = 0xFF
        self.max_speed = self._speed_cap()
        self.advance(now)
        struct.pack_into("<i", self.table, PRESENT_POSITION, int(round(self.position)))
        struct.pack_into(
            "<i", self.table, PRESENT_VELOCITY, int(round(self.velocity / VEL_UNIT_TICKS_S))
        )
        cur = (
            max(-1193, min(1193, int(round(0.8 * (self.goal - self.position)))))
            if self.torque_on
            else 0
        )
        struct.pack_into("<h", self.table, PRESENT_CURRENT, cur)
        self.table[MOVING] = int(abs(self.velocity) > 2 * VEL_UNIT_TICKS_S)

    def _speed_cap(self) -> float:
        """ticks/s the position profile allows now."""
        top = TOP_SPEED_UNITS * VEL_UNIT_TICKS_S
        prof = self.i32(PROFILE_VELOCITY)
        if prof <= 0:
            return top
        if self.table[DRIVE_MODE] & TIME_BASED_PROFILE:
            return min(top, self._move_speed) if self._move_speed > 0 else top
        return min(top, prof * VEL_UNIT_TICKS_S)

    def write(self, addr: int, data: bytes, log: list[tuple[int, int]]) -> int:
        """Write `data` at `addr`; returns the Protocol 2.0 error number (0: applied)."""
        end = addr + len(data)
        if addr < 0 or end > TABLE_SIZE or not data:
            return ERR_DATA_LENGTH
        if any(a in READ_ONLY for a in range(addr, end)):
            return ERR_ACCESS
        if addr < EEPROM_END and self.torque_on:
            return ERR_ACCESS
        new = bytearray(self.table)
        new[addr:end] = data
        if addr <= GOAL_POSITION < end:
            raw = int(struct.unpack_from("<i", new, GOAL_POSITION)[0])
            log.append((self.sid, raw))
            if self.table[BUS_WATCHDOG] == 0xFF:
                return ERR_ACCESS  # goals are frozen while the bus watchdog has tripped
            if not self.i32(MIN_POS) <= raw <= self.i32(MAX_POS):
                return ERR_DATA_LIMIT
        if addr <= BUS_WATCHDOG < end and new[BUS_WATCHDOG] == 0xFF:
            return ERR_DATA_LIMIT
        self.table[addr:end] = new[addr:end]
        self.torque_on = bool(self.table[TORQUE_ENABLE])
        if addr <= GOAL_POSITION < end:
            self.goal = float(self.i32(GOAL_POSITION))
            # time-based profile: this move takes Profile Velocity ms, however far it goes
            span_s = max(self.i32(PROFILE_VELOCITY), 1) * 1e-3
            self._move_speed = abs(self.goal - self.position) / span_s
        if addr <= TORQUE_ENABLE < end and self.torque_on:
            self.goal = self.position  # torque on holds where it is until a goal arrives
            struct.pack_into("<i", self.table, GOAL_POSITION, int(round(self.position)))
        return 0


class DynamixelBus(PtyServoBus):
    """A Protocol 2.0 bus of X-series servos. `positions` (ticks) sets where each servo starts."""

    name = "dynamixel bus"

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
        self.servos = {i: DynamixelServo(i, float(p)) for i, p in zip(id_list, pos, strict=True)}

    def ids(self) -> list[int]:
        return list(self.servos)

    def servo(self, sid: int) -> DynamixelServo:
        return self.servos[sid]

    def _idle(self, now: float) -> None:
        for s in self.servos.values():
            s.refresh(now)

    def _frame(self, buf: bytearray) -> tuple[bytes | None, int]:
        start = buf.find(HEADER)
        if start < 0:
            return None, max(0, len(buf) - 3)  # keep a possible partial header
        if start > 0:
            return None, start
        if len(buf) < 7:
            return None, 0
        total = 7 + struct.unpack_from("<H", buf, 5)[0]
        if total > 1024:
            return None, 1
        if len(buf) < total:
            return None, 0
        pkt = bytes(buf[:total])
        if crc16(pkt[:-2]) != struct.unpack_from("<H", pkt, total - 2)[0]:
            return None, total
        return pkt, total

    def _handle(self, packet: bytes) -> list[tuple[int, bytes]]:
        sid, inst = packet[4], packet[7]
        params = unstuff(packet[8:-2])
        now = time.monotonic()
        self._idle(now)  # watchdogs look at the gap before this packet
        targets = list(self.servos) if sid == BROADCAST else [sid] if sid in self.servos else []
        for t in targets:
            self.servos[t].last_heard = now
        if inst == INST_SYNC_READ and sid == BROADCAST and len(params) >= 4:
            addr, n = struct.unpack_from("<HH", params, 0)
            out = []
            for i in params[4:]:
                s = self.servos.get(i)
                if s is not None:
                    s.last_heard = now
                    s.refresh(now)
                    ok = addr + n <= TABLE_SIZE
                    data = bytes(s.table[addr : addr + n]) if ok else b""
                    out.append((i, status_packet(i, 0 if ok else ERR_DATA_LENGTH, data)))
            return out
        if inst == INST_SYNC_WRITE and sid == BROADCAST and len(params) >= 4:
            addr, n = struct.unpack_from("<HH", params, 0)
            body = params[4:]
            log: list[tuple[int, int]] = []
            for k in range(0, len(body) - n, n + 1):
                s = self.servos.get(body[k])
                if s is not None:
                    s.last_heard = now
                    s.refresh(now)
                    s.write(addr, body[k + 1 : k + 1 + n], log)
            for i, raw in log:
                self.log_goal(i, raw)
            return []
        if sid not in self.servos:
            return []
        s = self.servos[sid]
        s.refresh(now)
        if inst == INST_PING:
            return [(sid, status_packet(sid, 0, bytes(s.table[0:2]) + bytes([s.table[6]])))]
        if inst == INST_READ and len(params) == 4:
            addr, n = struct.unpack_from("<HH", params, 0)
            if addr + n > TABLE_SIZE:
                return [(sid, status_packet(sid, ERR_DATA_LENGTH))]
            return [(sid, status_packet(sid, 0, bytes(s.table[addr : addr + n])))]
        if inst == INST_WRITE and len(params) >= 3:
            addr = struct.unpack_from("<H", params, 0)[0]
            log = []
            err = s.write(addr, params[2:], log)
            for i, raw in log:
                self.log_goal(i, raw)
            return [(sid, status_packet(sid, err))]
        if inst == INST_REBOOT:
            s.table[HW_ERROR] = 0
            return [(sid, status_packet(sid, 0))]
        return [(sid, status_packet(sid, ERR_INSTRUCTION))]
