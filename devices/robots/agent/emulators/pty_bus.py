"""A half-duplex servo bus on a pseudo-terminal, served by a thread: the common half of the
Dynamixel and Feetech emulators.

The client (a vendor SDK, unmodified) opens `bus.port` (the pty's slave, e.g. /dev/pts/7)
exactly as it opens a USB serial adapter. The emulator thread reads the master side, frames
instruction packets with the protocol's own parser (subclass), answers with status packets
after the bus time they would take at `baud` (10 bits per byte) plus the servo's return
delay, and keeps a register table and a simple motion model per servo.

Faults for tests and benchmarks: `silence(ids)` (servos stop answering; all of them is a bus
timeout), `corrupt_replies(n)` (the next n status packets go out with a bad checksum),
`noise(b)` (stray bytes on the line). Every goal position written on the wire is logged in
`goals` as (monotonic time, servo id, raw value), before the servo applies its own limits,
so a test can judge exactly what the driver sent.
"""

from __future__ import annotations

import math
import os
import select
import termios
import threading
import time
import tty
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

from devices.errors import DeviceError

IDLE_S = 0.02  # servo-side timers (bus watchdog: 20 ms units) run this often on a quiet line


@dataclass
class ServoModel:
    """One servo's mechanics: position in ticks follows the goal with a first-order lag
    `tau_s` (the servo's own position loop) at no more than `max_speed` ticks/s (its top
    speed, or the speed its profile / goal-speed register sets), integrated exactly between
    bus packets, so the speed limit holds at every instant and not only on average.

    `peak_speed` is the highest speed (ticks/s) the servo has moved at (set it to 0 to start
    over): the truth a benchmark judges the driver by, whatever the driver read back."""

    sid: int
    position: float = 2048.0
    goal: float = 2048.0
    velocity: float = 0.0  # ticks/s, mean over the last interval (what the servo reports)
    torque_on: bool = False
    max_speed: float = 3000.0  # ticks/s (~4.6 rad/s at 4096 ticks/rev)
    tau_s: float = 0.03
    peak_speed: float = 0.0  # ticks/s
    peak_t: float = 0.0  # monotonic s when peak_speed was reached
    _t: float = 0.0

    def advance(self, now: float) -> None:
        """Move the model to time `now` (monotonic s)."""
        if self._t == 0.0:
            self._t = now
            return
        dt = now - self._t
        self._t = now
        if dt <= 0:
            return
        if not self.torque_on:
            self.velocity = 0.0
            return
        err = self.goal - self.position
        e0, cap, tau = abs(err), max(self.max_speed, 0.0), self.tau_s
        # at full speed while the lag's own speed |e|/tau would exceed the cap, then the
        # exponential approach: the fastest instant of the interval is its start
        fast = min(dt, max(0.0, (e0 - cap * tau) / cap)) if cap > 0 else 0.0
        rest = min(e0 - cap * fast, cap * tau) if cap > 0 else 0.0
        moved = cap * fast + rest * (1.0 - math.exp(-(dt - fast) / tau))
        step = math.copysign(min(moved, e0), err)
        speed = min(e0 / tau, cap)
        if speed > self.peak_speed:
            self.peak_speed, self.peak_t = speed, now
        self.position += step
        self.velocity = step / dt


class PtyServoBus:
    """Base class: pty, reader thread, bus timing, faults, goal log. Subclasses implement
    `_frame(buf) -> (packet | None, consumed)` and `_handle(packet) -> list[bytes]`."""

    name = "servo bus"

    def __init__(self, baud: int = 1_000_000, return_delay_us: float = 0.0) -> None:
        self.baud = baud
        self.byte_s = 10.0 / baud  # start + 8 data + stop bits
        self.return_delay_s = return_delay_us * 1e-6
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        attrs = termios.tcgetattr(self._slave)
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(self._slave, termios.TCSANOW, attrs)
        self.port = os.ttyname(self._slave)
        self.lock = threading.RLock()
        self.goals: list[tuple[float, int, int]] = []
        self.packets_in = 0
        self.packets_bad = 0
        self._silent: set[int] = set()
        self._corrupt = 0
        self._noise = b""
        self._running = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> Self:
        if not self._running:
            self._running = True
            self._thread = threading.Thread(target=self._run, name=f"emu-{self.port}", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._running = False
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        for fd in (self._master, self._slave):
            try:
                os.close(fd)
            except OSError:
                pass
        self._master = self._slave = -1

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults -------------------------------------------------------------------------
    def silence(self, ids: Iterable[int] | None = None) -> None:
        """Servos `ids` (None: every servo: a dead bus) stop answering."""
        with self.lock:
            self._silent = set(self.ids() if ids is None else ids)

    def unsilence(self) -> None:
        with self.lock:
            self._silent = set()

    def corrupt_replies(self, n: int) -> None:
        """The next `n` status packets go out with a wrong checksum/CRC."""
        with self.lock:
            self._corrupt = n

    def noise(self, data: bytes) -> None:
        """Stray bytes on the line before the next status packet."""
        with self.lock:
            self._noise = data

    # -- for subclasses ---------------------------------------------------------------------
    def ids(self) -> list[int]:
        raise NotImplementedError

    def _frame(self, buf: bytearray) -> tuple[bytes | None, int]:
        raise NotImplementedError

    def _handle(self, packet: bytes) -> list[tuple[int, bytes]]:
        """Answer one valid instruction packet: [(servo id, status packet), ...] in order."""
        raise NotImplementedError

    def _idle(self, now: float) -> None:
        """Called when the line is quiet (every IDLE_S): servo-side timers."""

    def _spoil(self, packet: bytes) -> bytes:
        return packet[:-1] + bytes([packet[-1] ^ 0x5A])

    def log_goal(self, sid: int, raw: int) -> None:
        self.goals.append((time.monotonic(), sid, raw))

    # -- thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        buf = bytearray()
        while self._running:
            try:
                r, _, _ = select.select([self._master], [], [], IDLE_S)
                if not r:
                    with self.lock:
                        self._idle(time.monotonic())
                    continue
                chunk = os.read(self._master, 4096)
            except OSError:
                time.sleep(0.01)  # no client has the port open
                continue
            t_rx = time.monotonic()
            buf.extend(chunk)
            while buf:
                packet, used = self._frame(buf)
                if used == 0:
                    break
                del buf[:used]
                if packet is None:
                    self.packets_bad += 1
                    continue
                self.packets_in += 1
                # The instruction took len(packet) byte times on the wire: replies start after
                with self.lock:
                    replies = self._handle(packet)
                    silent, corrupt = set(self._silent), self._corrupt
                    noise, self._noise = self._noise, b""
                due = t_rx + len(packet) * self.byte_s
                out = bytearray(noise)
                for sid, reply in replies:
                    if sid in silent:
                        continue
                    if corrupt > 0:
                        reply = self._spoil(reply)
                        corrupt -= 1
                    due += self.return_delay_s + len(reply) * self.byte_s
                    out.extend(reply)
                with self.lock:
                    self._corrupt = min(self._corrupt, corrupt)
                if out:
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    try:
                        os.write(self._master, bytes(out))
                    except OSError:
                        pass


def check_ids(ids: Iterable[int], name: str) -> list[int]:
    out = [int(i) for i in ids]
    if len(set(out)) != len(out) or any(not 0 <= i <= 252 for i in out):
        raise DeviceError(f"{name}: servo ids must be unique and in 0..252, got {out}")
    return out
