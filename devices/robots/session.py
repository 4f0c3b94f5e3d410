"""One client connection on the robot server: handshake, authentication, request dispatch,
and a writer thread with a bounded outbox so a slow client never stalls the control loop."""

from __future__ import annotations

import collections
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from devices.errors import DeviceError
from devices.robots import protocol as P
from devices.robots.auth import token_matches

if TYPE_CHECKING:
    from devices.robots.server import RobotServer

MAX_QUEUED_STATES = 500  # ~2 s at 250 Hz; older states are dropped (seq shows the gap)
MAX_QUEUED_FRAMES = 3


class FloodGuard:
    """Token bucket: `rate` messages/s sustained, `burst` at once."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst, self.tokens, self.t = rate, burst, burst, time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class Session:
    """Reader (this object's thread) + writer thread for one peer."""

    def __init__(self, server: RobotServer, sock: socket.socket, addr: Any, sid: str) -> None:
        self.server, self.sock, self.sid = server, sock, sid
        self.peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        self.name = f"{sid} ({self.peer})"
        self.authenticated = False
        self.subscribed_state = False
        self.cameras: set[str] = set()
        self.dropped_states = 0
        self._out: collections.deque[tuple[str, bytes]] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._send_lock = threading.Lock()
        self.guard = FloodGuard(server.flood_rate_hz, server.flood_burst)
        self.reader = threading.Thread(target=self._read_loop, name=f"robot-{sid}-rx", daemon=True)
        self.writer = threading.Thread(target=self._write_loop, name=f"robot-{sid}-tx", daemon=True)

    def start(self) -> None:
        self.reader.start()
        self.writer.start()

    # -- outgoing ---------------------------------------------------------------------
    def enqueue(self, kind: str, data: bytes) -> None:
        """Queue a packed message (kind: state | frame | other). Never blocks."""
        with self._cv:
            if self._closing:
                return
            if kind == "state" and len(self._out) >= MAX_QUEUED_STATES:
                self.dropped_states += 1
                return
            if (
                kind == "frame"
                and sum(1 for k, _ in self._out if k == "frame") >= MAX_QUEUED_FRAMES
            ):
                return
            self._out.append((kind, data))
            self._cv.notify()

    def send(self, msg: dict[str, Any]) -> None:
        self.enqueue("other", P.pack(msg))

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._out and not self._closing:
                    self._cv.wait()
                if not self._out and self._closing:
                    return
                batch = list(self._out)
                self._out.clear()
            try:
                with self._send_lock:
                    self.sock.sendall(b"".join(d for _, d in batch))
            except OSError:
                self.close()
                return

    def fail(self, code: str, message: str, req_id: int | None = None) -> None:
        """Send a fatal error directly (ahead of anything queued) and disconnect."""
        self.server.note(f"{self.name}: {code}: {message}")
        try:
            self.sock.settimeout(1.0)
            with self._send_lock:
                self.sock.sendall(P.pack(P.error_message(code, message, True, req_id)))
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.server.session_closed(self)

    # -- incoming ---------------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            self.sock.settimeout(self.server.hello_timeout_s)
            self._handshake(P.recv_message(self.sock, P.MAX_HELLO_BYTES))
            self.sock.settimeout(self.server.idle_timeout_s)
            while not self._closing:
                msg = P.recv_message(self.sock, self.server.max_message_bytes)
                if not self.guard.allow():
                    self.fail(
                        "flood",
                        f"more than {self.server.flood_rate_hz:.0f} messages/s "
                        "from this client; disconnected and robot stopped",
                    )
                    return
                self._dispatch(msg)
        except P.ProtocolError as exc:
            self.fail(exc.code, str(exc))
        except TimeoutError:
            self.fail(
                "timeout",
                "no hello within the handshake time"
                if not self.authenticated
                else f"client silent for {self.server.idle_timeout_s:.0f} s",
            )
        except (P.ConnectionClosed, OSError):
            self.close()
        except Exception as exc:  # never let one client take the server down
            self.fail("internal", f"server error: {exc}")

    def _handshake(self, msg: dict[str, Any]) -> None:
        if msg.get("type") != "hello" or msg.get("protocol") != P.PROTOCOL_NAME:
            raise P.ProtocolError(
                "auth", f"expected a hello message of the {P.PROTOCOL_NAME} protocol"
            )
        if not token_matches(self.server.token, msg.get("token")):
            raise P.ProtocolError("auth", "authentication failed")
        version = msg.get("version")
        if version not in P.SUPPORTED_VERSIONS:
            raise P.ProtocolError(
                "version",
                f"protocol version {version!r} is not supported "
                f"(server speaks {list(P.SUPPORTED_VERSIONS)})",
            )
        self.authenticated = True
        self.send(
            {
                "type": "welcome",
                "version": P.PROTOCOL_VERSION,
                "session": self.sid,
                "info": self.server.agent.info.to_dict(),
                "cameras": sorted(self.server.cameras),
                "server_time": time.monotonic(),
            }
        )

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind, req_id = msg["type"], msg.get("id")
        agent = self.server.agent
        try:
            result: Any = None
            if kind == "heartbeat":
                agent.heartbeat(self.sid)
                return
            if kind == "command":
                values = P.joint_vector(msg.get("values"), agent.n, "values")
                agent.command(str(msg.get("mode", "position")), values, self.sid)
                if req_id is None:
                    return
            elif kind == "subscribe":
                self.subscribed_state = bool(msg.get("state", True))
            elif kind == "camera_subscribe":
                result = self.server.subscribe_camera(self, str(msg.get("camera")))
            elif kind == "camera_unsubscribe":
                self.server.unsubscribe_camera(self, str(msg.get("camera")))
            elif kind == "get_info":
                result = agent.info.to_dict()
            elif kind == "get_status":
                window = msg.get("jitter_window_s")
                result = agent.status(float(window) if window else None)
            elif kind == "get_log":
                log = agent.log.snapshot(msg.get("last"))
                result = {k: P.array_to_wire(v) for k, v in log.items()}
            elif kind == "policy_upload":
                onnx = msg.get("onnx")
                if not isinstance(onnx, bytes):
                    raise P.ProtocolError("bad_request", "policy_upload needs 'onnx' bytes")
                if agent.owner not in (None, self.sid):
                    raise DeviceError(f"{agent.info.name} is controlled by another client")
                result = agent.upload_policy(onnx, msg.get("spec") or {}, msg.get("safety"))
            elif kind == "policy_run":
                agent.run_policy(float(msg.get("ramp_s", 1.0)), self.sid)
            elif kind in ("policy_stop", "stop"):
                agent.stop(str(msg.get("reason") or f"stop requested by {self.sid}"), self.sid)
            elif kind == "estop":
                agent.estop(str(msg.get("reason") or f"e-stop by {self.sid}"))
            elif kind == "reset":
                agent.reset()
            elif kind == "bye":
                self.close()
                return
            else:
                raise P.ProtocolError("bad_request", f"unknown message type '{kind}'")
            self.send({"type": "reply", "id": req_id, "ok": True, "result": result})
        except P.ProtocolError as exc:
            self.send(P.error_message(exc.code, str(exc), False, req_id))
        except (DeviceError, ValueError, TypeError) as exc:
            self.send(P.error_message("refused", str(exc), False, req_id))
