"""`bench safety`'s attacks over a raw socket (benches/safety_attacks.py runs the
others): `type_confusion`, every message type with fields of the wrong type; and
`big_messages`, 60 MiB of small ints, ~20 MiB of empty maps and 100k nested arrays from a
watch-only client while an e-stop station in a process of its own (`Presser`) presses.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benches.safety_attacks import _CODE, READY, SPEC, Ctx, Msg
from benches.safety_models import constant_model
from benches.safety_probe import Vec, answer, raw_hello, rss_mb
from devices.errors import DeviceError
from devices.robots.agent.launch import LabProcess
from devices.robots.wire import protocol as P
from devices.robots.wire.auth import TOKEN_ENV


class RawClient:
    """A hand-written, logged-in client: sends any bytes, collects what comes back."""

    def __init__(self, lab: LabProcess) -> None:
        s, hello = raw_hello(lab.host, lab.port, lab.token)
        s.sendall(hello)
        if answer(s) != "welcome":
            s.close()
            raise DeviceError("a raw client was not welcomed")
        s.settimeout(None)
        self.sock, self.closed = s, False
        self.inbox: list[Msg] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                self.inbox.append(P.recv_message(self.sock))
        except (OSError, DeviceError):
            self.closed = True

    def send(self, msg: Msg) -> None:
        self.sock.sendall(P.pack(msg))

    def quiet(self, seconds: float = 0.5, longest: float = 4.0) -> None:
        """Wait until nothing has arrived for `seconds` (at most `longest`)."""
        end, seen, since = time.monotonic() + longest, -1, time.monotonic()
        while time.monotonic() < end and not self.closed:
            if len(self.inbox) != seen:
                seen, since = len(self.inbox), time.monotonic()
            elif time.monotonic() - since > seconds:
                return
            time.sleep(0.02)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(timeout=2.0)


def confusion_messages(q: Vec, onnx: bytes) -> list[Msg]:
    """Every client message type with fields of the wrong type (each with an id unless the
    id itself is the odd field). `q` (the current pose) where a valid vector is needed;
    `onnx` a model that outputs zero deltas (harmless if an upload is wrongly accepted)."""
    n, ok = len(q), [float(x) for x in q]
    vectors: list[Any] = [
        ["0.1"] * n, [True] * n, [None] * n, [[0.1]] * n, [1e308] * n, ok[:-1] + ["x"],
        "0.1", 0.1, {"a": 1}, [], ok + [0.0, 0.0], [-1e308] + ok[1:],
    ]  # fmt: skip
    msgs: list[Msg] = [
        {"type": "command", "mode": mode, "values": v}
        for v in vectors
        for mode in ("position", "velocity")
    ]
    msgs += [{"type": "command", "mode": m, "values": ok} for m in (5, True, ["position"], b"x")]
    pose = [0.5, 0.0, 0.1, 0.0, 0.0, 0.0, 1.0]
    obj: list[Msg] = [
        {"pose": [1e308, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]}, {"t": "now"}, {"quality": True},
        {"lost": "no"}, {"object": 5}, {"pose": "1,2,3"}, {"pose": [None] * 7}, {"t": [0.0]},
    ]  # fmt: skip
    msgs += [{"type": "object_pose", "object": "puck", "pose": pose, "t": 0.0, **o} for o in obj]
    msgs += [
        {"type": "policy_run", **f}
        for f in ({"ramp_s": "0.5"}, {"ramp_s": True}, {"ramp_s": [0.5]}, {"ramp_s": 1e308},
                  {"policy": 7, "ramp_s": 0.5}, {"policy": [1], "ramp_s": 0.5},
                  {"policy": 1.5, "ramp_s": 0.5}, {"policy": True, "ramp_s": 0.5})
    ]  # fmt: skip
    msgs += [{"type": "get_status", "jitter_window_s": w} for w in ([1], "5", True, 1e308)]
    msgs += [{"type": "get_log", "last": v} for v in (1.5, "3", True, [1], -1)]
    msgs += [{"type": "subscribe", "state": v} for v in ("yes", 1, [True])]
    msgs += [{"type": "camera_subscribe", "camera": v} for v in (5, ["fixed"], True)]
    msgs += [{"type": k, "reason": r} for k in ("stop", "estop") for r in (5, [1], True)]
    spec = {"observation": ["joint_pos", "joint_vel"], "action": {"type": "delta"}}
    uploads: list[Msg] = [
        {"onnx": "abc", "spec": spec}, {"onnx": [1, 2, 3], "spec": spec}, {"onnx": onnx, "spec": "x"},
        {"onnx": onnx, "spec": {**spec, "observation": "joint_pos"}},
        {"onnx": onnx, "spec": {**spec, "action": {"type": "delta", "scale": "2"}}},
        {"onnx": onnx, "spec": {**spec, "action": {"mode": 5, "type": "delta"}}},
        {"onnx": onnx, "spec": spec, "safety": "x"},
        {"onnx": onnx, "spec": spec, "safety": {"velocity_scale": "0.5"}},
    ]  # fmt: skip
    msgs += [{"type": "policy_upload", **u} for u in uploads]
    out = [{**m, "id": 1000 + i} for i, m in enumerate(msgs)]
    out += [{"type": "get_info", "id": v} for v in (1.5, "7", True, [1], 2.0)]
    return out


def _confusion_send(raw: RawClient, msgs: list[Msg]) -> int:
    sent = 0
    for m in msgs:
        if raw.closed:
            break
        raw.send(m)
        sent += 1
        time.sleep(0.004)  # ~250 messages/s: well under the flood limit
    raw.send({"type": "type", "id": 1})  # a well-formed unknown type: bad_request
    raw.send({"type": 5, "id": 2})  # `type` not a string: malformed, then a disconnect
    return sent + 2


def type_confusion(ctx: Ctx) -> dict[str, Any]:
    """Odd field types over a raw socket, while the adversary watches the arm (it must not
    move). `type_confusion_accepted` counts replies with ok=true."""
    ctx.settle(READY)
    c = ctx.c
    q0 = c.latest_state().joint_pos.copy()
    # a loaded policy that holds still, in case a policy_run is wrongly accepted
    c.upload_policy(constant_model(q0, 2 * len(q0)), SPEC)
    c.stop()
    zero = constant_model(np.zeros(len(q0)), 2 * len(q0))
    raw = RawClient(ctx.lab)
    with c.recording() as rec:
        try:
            sent = _confusion_send(raw, confusion_messages(q0, zero))
            raw.quiet()
        finally:
            raw.close()
        time.sleep(0.3)
    replies = [m for m in raw.inbox if m.get("type") in ("reply", "error")]
    for m in replies:
        if m.get("type") == "error":
            ctx.tally.code(m.get("code"))
    moved = max((float(np.abs(np.asarray(m["joint_pos"]) - q0).max()) for m in rec), default=0.0)
    ctx.meter.episode = "type confusion"
    ctx.meter.add(rec)
    try:
        c.reset()  # in case an odd e-stop was accepted (its presser has gone: anyone may)
    except DeviceError as exc:
        ctx.tally.note(exc)
    ctx.after("type confusion")
    return {
        "type_confusion_accepted": sum(1 for m in replies if m.get("ok") is True),
        "type_confusion_sent": sent,
        "type_confusion_answered": len(replies),
        "type_confusion_moved_rad": moved,
    }


def big_bodies() -> dict[str, bytes]:
    """Framed messages, built as bytes (never as Python objects here): a map
    {"type": "heartbeat", "data": X} with X 60 MiB of small ints, ~20 MiB of empty maps, or
    100k arrays nested in one another."""
    head = b"\x82\xa4type\xa9heartbeat\xa4data"
    n_ints = 60 * 2**20 - len(head) - 5
    n_maps = 20 * 2**20
    depth = 100_000
    bodies = {
        "60 MiB of small ints": head + b"\xdd" + struct.pack(">I", n_ints) + b"\x01" * n_ints,
        "20 MiB of empty maps": head + b"\xdd" + struct.pack(">I", n_maps) + b"\x80" * n_maps,
        "100k nested arrays": head + b"\x91" * depth + b"\x90",
    }
    return {k: P.HEADER.pack(len(b)) + b for k, b in bodies.items()}


class RssWatch:
    """The lab process's resident memory, sampled every 20 ms, plus its kernel peak (VmHWM,
    reset at start where the kernel lets us) so short spikes between samples count too."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_mb = pid, 0.0
        self._stop = threading.Event()
        self._hwm = False
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to VmRSS
            self._hwm = True
        except OSError:
            pass
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak_mb = max(self.peak_mb, rss_mb(self.pid))
            except OSError:
                return

    def stop(self) -> float:
        self._stop.set()
        self._t.join(timeout=2.0)
        if self._hwm:
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_mb = max(self.peak_mb, int(line.split()[1]) / 1024.0)
            except OSError:
                pass
        return self.peak_mb


class Presser:
    """The e-stop station (benches/estop_presser.py): a process of its own, SCHED_FIFO
    where allowed, in control of the robot, pressing every 20 ms between `go` and `end`."""

    def __init__(self, lab: LabProcess) -> None:
        env = dict(os.environ, **{TOKEN_ENV: lab.token})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benches.estop_presser", lab.host, str(lab.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        self.hello = self._read(20.0)
        if not self.hello.get("ready"):
            raise DeviceError(f"e-stop presser did not start: {self.hello}")

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            return {"error": f"no answer from the e-stop presser in {timeout_s:g} s"}
        return dict(json.loads(line))

    def _send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def go(self) -> None:
        self._send("go")

    def end(self) -> dict[str, Any]:
        self._send("end")
        return self._read(15.0)

    def close(self) -> None:
        try:
            self._send("quit")
            self.proc.wait(timeout=5.0)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _one_big(ctx: Ctx, presser: Presser, data: bytes) -> float:
    """A watch-only raw client sends `data` while the presser presses the e-stop every
    20 ms, from the send's start until 1 s after it ends, then resets. Worst ack."""
    raw = RawClient(ctx.lab)
    presser.go()
    try:
        raw.sock.sendall(data)
    except OSError:
        pass
    time.sleep(1.0)
    out = presser.end()
    raw.quiet(0.3, 2.0)
    raw.close()
    for m in raw.inbox:
        if m.get("type") == "error":
            ctx.tally.code(m.get("code"))
    for e in out.get("errors", []):
        ctx.tally.failures.append(f"e-stop presser: {e}")
        found = _CODE.search(e)
        ctx.tally.code(found.group(1) if found else None)
    if "worst_ms" not in out:
        raise DeviceError(str(out.get("error", out)))
    return float(out["worst_ms"])


def big_messages(ctx: Ctx) -> dict[str, Any]:
    """The three big messages, one at a time, each with the e-stop pressed meanwhile by a
    third client that holds the robot, in a process of its own (`Presser`: no state stream,
    it measures the robot's answer, not the bench's own scheduling); it resets the e-stop
    after each."""
    try:
        ctx.c.stop()  # nobody in control: the e-stop's presser takes it
    except DeviceError as exc:
        ctx.tally.note(exc)
    watch = RssWatch(ctx.lab.proc.pid)
    worst: dict[str, float] = {}
    presser = Presser(ctx.lab)
    try:
        for name, data in big_bodies().items():
            worst[name] = ctx.attempt(
                f"big message {name}", _one_big, ctx, presser, data, default=0.0
            )
    finally:
        presser.close()
        rss = watch.stop()
    slowest = max(worst, key=lambda k: worst[k]) if worst else ""
    return {
        "estop_ack_ms_during_big_message": max(worst.values(), default=0.0),
        "estop_slowest_during": slowest,
        "estop_presser_realtime": bool(presser.hello.get("realtime")),
        "server_rss_mb_max": rss,
    }
