"""`RobotClient`: the workbench side of the robot protocol (see wire/PROTOCOL.md).

    with RobotClient("127.0.0.1", 7700, token) as robot:
        robot.info.joint_names
        traj = robot.stream(2.0)              # Trajectory of what the robot measured
        robot.command_position(q)
        robot.upload_policy(onnx_bytes, spec); robot.run_policy(ramp_s=1.0)
        robot.stop()

The handshake is a challenge-response (the token never travels). TLS: pass
`tls_fingerprint="sha256:…"` (pinned) or `tls=True` (trusted on first use, recorded in
~/.config/twinbench/known_robots). After a watchdog stop, `take_control()` before moving.

A reader thread receives states, replies, events and camera frames; a heartbeat thread keeps
the robot's watchdog fed. If the connection breaks, or the state stream goes silent for
`stale_timeout_s`, every later call raises DeviceError naming host:port.

The silence allowed is sized from the robot (`no_data_timeout`): ten times its heartbeat
deadline, at least 3 s, stretched on a loaded machine, at most the server's 10 s idle
timeout; a busy laptop's hiccup is not a lost robot (the robot's own watchdog keeps the arm
safe meanwhile). With `reconnect=True` a lost link is dialled again with backoff until it
answers, `close()` is called or `reconnect_while()` says no (the lab process died):
`link_state` goes "reconnecting" then "connected", `on_link(state, message)` and an event of
kind "link" say what happened ("robot link lost (no data for 3.0 s); reconnected after
2.3 s"). A reconnected client is a new session (`epoch` counts them): the robot dropped
control and the uploaded policy with the old one, so nothing moves again until
`take_control()`, and `check(epoch)` fails any operation that began before the drop.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import logging
import os
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from devices.errors import DeviceError
from devices.frames import RGBDFrame
from devices.robots.wire import protocol as P
from devices.robots.wire.auth import client_proof, new_nonce, proof_matches, server_proof
from devices.robots.wire.robot_types import RobotInfo, RobotState
from devices.robots.wire.tls import SerialTLS, check_pinned, client_context
from devices.trajectory import COMMAND_DELAY, Trajectory

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_TIMEOUT_S = 0.25  # the agent's default heartbeat deadline
# How often the heartbeat thread sends: a gap the robot sees is this plus however long the
# thread was kept from running (the GIL held by the workbench's own work, 0.2-0.6 s at load
# 4 in `bench loop`); 50 ms left 200 ms of the 250 ms deadline and scans were stopped at 251-253.
HEARTBEAT_PERIOD_S = 0.02
MIN_NO_DATA_S = 3.0  # never call a link lost on less silence than this
MAX_NO_DATA_S = 10.0  # the server's idle timeout: a link silent that long is gone anyway
MAX_LOAD_STRETCH = 3.0
RECONNECT_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # then every 5 s


_gc_lock = threading.Lock()
_gc_holds = [0, False]  # recordings running, whether the collector was on before the first


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector waits while the block runs (nested and from several
    threads: it resumes when the last block ends, if it was on before the first). A full
    collection walks the whole heap of a workbench that has loaded Open3D, PyBullet and Qt
    (~0.1 s per 200k objects, more on a slow machine) with the GIL held, and the heartbeat
    thread waits with it: a recording on a CI machine was stopped by the robot's 250 ms
    watchdog at 253 ms. A stream's own garbage (state dicts, arrays) is freed by reference
    counting; what cycles it leaves are collected when the collector resumes."""
    with _gc_lock:
        if _gc_holds[0] == 0:
            _gc_holds[1] = gc.isenabled()
            gc.disable()
        _gc_holds[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holds[0] -= 1
            if _gc_holds[0] == 0 and _gc_holds[1]:
                gc.enable()


def load_per_core() -> float:
    """The 1-minute load average per CPU core (0 where the system cannot say)."""
    try:
        return float(os.getloadavg()[0]) / float(os.cpu_count() or 1)
    except (OSError, AttributeError):
        return 0.0


def no_data_timeout(heartbeat_timeout_s: float | None, load: float | None = None) -> float:
    """How long the state stream may stay silent before the link counts as lost (s):
    10 x the robot's heartbeat deadline, at least `MIN_NO_DATA_S`, times the load per core
    (`load`, default now; between 1 and 3), at most `MAX_NO_DATA_S`."""
    hb = heartbeat_timeout_s if heartbeat_timeout_s and heartbeat_timeout_s > 0 else None
    base = max(MIN_NO_DATA_S, 10.0 * (hb or DEFAULT_HEARTBEAT_TIMEOUT_S))
    stretch = min(max(load_per_core() if load is None else load, 1.0), MAX_LOAD_STRETCH)
    return float(min(base * stretch, MAX_NO_DATA_S))


def _close_after_use(sock: P.Stream, send_lock: threading.Lock) -> None:
    """Close `sock` once no thread reads or writes it: its reader has left (the caller saw
    to that) and no send is in flight (`send_lock`). A descriptor closed under a read can
    be handed to the next connection, which the old read would then consume."""
    with send_lock, contextlib.suppress(OSError):
        sock.close()


UNITS = {
    "robot/joint_pos": "rad",
    "robot/joint_vel": "rad/s",
    "robot/joint_effort": "N*m",
    "robot/command": "rad",
}


class RobotClient:
    """A connection to one robot agent (virtual lab or hardware)."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        *,
        name: str = "twinbench",
        connect_timeout_s: float = 3.0,
        request_timeout_s: float = 10.0,
        heartbeat: bool = True,
        heartbeat_period_s: float = HEARTBEAT_PERIOD_S,
        stale_timeout_s: float | None = None,
        subscribe_state: bool = True,
        version: int = P.PROTOCOL_VERSION,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        tls: bool = False,
        tls_fingerprint: str | None = None,
        known_robots: Path | None = None,
        reconnect: bool = False,
        reconnect_while: Callable[[], bool] | None = None,
        on_link: Callable[[str, str], None] | None = None,
    ) -> None:
        self.host, self.port, self._token, self.name = host, int(port), token, name
        self.address = f"{host}:{self.port}"
        self.connect_timeout_s, self.request_timeout_s = connect_timeout_s, request_timeout_s
        self.heartbeat_enabled, self.heartbeat_period_s = heartbeat, heartbeat_period_s
        # None: sized from the robot's heartbeat deadline and the load (`no_data_timeout`)
        self._auto_stale = stale_timeout_s is None
        self.stale_timeout_s = no_data_timeout(None) if stale_timeout_s is None else stale_timeout_s
        self._subscribe, self._version = subscribe_state, version
        self.on_event = on_event
        # TLS: the server is checked by certificate fingerprint (pinned, or trusted on first
        # use and recorded in `known_robots`, like SSH); a pinned fingerprint implies TLS
        self.tls = tls or tls_fingerprint is not None
        self.tls_fingerprint, self.known_robots = tls_fingerprint, known_robots
        self.server_fingerprint: str | None = None
        self.policy_id: str | None = None  # the policy this client uploaded last
        self.info: RobotInfo | None = None
        self.session = ""
        self.cameras: list[Any] = []
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=500)
        self._sock: P.Stream | None = None
        self._send_lock = threading.Lock()
        self._cv = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._latest: dict[str, Any] | None = None
        self._recorders: list[list[dict[str, Any]]] = []
        self._frames: dict[str, queue.Queue[RGBDFrame]] = {}
        self._lost: DeviceError | None = None
        self._closed = False
        self._threads: list[threading.Thread] = []
        # -- the link's health and reconnects
        self.reconnect, self.reconnect_while, self.on_link = reconnect, reconnect_while, on_link
        self.epoch = 0  # sessions since the first connect: +1 per reconnect
        self.link_state = "disconnected"  # connected | reconnecting | lost | closed
        self.link_detail = ""
        self.last_drop: str | None = None  # why the link last dropped
        self.reconnects = 0
        self._reconnecting = False
        self._need_acquire = False  # after a reconnect, until take_control()
        self._pending: P.Stream | None = None  # a reconnect's socket, mid-handshake
        self._state_at: float | None = None  # monotonic arrival of the newest state
        self._frame_at: dict[str, float] = {}  # per subscribed camera: newest frame (or since)

    # -- connection ---------------------------------------------------------------------
    def __enter__(self) -> RobotClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _err(self, what: str) -> DeviceError:
        return DeviceError(f"robot at {self.address}: {what}")

    def connect(self) -> None:
        """Connect, authenticate, check the protocol version; raises DeviceError."""
        sock, msg = self._open()
        self._start_session(sock, msg)
        self._after_connect()
        self.link_state = "connected"

    def _open(self) -> tuple[P.Stream, dict[str, Any]]:
        """A socket past the handshake and its welcome message; raises DeviceError."""
        try:
            raw = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except OSError as exc:
            raise self._err(f"cannot connect ({exc}); is the robot agent / lab running?") from None
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock: P.Stream = raw
        self._pending = sock
        deadline = time.monotonic() + self.connect_timeout_s
        nonce = cnonce = b""
        try:
            if self.tls:
                sock = self._wrap_tls(raw)
                self._pending = sock
            msg = P.recv_message(sock, P.MAX_HELLO_BYTES, deadline)
            if msg["type"] == "challenge" and isinstance(msg.get("nonce"), bytes):
                nonce, cnonce = msg["nonce"], new_nonce()
                sock.sendall(
                    P.pack(
                        {
                            "type": "hello",
                            "protocol": P.PROTOCOL_NAME,
                            "version": self._version,
                            "nonce": cnonce,
                            "proof": client_proof(self._token, nonce, cnonce, self._version),
                            "client": self.name,
                        }
                    )
                )
                msg = P.recv_message(sock, P.MAX_MESSAGE_BYTES, deadline + 1.0)
        except (OSError, P.ConnectionClosed, P.ProtocolError) as exc:
            sock.close()
            raise self._err(f"handshake failed ({exc})") from None
        except DeviceError:
            sock.close()
            raise
        finally:
            self._pending = None
        if msg["type"] == "error":
            sock.close()
            raise self._err(f"refused: {msg.get('message')} [{msg.get('code')}]")
        if msg["type"] != "welcome":
            sock.close()
            raise self._err(f"unexpected handshake reply '{msg['type']}'")
        if not proof_matches(server_proof(self._token, nonce, cnonce), msg.get("proof")):
            sock.close()
            raise self._err("the server did not prove it holds the token; not a robot of ours")
        return sock, msg

    def _start_session(self, sock: P.Stream, msg: dict[str, Any]) -> None:
        """Make `sock` (past its handshake) the connection: robot info, reader, heartbeat."""
        info = RobotInfo.from_dict(msg["info"])
        if self.info is not None and tuple(info.joint_names) != tuple(self.info.joint_names):
            sock.close()
            raise self._err(
                f"a different robot answers now ({info.name}, joints {list(info.joint_names)}); "
                "not reconnecting to it"
            )
        sock.settimeout(self.stale_timeout_s if self._subscribe else None)
        with self._cv:
            if self._closed:
                sock.close()
                raise self._err("connection closed by this client")
            self.info = info
            self.session, self.cameras = str(msg.get("session", "")), list(msg.get("cameras", []))
            self._sock = sock
            self._lost = None
            self._state_at = time.monotonic()
            now = time.monotonic()
            self._frame_at = {c: now for c in self._frames}
            epoch = self.epoch
            threads = [
                threading.Thread(
                    target=self._read_loop, args=(sock, epoch), name="robot-client-rx", daemon=True
                ),
                threading.Thread(
                    target=self._heartbeat_loop, args=(epoch,), name="robot-client-hb", daemon=True
                ),
            ]
            self._threads = [t for t in self._threads if t.is_alive()] + threads
        for t in threads:
            t.start()

    def _after_connect(self) -> None:
        """Subscribe to the state stream and size the silence allowed on it."""
        if not self._subscribe:
            return
        self.request("subscribe", state=True)
        if self._auto_stale:
            hb = None
            try:
                status = self.request("get_status", timeout_s=min(self.request_timeout_s, 5.0))
                hb = float(status["watchdog"]["heartbeat_timeout_s"])
            except (DeviceError, KeyError, TypeError, ValueError):
                pass  # an agent that cannot say: the default deadline
            self.stale_timeout_s = no_data_timeout(hb)
            sock = self._sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.settimeout(self.stale_timeout_s)

    def _wrap_tls(self, sock: socket.socket) -> SerialTLS:
        try:
            tls_sock = client_context().wrap_socket(sock)
        except (OSError, ssl.SSLError) as exc:
            raise self._err(f"TLS handshake failed ({exc}); does the robot serve TLS?") from None
        try:
            self.server_fingerprint = check_pinned(
                self.address,
                tls_sock.getpeercert(binary_form=True),
                self.tls_fingerprint,
                self.known_robots,
            )
        except DeviceError:
            tls_sock.close()
            raise
        return SerialTLS(tls_sock)

    def close(self) -> None:
        """Say goodbye and disconnect (the robot stops anything this client controlled)."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()  # a reconnect waiting out its backoff gives up
        pending = self._pending
        if pending is not None:  # a reconnect mid-handshake: cut it short
            with contextlib.suppress(OSError):
                pending.shutdown(socket.SHUT_RDWR)
        sock = self._sock
        if sock is not None:
            try:
                with self._send_lock:
                    sock.sendall(P.pack({"type": "bye"}))
            except OSError:
                pass
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader
        for t in list(self._threads):
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        if sock is not None:
            _close_after_use(sock, self._send_lock)
        self._set_lost(self._err("connection closed by this client"))
        self.link_state = "closed"

    @property
    def connected(self) -> bool:
        return self._lost is None and self._sock is not None

    def check(self, epoch: int | None = None) -> None:
        """Raise the DeviceError that ended the connection, if it has ended. With `epoch`
        (`self.epoch` when an operation began): also when the link dropped and was
        reconnected since, as a new session the operation does not belong to."""
        if self._lost is not None:
            raise self._lost
        if epoch is not None and epoch != self.epoch:
            raise self._err(
                f"the link was lost ({self.last_drop or 'dropped'}) during this operation; "
                "it reconnected as a new session, so the operation was ended"
            )

    def _set_lost(self, err: DeviceError) -> None:
        with self._cv:
            if self._lost is None:
                self._lost = err
            self._cv.notify_all()

    # -- link health ----------------------------------------------------------------------
    def state_age(self) -> float | None:
        """Seconds since the newest state message arrived (since the session began while
        none has); None before the first connect."""
        at = self._state_at
        return None if at is None else time.monotonic() - at

    def camera_ages(self) -> dict[str, float]:
        """For each camera streaming to this client (`camera_frames`): seconds since its
        newest frame arrived (since it was subscribed while none has)."""
        now = time.monotonic()
        return {c: now - self._frame_at.get(c, now) for c in list(self._frames)}

    def _notify_link(self, state: str, message: str) -> None:
        self.link_state, self.link_detail = state, message
        event = {"type": "event", "kind": "link", "message": message, "data": {"state": state}}
        self.events.append(event)
        try:
            if self.on_link is not None:
                self.on_link(state, message)
            if self.on_event is not None:
                self.on_event(event)
        except Exception:  # an observer's bug must not end the link
            log.exception("robot link observer failed")

    # -- threads ------------------------------------------------------------------------
    def _read_loop(self, sock: P.Stream, epoch: int) -> None:
        try:
            while True:
                self._handle(P.recv_message(sock))
        except TimeoutError:
            why = f"no data for {self.stale_timeout_s:.1f} s"
            self._link_down(sock, epoch, why, f"{why}; connection lost")
        except P.ConnectionClosed:
            self._link_down(sock, epoch, "connection closed by the robot")
        except (DeviceError, OSError) as exc:
            self._link_down(sock, epoch, f"connection lost ({exc})")

    def _link_down(self, sock: P.Stream, epoch: int, why: str, text: str = "") -> None:
        """The session `epoch` ended (`why`): report it and, with `reconnect`, dial again
        on this thread (the old session's reader)."""
        with self._cv:
            if self._closed or epoch != self.epoch:
                return  # closed on purpose, or an older session's reader
            fatal = self._lost  # a fatal error the robot sent before it disconnected
            if fatal is not None:
                why = str(fatal).removeprefix(f"robot at {self.address}: ")
            if not self.reconnect:
                self._lost = fatal or self._err(text or why)
            else:
                self._lost = self._err(f"link lost ({why}); reconnecting")
                self._need_acquire = True  # the robot drops this session's control with it
                self.policy_id = None  # and the policy it uploaded
            self._cv.notify_all()
            start = self.reconnect and not self._reconnecting
            if start:
                self._reconnecting = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        _close_after_use(sock, self._send_lock)  # this is the reader: only a send can be in use
        if not self.reconnect:
            self.link_state, self.link_detail = "lost", str(self._lost)
            return
        self.last_drop = why
        self._notify_link("reconnecting", f"robot link lost ({why}); reconnecting…")
        if start:
            self._reconnect_loop(why)

    def _reconnect_loop(self, why: str) -> None:
        t0 = time.monotonic()
        attempt, last = 0, ""
        try:
            while True:
                wait = RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)]
                with self._cv:
                    if not self._closed:
                        self._cv.wait(wait)
                    if self._closed:
                        return
                if self.reconnect_while is not None and not self.reconnect_while():
                    gone = self._err(f"link lost ({why}); not reconnecting: the robot is gone")
                    with self._cv:
                        self._lost = gone
                    self._notify_link("lost", str(gone))
                    return
                attempt += 1
                try:
                    sock, msg = self._open()
                    with self._cv:
                        self.epoch += 1
                    self._start_session(sock, msg)
                    self._after_connect()
                except DeviceError as exc:
                    last = str(exc)
                    self.link_detail = (
                        f"robot link lost ({why}); reconnecting (try {attempt}: {last})"
                    )
                    continue
                if not self.connected:
                    continue  # dropped again at once
                break
        finally:
            with self._cv:
                self._reconnecting = False
        took = time.monotonic() - t0
        self.reconnects += 1
        self._resubscribe_cameras()
        self._notify_link("connected", f"robot link lost ({why}); reconnected after {took:.1f} s")

    def _resubscribe_cameras(self) -> None:
        for cam in list(self._frames):
            try:
                self.request("camera_subscribe", camera=cam)
            except DeviceError as exc:
                self.events.append(
                    {"type": "event", "kind": "error", "message": f"camera '{cam}': {exc}"}
                )

    def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "state":
            self._latest = msg
            self._state_at = time.monotonic()
            for rec in tuple(self._recorders):
                rec.append(msg)
        elif kind == "frame":
            cam = str(msg.get("camera"))
            q = self._frames.get(cam)
            if q is not None:
                self._frame_at[cam] = time.monotonic()
                frame = P.frame_from_message(msg)
                if q.full():
                    try:
                        q.get_nowait()
                    except queue.Empty:
                        pass
                q.put_nowait(frame)
        elif kind == "event":
            self.events.append(msg)
            if self.on_event is not None:
                self.on_event(msg)
        elif kind in ("reply", "error"):
            if kind == "error" and msg.get("fatal"):
                self._set_lost(self._err(f"{msg.get('message')} [{msg.get('code')}]"))
            if msg.get("id") is not None:
                with self._cv:
                    self._replies[int(msg["id"])] = msg
                    self._cv.notify_all()
            elif kind == "error":
                self.events.append({"type": "event", "kind": "error", **msg})

    def _heartbeat_loop(self, epoch: int) -> None:
        packed = P.pack({"type": "heartbeat"})
        while self._lost is None and not self._closed and epoch == self.epoch:
            if self.heartbeat_enabled:
                try:
                    self._send_raw(packed)
                except DeviceError:
                    return
            with self._cv:
                self._cv.wait(self.heartbeat_period_s)

    # -- requests -----------------------------------------------------------------------
    def _send_raw(self, data: bytes) -> None:
        self.check()
        sock = self._sock
        assert sock is not None
        try:
            with self._send_lock:
                sock.sendall(data)
        except OSError as exc:
            if sock is self._sock:
                self._set_lost(self._err(f"connection lost while sending ({exc})"))
            self.check()
            raise self._err(f"connection lost while sending ({exc})") from None

    def _check_control(self) -> None:
        """After a reconnect nothing moves until the caller takes control again."""
        if self._need_acquire:
            raise self._err(
                f"the robot link dropped ({self.last_drop or 'lost'}) and reconnected as a new "
                "session; the robot stopped and dropped this client's control: take control "
                "again (take_control) before moving it"
            )

    def send(self, kind: str, **fields: Any) -> None:
        """Fire-and-forget message (no reply)."""
        self._send_raw(P.pack({"type": kind, **fields}))

    def request(self, kind: str, timeout_s: float | None = None, **fields: Any) -> Any:
        """Send a request and wait for its reply; raises DeviceError on an error reply."""
        req_id = next(self._ids)
        self._send_raw(P.pack({"type": kind, "id": req_id, **fields}))
        deadline = time.monotonic() + (timeout_s or self.request_timeout_s)
        with self._cv:
            while req_id not in self._replies:
                if self._lost is not None:
                    raise self._lost
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._err(
                        f"no reply to '{kind}' within {timeout_s or self.request_timeout_s:.1f} s"
                    )
                self._cv.wait(left)
            reply = self._replies.pop(req_id)
        if reply["type"] == "error":
            raise self._err(f"{kind}: {reply.get('message')} [{reply.get('code')}]")
        return reply.get("result")

    # -- state ----------------------------------------------------------------------------
    def latest_state(self, timeout_s: float = 1.0) -> RobotState:
        """The newest streamed state (waits up to `timeout_s` for the first one)."""
        deadline = time.monotonic() + timeout_s
        while self._latest is None:
            self.check()
            if time.monotonic() > deadline:
                raise self._err("no state received (is the state stream subscribed?)")
            time.sleep(0.002)
        self.check()
        return P.state_from_message(self._latest)

    def latest_status(self) -> dict[str, Any]:
        """Mode, e-stop, acting safety limits and stop reason from the newest state."""
        self.latest_state()
        msg = self._latest or {}
        return {k: msg.get(k) for k in ("mode", "estop", "acted", "stop_reason", "seq", "t")}

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[dict[str, Any]]]:
        """Collect every state message while the block runs (for `states_to_trajectory`);
        lets a caller command the robot while its state is recorded. The garbage collector
        waits meanwhile (`collector_paused`): a recording streams to a robot whose watchdog
        counts the gaps between heartbeats."""
        rec: list[dict[str, Any]] = []
        self._recorders.append(rec)
        try:
            with collector_paused():
                yield rec
        finally:
            self._recorders.remove(rec)

    def stream(self, duration_s: float) -> Trajectory:
        """Record the state stream for `duration_s` seconds into a Trajectory (source real)."""
        epoch = self.epoch
        with self.recording() as rec:
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                self.check(epoch)
                time.sleep(min(0.02, max(0.0, end - time.monotonic())))
        self.check(epoch)
        return self.states_to_trajectory(rec)

    def states_to_trajectory(self, msgs: list[dict[str, Any]]) -> Trajectory:
        """State messages -> Trajectory; repeated timestamps are dropped (and counted)."""
        assert self.info is not None
        n = len(self.info.joint_names)
        keep, last_t = [], -np.inf
        for m in msgs:
            if m["t"] > last_t:
                keep.append(m)
                last_t = m["t"]
        seqs = np.array([m["seq"] for m in msgs], dtype=np.int64)
        dropped = int(np.sum(np.diff(seqs) - 1)) if seqs.size > 1 else 0
        nan = [np.nan] * n
        t = np.array([m["t"] for m in keep], dtype=float)
        rate = float((len(keep) - 1) / (t[-1] - t[0])) if len(keep) > 1 else 0.0
        chans = {
            "robot/joint_pos": np.array([m["joint_pos"] for m in keep], dtype=float).reshape(
                len(keep), n
            ),
            "robot/joint_vel": np.array([m["joint_vel"] for m in keep], dtype=float).reshape(
                len(keep), n
            ),
            "robot/joint_effort": np.array([m["joint_effort"] for m in keep], dtype=float).reshape(
                len(keep), n
            ),
            "robot/command": np.array(
                [m["command"] if m.get("command") is not None else nan for m in keep], dtype=float
            ).reshape(len(keep), n),
        }
        delay = P.command_delay(keep)
        units = dict(UNITS)
        if delay is not None:
            chans[COMMAND_DELAY], units[COMMAND_DELAY] = delay, "s"
        meta = {
            "robot": self.info.name,
            "joint_names": list(self.info.joint_names),
            "control_rate_hz": self.info.control_rate_hz,
            "device": self.address,
            "rate_hz": rate,
            "dropped_states": dropped,
            "repeated_timestamps": len(msgs) - len(keep),
            "modes": sorted({str(m.get("mode")) for m in keep}),
        }
        return Trajectory(t=t, channels=chans, units=units, source="real", meta=meta)

    # -- commands ----------------------------------------------------------------------
    def command(self, mode: str, values: ArrayLike) -> None:
        """Stream one joint command (no reply; the safety envelope reports via events)."""
        self._check_control()
        self.send("command", mode=mode, values=np.asarray(values, dtype=float).tolist())

    def command_position(self, joint_pos: ArrayLike) -> None:
        self.command("position", joint_pos)

    def command_velocity(self, joint_vel: ArrayLike) -> None:
        self.command("velocity", joint_vel)

    def upload_policy(
        self, onnx: bytes | Path, spec: dict[str, Any], safety: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Upload an ONNX policy + observation/action spec (+ tighter safety settings).
        The result names the policy (`policy`, kept as `policy_id`): `run_policy` runs
        that one, so a policy that replaced it meanwhile is never started by mistake."""
        self._check_control()
        data = Path(onnx).read_bytes() if isinstance(onnx, (str, Path)) else bytes(onnx)
        result: dict[str, Any] = self.request("policy_upload", onnx=data, spec=spec, safety=safety)
        pid = result.get("policy") if isinstance(result, dict) else None
        self.policy_id = pid if isinstance(pid, str) else None
        return result

    def send_object_pose(
        self,
        name: str,
        pose: ArrayLike,
        t: float,
        quality: float = 1.0,
        lost: bool = False,
        wait: bool = False,
    ) -> dict[str, Any] | None:
        """Stream a tracked object pose to the agent (xyz m + quaternion xyzw, robot base
        frame; `t` the camera's capture time on the robot's clock). `wait`: ask for a reply
        and raise DeviceError if the agent refuses it; else a refusal arrives as an
        `error` event (fire and forget, for the live feed)."""
        fields: dict[str, Any] = {
            "object": name,
            "pose": [float(v) for v in np.asarray(pose, dtype=float).reshape(-1)],
            "t": float(t),
            "quality": float(quality),
            "lost": bool(lost),
        }
        self._check_control()
        if wait:
            result: dict[str, Any] = self.request("object_pose", **fields)
            return result
        self.send("object_pose", **fields)
        return None

    def take_control(self) -> None:
        """Become the robot's operator (needed after a watchdog stop, or a reconnect,
        before moving again)."""
        self.request("acquire")
        self._need_acquire = False

    def run_policy(self, ramp_s: float = 1.0, policy: str | None = None) -> None:
        """Run `policy` (an id from `upload_policy`; default: the one this client uploaded
        last), blending in over `ramp_s` seconds."""
        self._check_control()
        pid = policy or self.policy_id
        if pid is None:
            raise self._err("no policy uploaded by this client (upload_policy first)")
        self.request("policy_run", ramp_s=ramp_s, policy=pid)

    def stop_policy(self) -> None:
        self.request("policy_stop")

    def stop(self, reason: str | None = None) -> None:
        self.request("stop", reason=reason)

    def estop(self, reason: str | None = None) -> None:
        self.request("estop", reason=reason)

    def reset(self) -> None:
        self.request("reset")

    def status(self, jitter_window_s: float | None = None) -> dict[str, Any]:
        """The agent's status (mode, owner, safety/watchdog config, loop jitter in ms)."""
        result: dict[str, Any] = self.request("get_status", jitter_window_s=jitter_window_s)
        return result

    def box_distances(self, poses: np.ndarray) -> list[float] | None:
        """How far (m) each joint pose (N, n; at most 500) puts the arm outside the agent's
        workspace box, by the robot's own kinematics (0 inside); None when its envelope has
        no box or its driver no kinematics."""
        rows = np.asarray(poses, float)
        result = self.request("check_poses", poses=[[float(x) for x in q] for q in rows])
        out = result.get("outside_m") if isinstance(result, dict) else None
        if out is None:
            return None
        if not isinstance(out, list) or len(out) != len(rows):
            raise DeviceError(f"robot at {self.address}: check_poses answered {out!r:.80}")
        return [float(d) for d in out]

    def get_log(self, last: int | None = None) -> dict[str, np.ndarray]:
        """The agent's log (raw command, command sent, measured state, limits that acted)."""
        wire = self.request("get_log", last=last)
        return {k: P.array_from_wire(v, k) for k, v in wire.items()}

    def camera_frames(
        self, camera: str, timeout_s: float = 5.0
    ) -> Generator[RGBDFrame, None, None]:
        """Frames streamed from `camera` until the iterator is closed; raises DeviceError
        when no frame arrives within `timeout_s`."""
        q: queue.Queue[RGBDFrame] = queue.Queue(maxsize=4)
        self._frames[camera] = q
        self._frame_at[camera] = time.monotonic()
        try:
            self.request("camera_subscribe", camera=camera)
            while True:
                try:
                    yield q.get(timeout=timeout_s)
                except queue.Empty:
                    self.check()
                    raise self._err(
                        f"no frame from camera '{camera}' in {timeout_s:.1f} s"
                    ) from None
        finally:
            self._frames.pop(camera, None)
            self._frame_at.pop(camera, None)
            if self.connected:
                try:
                    self.request("camera_unsubscribe", camera=camera)
                except DeviceError:
                    pass
