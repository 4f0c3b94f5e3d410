"""One client connection on the robot server: TLS (when configured), challenge-response
handshake under one deadline, request dispatch with checked fields, and a writer thread
with a bounded outbox so a slow client never stalls the control loop.

Every body is checked against `protocol.CLIENT_LIMITS` before msgpack decodes it, so no
message can hold the GIL (and with it the control loop and everyone's stop) for long.
Requests are handled in order on the reader thread, except `policy_upload`: loading a
model and its probe inference can take a while, so it runs on an upload thread of this
session (one at a time) and replies from there, and a `stop` / `estop` / `heartbeat` sent
after it is handled at once."""

from __future__ import annotations

import collections
import math
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from devices.errors import DeviceError
from devices.robots.agent.object_poses import ObjectPoseError
from devices.robots.wire import protocol as P
from devices.robots.wire.auth import client_proof, new_nonce, proof_matches, server_proof
from devices.robots.wire.tls import SerialTLS

if TYPE_CHECKING:
    from devices.robots.agent.server import RobotServer

MAX_QUEUED_STATES = 500  # ~2 s at 250 Hz; older states are dropped (seq shows the gap)
MAX_QUEUED_FRAMES = 3
MAX_JITTER_WINDOW_S = 3600.0
MAX_RAMP_S = 60.0
MAX_POLICY_ID = 200  # chars of a `policy` id in policy_run
MAX_CHECK_POSES = 500  # poses in one check_poses request (~0.1 ms of kinematics each)
# Policy spec / safety fields that hold numbers (checked here, so "0.2" or true is a
# bad_request naming the field before the agent parses them): scalars and lists.
SPEC_NUMBERS = ("object_max_age_s", "object_min_quality")
SPEC_LISTS = ("target", "object_goal")
SAFETY_LISTS = ("max_step", "workspace_lower", "workspace_upper")
SAFETY_TEXT = ("on_violation",)
# What a request handler may raise on bad input (a field the agent refuses): `refused`.
REFUSALS = (DeviceError, ValueError, TypeError, LookupError, ArithmeticError)


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
        self.server, self.sid = server, sid
        self.sock: P.Stream = sock  # a SerialTLS once a TLS server's handshake is done
        self._raw = sock
        self.peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        self.name = f"{sid} ({self.peer})"
        self.authenticated = False
        self.created = time.monotonic()
        self._plain_ok = server.tls is None  # errors may be sent (TLS: after its handshake)
        self.subscribed_state = False
        self.cameras: set[str] = set()
        self.dropped_states = 0
        self._out: collections.deque[tuple[str, bytes]] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._send_lock = threading.Lock()
        # The reader and writer threads: the last of them to leave closes the socket. Closing
        # it under a thread still in a (TLS) read or write frees its descriptor number for
        # the next connection, which that thread would then read or write (seen as other
        # clients' handshakes failing and streams cut, 1 in 100 TLS connections).
        self._socket_users = 2
        self.guard = FloodGuard(server.flood_rate_hz, server.flood_burst)
        self._upload_lock = threading.Lock()
        self._upload: threading.Thread | None = None  # the policy_upload being handled
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
        try:
            self._write_until_closed()
        finally:
            self._leave_socket()

    def _write_until_closed(self) -> None:
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
        if self._plain_ok:
            try:
                self.sock.settimeout(1.0)
                with self._send_lock:
                    self.sock.sendall(P.pack(P.error_message(code, message, True, req_id)))
            except (OSError, ValueError):
                pass
        self.close()

    def close(self) -> None:
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        try:  # wakes the reader and writer; the last of them closes the socket
            self.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass
        self.server.session_closed(self)

    def _leave_socket(self) -> None:
        with self._cv:
            self._socket_users -= 1
            last = self._socket_users == 0
        if last:
            self.sock.close()

    # -- incoming ---------------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            self._read_until_closed()
        finally:
            self.close()
            self._leave_socket()

    def _read_until_closed(self) -> None:
        srv = self.server
        try:
            # One deadline for the whole handshake (TLS, challenge, hello), not one per read:
            # a peer trickling bytes cannot hold a connection longer than hello_timeout_s.
            deadline = time.monotonic() + srv.hello_timeout_s
            if srv.tls is not None:
                self._tls_handshake(deadline)
            nonce = new_nonce()
            challenge = {"type": "challenge", "protocol": P.PROTOCOL_NAME, "nonce": nonce}
            with self._send_lock:  # directly: always the first thing a peer receives
                self.sock.sendall(P.pack(challenge))
            hello = P.recv_message(self.sock, P.MAX_HELLO_BYTES, deadline, limits=P.CLIENT_LIMITS)
            self._handshake(hello, nonce)
            while not self._closing:
                msg = P.recv_message(
                    self.sock,
                    srv.max_message_bytes,
                    deadline=time.monotonic() + srv.idle_timeout_s,
                    body_rate=srv.min_upload_rate,
                    budget=srv.read_budget,
                    limits=P.CLIENT_LIMITS,
                )
                if not self.guard.allow():
                    self.fail(
                        "flood",
                        f"more than {srv.flood_rate_hz:.0f} messages/s "
                        "from this client; disconnected and robot stopped",
                    )
                    return
                self._dispatch(msg)
        except P.ProtocolError as exc:
            self.fail(exc.code, str(exc))
        except TimeoutError:
            self.fail(
                "timeout",
                f"handshake not complete within {srv.hello_timeout_s:g} s"
                if not self.authenticated
                else f"client silent for {srv.idle_timeout_s:g} s, or a message arrived too slowly",
            )
        except (P.ConnectionClosed, OSError, ValueError):
            self.close()
        except Exception as exc:  # never let one client take the server down
            self.fail("internal", f"server error: {exc}")

    def _tls_handshake(self, deadline: float) -> None:
        assert self.server.tls is not None
        raw = self._raw
        raw.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            tls = self.server.tls.wrap_socket(raw, server_side=True)
        except ssl.SSLError as exc:
            raise P.ConnectionClosed(f"TLS handshake failed ({exc})") from None
        with self._send_lock:
            self.sock = SerialTLS(tls)
        self._plain_ok = True

    def _handshake(self, msg: dict[str, Any], nonce: bytes) -> None:
        srv = self.server
        if msg.get("type") != "hello" or msg.get("protocol") != P.PROTOCOL_NAME:
            raise P.ProtocolError(
                "auth", f"expected a hello message of the {P.PROTOCOL_NAME} protocol"
            )
        version, cnonce = msg.get("version"), msg.get("nonce")
        if not isinstance(cnonce, bytes) or not 16 <= len(cnonce) <= 64:
            raise P.ProtocolError("auth", "authentication failed")
        v = version if isinstance(version, int) and not isinstance(version, bool) else -1
        if not proof_matches(client_proof(srv.token, nonce, cnonce, v), msg.get("proof")):
            raise P.ProtocolError("auth", "authentication failed")
        if version not in P.SUPPORTED_VERSIONS:
            raise P.ProtocolError(
                "version",
                f"protocol version {version!r} is not supported "
                f"(server speaks {list(P.SUPPORTED_VERSIONS)})",
            )
        if not srv.admit(self):
            raise P.ProtocolError("busy", f"server has {srv.max_clients} clients already")
        name = msg.get("client")
        if isinstance(name, str) and name:
            self.name = f"{self.sid} {name[:40]!r} ({self.peer})"
        self.send(
            {
                "type": "welcome",
                "version": P.PROTOCOL_VERSION,
                "session": self.sid,
                "proof": server_proof(srv.token, nonce, cnonce),
                "info": srv.agent.info.to_dict(),
                "cameras": sorted(srv.cameras),
                "server_time": time.monotonic(),
            }
        )

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind, req_id = msg["type"], msg.get("id")
        agent = self.server.agent
        if req_id is not None and (type(req_id) is not int or not -(2**63) <= req_id < 2**64):
            self.send(P.error_message("bad_request", "'id' must be an integer", False, None))
            return
        try:
            result: Any = None
            if kind == "heartbeat":
                agent.heartbeat(self.sid)
                return
            if kind == "command":
                values = P.joint_vector(msg.get("values"), agent.n, "values")
                agent.command(_text(msg, "mode", "position"), values, self.sid)
                if req_id is None:
                    return
            elif kind == "object_pose":
                rep = agent.object_pose(
                    msg.get("object"),
                    msg.get("pose"),
                    msg.get("t"),
                    msg.get("quality", 1.0),
                    msg.get("lost", False),
                    self.sid,
                )
                if req_id is None:
                    return
                result = {"object": rep.name, "t": rep.t, "received": rep.received}
            elif kind == "subscribe":
                self.subscribed_state = _flag(msg, "state", True)
            elif kind == "camera_subscribe":
                result = self.server.subscribe_camera(self, _text(msg, "camera", ""))
            elif kind == "camera_unsubscribe":
                self.server.unsubscribe_camera(self, _text(msg, "camera", ""))
            elif kind == "get_info":
                result = agent.info.to_dict()
            elif kind == "get_status":
                window = _number(msg, "jitter_window_s", 0.0, MAX_JITTER_WINDOW_S)
                result = agent.status(window or None)
            elif kind == "check_poses":
                poses = msg.get("poses")
                if not isinstance(poses, list) or not 0 < len(poses) <= MAX_CHECK_POSES:
                    raise P.ProtocolError(
                        "bad_request",
                        f"check_poses needs 'poses': a list of 1..{MAX_CHECK_POSES} joint vectors",
                    )
                q = np.stack(
                    [P.joint_vector(v, agent.n, f"poses[{k}]") for k, v in enumerate(poses)]
                )
                if not np.all(np.isfinite(q)):
                    raise P.ProtocolError("bad_request", "'poses' must be finite")
                result = {"outside_m": agent.box_distances(q)}
            elif kind == "get_log":
                log = agent.log.snapshot(_count(msg, "last"))
                result = {k: P.array_to_wire(v) for k, v in log.items()}
            elif kind == "policy_upload":
                onnx = msg.get("onnx")
                if not isinstance(onnx, bytes):
                    raise P.ProtocolError("bad_request", "policy_upload needs 'onnx' bytes")
                spec, safety = msg.get("spec") or {}, msg.get("safety")
                if not isinstance(spec, dict) or not isinstance(safety, (dict, type(None))):
                    raise P.ProtocolError("bad_request", "'spec' and 'safety' must be maps")
                _check_spec(spec)
                if safety is not None:
                    _check_safety(safety)
                self._start_upload(req_id, onnx, spec, safety)
                return  # answered by the upload thread
            elif kind == "policy_run":
                ramp = _number(msg, "ramp_s", 0.0, MAX_RAMP_S)
                policy = msg.get("policy")
                if not isinstance(policy, str) or not 0 < len(policy) <= MAX_POLICY_ID:
                    raise P.ProtocolError(
                        "bad_request",
                        "policy_run needs 'policy': the id string policy_upload returned",
                    )
                agent.run_policy(1.0 if ramp is None else ramp, self.sid, policy=policy)
            elif kind == "acquire":
                agent.acquire(self.sid)
                result = {"owner": self.sid}
            elif kind in ("policy_stop", "stop"):
                agent.stop(_text(msg, "reason", "") or f"stop requested by {self.sid}", self.sid)
            elif kind == "estop":
                agent.estop(_text(msg, "reason", "") or f"e-stop by {self.sid}", self.sid)
            elif kind == "reset":
                agent.reset(self.sid)
            elif kind == "bye":
                self.close()
                return
            else:
                raise P.ProtocolError("bad_request", f"unknown message type '{kind}'")
            self.send({"type": "reply", "id": req_id, "ok": True, "result": result})
        except (P.ProtocolError, ObjectPoseError) as exc:
            self.send(P.error_message(exc.code, str(exc), False, req_id))
        except REFUSALS as exc:
            self.send(P.error_message("refused", str(exc), False, req_id))

    # -- policy upload (its own thread) ----------------------------------------------------
    def _start_upload(
        self, req_id: int | None, onnx: bytes, spec: dict[str, Any], safety: dict[str, Any] | None
    ) -> None:
        """Hand a checked policy_upload to this session's upload thread; `refused` while
        one is still being handled (one at a time: each holds a model in memory)."""
        with self._upload_lock:
            if self._upload is not None:
                raise P.ProtocolError(
                    "refused", "an upload is already in progress; wait for its reply"
                )
            self._upload = threading.Thread(
                target=self._run_upload,
                args=(req_id, onnx, spec, safety),
                name=f"robot-{self.sid}-upload",
                daemon=True,
            )
            self._upload.start()

    def _run_upload(
        self, req_id: int | None, onnx: bytes, spec: dict[str, Any], safety: dict[str, Any] | None
    ) -> None:
        try:
            if self._closing:
                return
            result = self.server.agent.upload_policy(onnx, spec, safety, owner=self.sid)
            reply = {"type": "reply", "id": req_id, "ok": True, "result": result}
        except (P.ProtocolError, ObjectPoseError) as exc:
            reply = P.error_message(exc.code, str(exc), False, req_id)
        except REFUSALS as exc:
            reply = P.error_message("refused", str(exc), False, req_id)
        except Exception as exc:  # what a model or spec can make a loader raise: bad input
            self.server.note(f"{self.name}: policy_upload: {type(exc).__name__}: {exc}")
            reply = P.error_message("refused", f"policy not loaded: {exc}", False, req_id)
        finally:
            with self._upload_lock:
                self._upload = None
        self.send(reply)


# -- request fields: each one checked, so odd values are a bad_request, never `internal` ----


def _flag(msg: dict[str, Any], key: str, default: bool) -> bool:
    v = msg.get(key, default)
    if not isinstance(v, bool):
        raise P.ProtocolError("bad_request", f"'{key}' must be true or false, not {v!r:.40}")
    return v


def _text(msg: dict[str, Any], key: str, default: str) -> str:
    v = msg.get(key)
    if v is None:
        return default
    if not isinstance(v, str) or len(v) > 1000:
        raise P.ProtocolError("bad_request", f"'{key}' must be a string (at most 1000 chars)")
    return v


def _number(msg: dict[str, Any], key: str, low: float, high: float) -> float | None:
    v = msg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise P.ProtocolError("bad_request", f"'{key}' must be a number, not {v!r:.40}")
    if not (math.isfinite(v) and low <= v <= high):
        raise P.ProtocolError("bad_request", f"'{key}' must be within [{low:g}, {high:g}] s")
    return float(v)


def _numbers(where: str, v: Any) -> None:
    """`v` must be a list of ints/floats (not bools, strings or None) of sane magnitude."""
    if not isinstance(v, list) or not all(P.is_number(x) for x in v):
        raise P.ProtocolError("bad_request", f"'{where}' must be a list of numbers, not {v!r:.60}")
    if any(abs(x) > P.MAX_JOINT_VALUE and x not in (math.inf, -math.inf) for x in v):
        raise P.ProtocolError(
            "bad_request", f"'{where}' holds a value beyond +-{P.MAX_JOINT_VALUE:g}"
        )


def _scalar(where: str, v: Any) -> None:
    if not P.is_number(v):
        raise P.ProtocolError("bad_request", f"'{where}' must be a number, not {v!r:.40}")


def _check_spec(spec: dict[str, Any]) -> None:
    """The policy spec's numeric fields are numbers (PolicySpec checks ranges and meaning;
    it would take "0.2" or true for a number)."""
    for key in SPEC_NUMBERS:
        if spec.get(key) is not None:
            _scalar(f"spec.{key}", spec[key])
    for key in SPEC_LISTS:
        if spec.get(key) is not None:
            _numbers(f"spec.{key}", spec[key])
    obs, act = spec.get("observation"), spec.get("action")
    if obs is not None and (not isinstance(obs, list) or not all(isinstance(o, str) for o in obs)):
        raise P.ProtocolError("bad_request", "'spec.observation' must be a list of term names")
    if act is not None:
        if not isinstance(act, dict):
            raise P.ProtocolError("bad_request", "'spec.action' must be a map")
        if act.get("scale") is not None:
            _scalar("spec.action.scale", act["scale"])
        for key in ("mode", "type"):
            if act.get(key) is not None and not isinstance(act[key], str):
                raise P.ProtocolError("bad_request", f"'spec.action.{key}' must be a string")


def _check_safety(safety: dict[str, Any]) -> None:
    """Every safety setting is a number, a list of numbers or (on_violation) a string;
    SafetyConfig checks names and ranges."""
    for key, v in safety.items():
        if v is None:
            continue
        where = f"safety.{key}"
        if key in SAFETY_TEXT:
            if not isinstance(v, str):
                raise P.ProtocolError("bad_request", f"'{where}' must be a string")
        elif key in SAFETY_LISTS:
            _numbers(where, v)
        else:
            _scalar(where, v)


def _count(msg: dict[str, Any], key: str) -> int | None:
    v = msg.get(key)
    if v is None:
        return None
    if type(v) is not int or v < 0:
        raise P.ProtocolError("bad_request", f"'{key}' must be a whole number >= 0, not {v!r:.40}")
    return v
