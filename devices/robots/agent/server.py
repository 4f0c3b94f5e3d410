"""`RobotServer`: serves one `Agent` (and optional cameras) over the robot protocol.

Binds 127.0.0.1 unless told otherwise; any other address needs `allow_remote=True` and a
TLS context, or is refused. One thread accepts; each client gets a reader and a writer
thread (devices/robots/agent/session.py). Peers still in their handshake are kept apart from the
clients: at most `max_pending` of them, the oldest dropped when more arrive, so peers that
never finish a handshake cannot fill the server. State messages are packed once per control tick
and fanned out to subscribed clients; camera frames are packed once per frame. A client that
misbehaves is sent an error and disconnected; the others keep being served.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.frames import RGBDFrame
from devices.robots.agent.control import Agent
from devices.robots.agent.session import Session
from devices.robots.wire import protocol as P
from devices.robots.wire.robot_types import RobotState

log = logging.getLogger(__name__)
CameraFeed = Callable[[], Iterator[RGBDFrame]]  # a fresh, paced, blocking frame iterator


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RobotServer:
    """TCP server for `agent`; use as a context manager or call start()/close()."""

    def __init__(
        self,
        agent: Agent,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        cameras: Mapping[str, CameraFeed] | None = None,
        max_clients: int = 16,
        hello_timeout_s: float = 5.0,
        idle_timeout_s: float = 10.0,
        max_message_bytes: int = P.MAX_MESSAGE_BYTES,
        flood_rate_hz: float | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        allow_remote: bool = False,
        max_pending: int = 32,
        min_upload_rate: float = 1e6,
        read_budget_bytes: int = 128 * 1024 * 1024,
    ) -> None:
        self.agent, self.token, self.host, self.port = agent, token, host, port
        self.cameras = dict(cameras or {})
        self.max_clients = max_clients
        self.hello_timeout_s, self.idle_timeout_s = hello_timeout_s, idle_timeout_s
        self.max_message_bytes = max_message_bytes
        self.flood_rate_hz = flood_rate_hz or max(1000.0, 4 * agent.info.control_rate_hz)
        self.flood_burst = self.flood_rate_hz / 2
        self.tls, self.allow_remote, self.max_pending = tls, allow_remote, max_pending
        self.min_upload_rate = min_upload_rate  # bytes/s a large message must at least arrive at
        self.read_budget = P.ByteBudget(read_budget_bytes)  # all unfinished messages together
        self.sessions: dict[str, Session] = {}
        self.notes: list[str] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._cam_subs: dict[str, set[Session]] = {}
        self._cam_threads: dict[str, threading.Thread] = {}
        self._running = False

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def __enter__(self) -> RobotServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Bind, listen, and start accepting; hooks into the agent's state and events.

        Raises DeviceError before binding when the address is not loopback and either
        `allow_remote` or TLS is missing."""
        if not is_loopback(self.host):
            if not self.allow_remote:
                raise DeviceError(
                    f"robot server: refusing to listen on {self.host}: that exposes the robot "
                    "to the network. Bind 127.0.0.1, or allow it explicitly "
                    "(lab serve --allow-remote, which also turns TLS on)"
                )
            if self.tls is None:
                raise DeviceError(
                    f"robot server: refusing to listen on {self.host} without TLS "
                    "(a non-loopback robot link must be encrypted)"
                )
        try:
            sock = socket.create_server((self.host, self.port), reuse_port=False)
        except OSError as exc:
            raise DeviceError(
                f"robot server: cannot listen on {self.host}:{self.port} ({exc})"
            ) from exc
        sock.settimeout(0.2)
        self._sock, self.port, self._running = sock, sock.getsockname()[1], True
        self.agent.add_state_listener(self._on_state)
        self.agent.add_event_listener(self._on_event)
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="robot-accept", daemon=True
        )
        self._accept_thread.start()

    def close(self) -> None:
        """Stop accepting, disconnect everyone (the agent stops what they controlled)."""
        self._running = False
        self.agent.remove_state_listener(self._on_state)
        self.agent.remove_event_listener(self._on_event)
        if self._sock is not None:
            self._sock.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=1.0)
        for s in list(self.sessions.values()):
            s.close()
        for s in list(self.sessions.values()):
            s.reader.join(timeout=1.0)
        with self._lock:
            cam_threads = list(self._cam_threads.values())
        for t in cam_threads:
            t.join(timeout=2.0)

    def note(self, text: str) -> None:
        """Record a client incident (kept for tests and the log)."""
        log.info("robot server: %s", text)
        self.notes = [*self.notes[-99:], text]

    # -- connections --------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._sock is not None
        while self._running:
            try:
                conn, addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sid = f"client-{next(self._ids)}"
            session = Session(self, conn, addr, sid)
            with self._lock:
                pending = sorted(
                    (s for s in self.sessions.values() if not s.authenticated),
                    key=lambda s: s.created,
                )
                self.sessions[sid] = session
            # the oldest unfinished handshakes make room: they never held the robot
            for old in pending[: max(0, len(pending) + 1 - self.max_pending)]:
                old.fail("busy", "too many connections still in their handshake")
            session.start()

    def admit(self, session: Session) -> bool:
        """Called when `session` has authenticated: True (and counted) while there is room."""
        with self._lock:
            n = sum(1 for s in self.sessions.values() if s.authenticated)
            if n >= self.max_clients:
                return False
            session.authenticated = True
            return True

    def session_closed(self, session: Session) -> None:
        with self._lock:
            self.sessions.pop(session.sid, None)
            for subs in self._cam_subs.values():
                subs.discard(session)
        if session.authenticated:
            self.agent.release(session.sid, f"client {session.name} disconnected")

    # -- streams ------------------------------------------------------------------------
    def _on_state(
        self,
        seq: int,
        state: RobotState,
        command: NDArray[np.float64] | None,
        mode: str,
        status: dict[str, Any],
    ) -> None:
        targets = [s for s in tuple(self.sessions.values()) if s.subscribed_state]
        if not targets:
            return
        msg = P.state_message(state, command, mode, status)
        msg["seq"] = seq
        data = P.pack(msg)
        for s in targets:
            s.enqueue("state", data)

    def _on_event(self, kind: str, message: str, data: dict[str, Any]) -> None:
        packed = P.pack(
            {
                "type": "event",
                "kind": kind,
                "message": message,
                "data": {
                    k: v for k, v in data.items() if isinstance(v, (str, int, float, bool, list))
                },
            }
        )
        for s in list(self.sessions.values()):
            if s.authenticated:
                s.enqueue("other", packed)

    def subscribe_camera(self, session: Session, name: str) -> dict[str, Any]:
        if name not in self.cameras:
            raise DeviceError(f"no camera '{name}' (cameras: {', '.join(self.cameras) or 'none'})")
        with self._lock:
            self._cam_subs.setdefault(name, set()).add(session)
            if name not in self._cam_threads:
                t = threading.Thread(
                    target=self._camera_loop, args=(name,), name=f"camera-{name}", daemon=True
                )
                self._cam_threads[name] = t
                t.start()
        return {"camera": name}

    def unsubscribe_camera(self, session: Session, name: str) -> None:
        with self._lock:
            self._cam_subs.get(name, set()).discard(session)

    def _camera_loop(self, name: str) -> None:
        try:
            frames = self.cameras[name]()
            for frame in frames:
                with self._lock:
                    subs = list(self._cam_subs.get(name, ()))
                    if not subs or not self._running:
                        self._cam_threads.pop(name, None)  # atomically with the check
                        break
                data = P.pack(P.frame_to_message(frame, name))
                for s in subs:
                    s.enqueue("frame", data)
            close = getattr(frames, "close", None)
            if close is not None:
                close()
        except Exception as exc:  # a camera fault must not take the robot down
            self.note(f"camera {name} stopped: {exc}")
            self._on_event("camera", f"camera {name} stopped: {exc}", {})
        finally:
            with self._lock:
                self._cam_threads.pop(name, None)
