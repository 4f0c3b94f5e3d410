"""The robot link against a hostile or careless client (issue 10), over real TCP on loopback:
slow peers, memory pinning, replayed handshakes, TLS pinning, remote binds, e-stop ownership,
sticky watchdog stops and odd field values."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.ideal import IdealDriver
from devices.robots.agent.server import RobotServer
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.client import RobotClient
from devices.robots.wire import protocol as P
from devices.robots.wire.auth import new_token, write_token_file
from devices.robots.wire.tls import ensure_certificate, fingerprint, server_context
from tests.devices.robots.conftest import Rig
from tests.devices.robots.helpers import raw_connect, read_until_closed, valid_hello, wait_for

REPO = Path(__file__).resolve().parents[3]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _request(s: socket.socket, msg: dict[str, Any]) -> dict[str, Any]:
    """Send one request on a raw authenticated socket; the first reply/error with its id."""
    s.sendall(P.pack(msg))
    s.settimeout(5.0)
    while True:
        m = P.recv_message(s)
        if m["type"] in ("reply", "error") and m.get("id") == msg.get("id"):
            return m


def _welcomed(s: socket.socket) -> dict[str, Any]:
    s.settimeout(5.0)
    while True:
        m = P.recv_message(s)
        if m["type"] in ("welcome", "error"):
            return m


@pytest.fixture
def small_server() -> Iterator[Rig]:
    """A server with 4 client slots and short deadlines (so the tests are quick)."""
    driver = IdealDriver()
    agent = Agent(driver, watchdog=WatchdogConfig(heartbeat_timeout_s=0.2))
    agent.start()
    token = new_token()
    server = RobotServer(
        agent,
        token,
        max_clients=4,
        hello_timeout_s=1.0,
        idle_timeout_s=1.0,
        max_pending=8,
        min_upload_rate=1e9,  # a 64 MiB message must arrive within ~1 s + 0.07 s
    )
    server.start()
    try:
        yield Rig(driver, agent, server, token)
    finally:
        server.close()
        agent.close()


def _trickle(sock: socket.socket, data: bytes, every_s: float, stop: threading.Event) -> None:
    try:
        for b in data:
            if stop.wait(every_s):
                return
            sock.sendall(bytes([b]))
    except OSError:
        return


def test_trickling_handshake_is_cut_at_one_deadline(small_server: Rig) -> None:
    """A peer that keeps sending one byte at a time is still dropped: the handshake has one
    deadline, not one per read."""
    s = raw_connect(small_server.port)
    nonce = P.recv_message(s)["nonce"]
    stop = threading.Event()
    t = threading.Thread(
        target=_trickle, args=(s, P.pack(valid_hello("x" * 40, nonce)), 0.05, stop)
    )
    t.start()
    try:
        msgs = read_until_closed(s, timeout_s=10.0)  # hang guard; the limit is 1 s
    finally:
        stop.set()
        t.join()
        s.close()
    assert msgs and msgs[-1]["code"] == "timeout" and "handshake" in msgs[-1]["message"]


def test_slow_peers_do_not_lock_out_a_real_client(small_server: Rig) -> None:
    """15 peers trickling hellos (more than the 4 client slots) and a real client still
    gets in at once, every time."""
    srv = small_server
    stop = threading.Event()
    peers, threads = [], []
    try:
        for _ in range(15):
            s = raw_connect(srv.port)
            peers.append(s)
            t = threading.Thread(target=_trickle, args=(s, b"\x00" * 1000, 0.2, stop))
            t.start()
            threads.append(t)
        for _ in range(3):
            with RobotClient("127.0.0.1", srv.port, srv.token, connect_timeout_s=5.0) as c:
                assert c.info is not None and c.latest_state() is not None
        pending = [s for s in srv.server.sessions.values() if not s.authenticated]
        assert len(pending) <= srv.server.max_pending
    finally:
        stop.set()
        for t in threads:
            t.join()
        for s in peers:
            s.close()


def test_logged_in_peers_claiming_huge_messages_do_not_pin_memory(small_server: Rig) -> None:
    srv = small_server
    rss0 = _rss_mb()
    stop = threading.Event()
    socks, threads = [], []
    try:
        for _ in range(3):  # the 4th slot stays free for the real client
            s = raw_connect(srv.port, token=srv.token)
            assert _welcomed(s)["type"] == "welcome"
            # claims 64 MiB (a map whose one value is a bin that long: nothing in its first
            # bytes breaks a limit, so it is read on), then sends a trickle
            n = P.MAX_MESSAGE_BYTES
            s.sendall(P.HEADER.pack(n) + b"\x81\xa4type\xc6" + (n - 11).to_bytes(4, "big"))
            socks.append(s)
            t = threading.Thread(target=_trickle, args=(s, b"\x00" * 1000, 0.1, stop))
            t.start()
            threads.append(t)
        time.sleep(0.3)
        assert _rss_mb() - rss0 < 60  # 3 x 64 MiB would be 192 MiB if preallocated
        assert srv.server.read_budget.used <= 3 * (P.READ_CHUNK + 1000)  # reserved + received
        with RobotClient("127.0.0.1", srv.port, srv.token) as c:
            assert c.latest_state() is not None
        # the tricklers are dropped at their message deadline although they keep sending
        for s in socks:
            msgs = read_until_closed(s, timeout_s=15.0)
            assert msgs and msgs[-1]["code"] == "timeout"
    finally:
        stop.set()
        for t in threads:
            t.join()
        for s in socks:
            s.close()
    assert wait_for(lambda: srv.server.read_budget.used == 0, 5.0)


def test_replayed_handshake_is_refused(rig: Rig) -> None:
    """Bytes of a successful hello, captured and replayed (also twice at once), fail."""
    s = raw_connect(rig.port, read_challenge=False)
    nonce = P.recv_message(s)["nonce"]
    captured = P.pack(valid_hello(rig.token, nonce))
    s.sendall(captured)
    assert _welcomed(s)["type"] == "welcome"
    s.close()
    replays = [raw_connect(rig.port, read_challenge=False) for _ in range(2)]
    for r in replays:
        r.sendall(captured)
    for r in replays:
        msgs = read_until_closed(r)
        r.close()
        assert [m["type"] for m in msgs] == ["challenge", "error"]
        assert msgs[-1]["code"] == "auth"


def test_old_style_hello_with_the_token_in_clear_is_refused(rig: Rig) -> None:
    hello = {"type": "hello", "protocol": P.PROTOCOL_NAME, "version": 1, "token": rig.token}
    s = raw_connect(rig.port, hello=hello)
    msgs = read_until_closed(s)
    s.close()
    assert msgs[-1]["code"] == "auth" and "joint" not in str(msgs)


def test_client_refuses_a_server_that_cannot_prove_the_token(rig: Rig) -> None:
    """A fake robot that accepts anyone is caught: its welcome carries no valid proof."""
    fake = socket.create_server(("127.0.0.1", 0))
    port = fake.getsockname()[1]

    def serve() -> None:
        conn, _ = fake.accept()
        with conn:
            conn.sendall(P.pack({"type": "challenge", "nonce": b"n" * 32}))
            P.recv_message(conn)
            welcome = {"type": "welcome", "proof": b"p" * 32, "session": "s"}
            conn.sendall(P.pack({**welcome, "info": rig.agent.info.to_dict()}))
            time.sleep(0.5)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with pytest.raises(DeviceError, match="did not prove it holds the token"):
            RobotClient("127.0.0.1", port, rig.token).connect()
    finally:
        t.join()
        fake.close()


def test_non_loopback_bind_needs_the_flag_and_tls(tmp_path: Path) -> None:
    agent = Agent(IdealDriver())
    for kw in ({}, {"allow_remote": True}):
        with pytest.raises(DeviceError, match="refusing to listen on 0.0.0.0"):
            RobotServer(agent, new_token(), host="0.0.0.0", **kw).start()  # type: ignore[arg-type]
    token_file = tmp_path / "token"
    write_token_file(token_file, new_token())
    proc = subprocess.run(
        [sys.executable, str(REPO / "main.py"), "lab", "serve", "--host", "0.0.0.0",
         "--port", "0", "--token-file", str(token_file), "--no-cameras"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "--allow-remote" in proc.stderr + proc.stdout
    assert "listening" not in proc.stdout


def test_tls_with_pinned_and_first_use_fingerprints(tmp_path: Path) -> None:
    cert, key = ensure_certificate(tmp_path / "tls")
    assert ensure_certificate(tmp_path / "tls") == (cert, key)  # made once, then reused
    assert (key.stat().st_mode & 0o077) == 0
    other_cert, _ = ensure_certificate(tmp_path / "other")
    fp = fingerprint(cert)
    agent = Agent(IdealDriver())
    agent.start()
    token = new_token()
    known = tmp_path / "known_robots"
    try:
        with RobotServer(agent, token, tls=server_context(cert, key)) as srv:
            with RobotClient("127.0.0.1", srv.port, token, tls_fingerprint=fp) as c:
                assert c.server_fingerprint == fp and c.latest_state() is not None
            with pytest.raises(DeviceError, match="does not match the pinned"):
                RobotClient(
                    "127.0.0.1", srv.port, token, tls_fingerprint=fingerprint(other_cert)
                ).connect()
            # trust on first use: recorded, then required
            with RobotClient("127.0.0.1", srv.port, token, tls=True, known_robots=known) as c:
                assert c.latest_state() is not None
            assert f"127.0.0.1:{srv.port} {fp}" in known.read_text()
            known.write_text(f"127.0.0.1:{srv.port} {fingerprint(other_cert)}\n")
            with pytest.raises(DeviceError, match="certificate changed"):
                RobotClient("127.0.0.1", srv.port, token, tls=True, known_robots=known).connect()
            # a plain client to a TLS server fails cleanly, and the server keeps serving
            with pytest.raises(DeviceError, match="handshake"):
                RobotClient("127.0.0.1", srv.port, token, connect_timeout_s=1.0).connect()
            with RobotClient("127.0.0.1", srv.port, token, tls_fingerprint=fp) as c:
                assert c.latest_state() is not None
    finally:
        agent.close()


def test_tls_links_carry_requests_while_the_state_streams(tmp_path: Path) -> None:
    """Four TLS clients in one process, each subscribed to the 250 Hz state stream and
    sending 1000 requests: every one answered. With the SSL object read by one thread
    while another wrote, 2-3 of the 4 links ended early in every run ("connection closed
    by the robot", "EOF occurred in violation of protocol")."""
    cert, key = ensure_certificate(tmp_path / "tls")
    agent = Agent(IdealDriver())
    agent.start()
    token, errors, answered = new_token(), [], []
    try:
        with RobotServer(agent, token, tls=server_context(cert, key)) as srv:

            def client() -> None:
                try:
                    with RobotClient(
                        "127.0.0.1", srv.port, token, tls_fingerprint=fingerprint(cert)
                    ) as c:
                        for _ in range(1000):
                            assert c.request("get_info")["name"] == agent.info.name
                            answered.append(1)
                            time.sleep(0.002)  # under the flood guard's 1000 messages/s
                        assert c.latest_state() is not None
                except DeviceError as exc:
                    errors.append(str(exc))

            threads = [threading.Thread(target=client) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert not srv.notes, srv.notes
    finally:
        agent.close()
    assert errors == [] and len(answered) == 4000


def test_only_the_operator_clears_an_estop(rig: Rig) -> None:
    with (
        RobotClient("127.0.0.1", rig.port, rig.token, name="operator") as a,
        RobotClient("127.0.0.1", rig.port, rig.token, name="stranger") as b,
    ):
        q = a.latest_state().joint_pos
        a.request("command", mode="position", values=q.tolist())
        a.estop("operator stops")
        assert wait_for(lambda: b.latest_status()["mode"] == "estop")
        with pytest.raises(DeviceError, match="only the operator"):
            b.reset()
        with pytest.raises(DeviceError, match="latched"):
            b.request("command", mode="position", values=q.tolist())
        assert rig.agent.mode == "estop"
        # the stranger presses it too: the operator stays the operator
        b.estop("stranger too")
        with pytest.raises(DeviceError, match="only the operator"):
            b.reset()
        a.reset()
        assert wait_for(lambda: a.latest_status()["mode"] == "idle")
        # the operator kept control through its e-stop: the stranger cannot take over
        with pytest.raises(DeviceError, match="another client"):
            b.request("command", mode="position", values=q.tolist())
        b.estop("stranger")
        with pytest.raises(DeviceError, match="only the operator"):
            b.reset()
        a.reset()
    rig.agent.estop("console")
    rig.agent.reset()  # the robot's own console may always
    assert rig.agent.mode == "idle"


def test_a_bystanders_estop_never_locks_the_operator_out(rig: Rig) -> None:
    """Issue 23: with nobody in control (the operator had stopped, which hands control
    back), a watcher's e-stop made the watcher the only one who could reset it."""
    with (
        RobotClient("127.0.0.1", rig.port, rig.token, name="operator") as a,
        RobotClient("127.0.0.1", rig.port, rig.token, name="watcher") as b,
    ):
        q = a.latest_state().joint_pos
        a.request("command", mode="position", values=q.tolist())
        a.stop()
        assert wait_for(lambda: a.status()["owner"] is None)
        b.estop("bystander")
        assert wait_for(lambda: a.latest_status()["mode"] == "estop")
        with pytest.raises(DeviceError, match="only the operator"):
            b.reset()
        a.reset()  # the last controller, still connected, is the operator
        assert wait_for(lambda: a.latest_status()["mode"] == "idle")
    with RobotClient("127.0.0.1", rig.port, rig.token, name="watcher") as b:
        b.estop("nobody has controlled it since")
        b.reset()  # no operator connected: any client may reset, the robot stays held
        assert wait_for(lambda: b.latest_status()["mode"] == "idle")


def test_a_watchers_stop_does_not_hand_control_over(rig: Rig) -> None:
    """Issue 23: any watcher could take control with `stop` + `command`."""
    with (
        RobotClient("127.0.0.1", rig.port, rig.token, name="operator") as a,
        RobotClient("127.0.0.1", rig.port, rig.token, name="watcher") as b,
    ):
        q = a.latest_state().joint_pos
        a.request("command", mode="position", values=q.tolist())
        b.stop("watcher stops it")
        assert wait_for(lambda: a.latest_status()["mode"] == "stopped")
        for kind in ("command", "acquire"):
            with pytest.raises(DeviceError, match="another client"):
                if kind == "command":
                    b.request("command", mode="position", values=q.tolist())
                else:
                    b.take_control()
        assert a.status()["owner"] == a.session
        a.request("command", mode="position", values=q.tolist())  # the operator resumes
        assert wait_for(lambda: a.latest_status()["mode"] == "command")


def test_watchdog_stop_sticks_until_control_is_taken_again(rig: Rig) -> None:
    """Heartbeats stop but commands keep coming: the robot stops once and stays stopped."""
    with RobotClient("127.0.0.1", rig.port, rig.token) as c:
        q = c.latest_state().joint_pos.copy()
        c.command_position(q)
        assert wait_for(lambda: c.latest_status()["mode"] == "command")
        c.heartbeat_enabled = False
        modes: list[str] = []
        assert wait_for(lambda: c.latest_status()["mode"] == "stopped", 5.0)
        for _k in range(100):  # the careless client keeps streaming targets
            q[0] += 0.002
            c.command_position(q)
            modes.append(str(c.latest_status()["mode"]))
            time.sleep(0.005)
        assert set(modes) == {"stopped"}
        with pytest.raises(DeviceError, match="watchdog.*acquire"):
            c.request("command", mode="position", values=q.tolist())
        c.heartbeat_enabled = True
        c.take_control()
        c.request("command", mode="position", values=c.latest_state().joint_pos.tolist())
        assert wait_for(lambda: c.latest_status()["mode"] == "command")
    wd = [e for e in list(c.events) if e.get("kind") == "watchdog"]
    assert len(wd) == 1


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        ({"type": "get_status", "jitter_window_s": 1e308}, "jitter_window_s"),
        ({"type": "get_status", "jitter_window_s": -5}, "jitter_window_s"),
        ({"type": "get_status", "jitter_window_s": "1"}, "jitter_window_s"),
        ({"type": "get_log", "last": 1.5}, "last"),
        ({"type": "get_log", "last": -3}, "last"),
        ({"type": "get_log", "last": True}, "last"),
        ({"type": "subscribe", "state": "no"}, "state"),
        ({"type": "subscribe", "state": 0}, "state"),
        ({"type": "policy_run", "ramp_s": float("nan")}, "ramp_s"),
        ({"type": "command", "mode": ["position"], "values": [0.0] * 7}, "mode"),
    ],
)
def test_odd_values_are_bad_requests_not_internal(
    rig: Rig, msg: dict[str, Any], field: str
) -> None:
    s = raw_connect(rig.port, token=rig.token)
    try:
        assert _welcomed(s)["type"] == "welcome"
        r = _request(s, {**msg, "id": 5})
        assert r["type"] == "error" and r["code"] == "bad_request" and not r["fatal"]
        assert field in r["message"]
        assert _request(s, {"type": "get_info", "id": 6})["type"] == "reply"  # still served
    finally:
        s.close()


@pytest.mark.parametrize("bad_id", ["7", 1.5, True, [1], {"a": 1}])
def test_non_integer_ids_are_refused_not_echoed(rig: Rig, bad_id: Any) -> None:
    s = raw_connect(rig.port, token=rig.token)
    try:
        assert _welcomed(s)["type"] == "welcome"
        s.sendall(P.pack({"type": "get_info", "id": bad_id}))
        r = P.recv_message(s)
        while r["type"] not in ("reply", "error"):
            r = P.recv_message(s)
        assert r["type"] == "error" and r["code"] == "bad_request" and r["id"] is None
    finally:
        s.close()


def test_subscribe_false_really_unsubscribes(rig: Rig) -> None:
    s = raw_connect(rig.port, token=rig.token)
    try:
        assert _welcomed(s)["type"] == "welcome"
        assert _request(s, {"type": "subscribe", "state": True, "id": 1})["type"] == "reply"
        assert _request(s, {"type": "subscribe", "state": False, "id": 2})["type"] == "reply"
        s.settimeout(0.3)
        got: list[str] = []
        try:
            while True:
                got.append(P.recv_message(s)["type"])
        except TimeoutError:
            pass
        assert "state" not in got[20:]  # a few may have been queued before the reply
    finally:
        s.close()


def test_silent_watch_only_client_is_dropped_as_documented(small_server: Rig) -> None:
    """PROTOCOL.md: a client that sends nothing (no heartbeat) for idle_timeout_s is dropped."""
    s = raw_connect(small_server.port, token=small_server.token)
    try:
        assert _welcomed(s)["type"] == "welcome"
        msgs = read_until_closed(s, timeout_s=10.0)
        assert msgs[-1]["code"] == "timeout" and "silent" in msgs[-1]["message"]
    finally:
        s.close()
    assert "idle_timeout_s" in (REPO / "devices/robots/wire/PROTOCOL.md").read_text()


def test_state_stream_survives_all_of_the_above(rig: Rig) -> None:
    with RobotClient("127.0.0.1", rig.port, rig.token) as c:
        traj = c.stream(0.2)
    assert len(traj) > 3 and np.all(np.diff(traj.t) > 0)
