from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.frames import Intrinsics, RGBDFrame
from devices.robots.wire import protocol as P
from devices.robots.wire.auth import load_token, new_token, token_matches, write_token_file


def test_framed_roundtrip_over_a_socket() -> None:
    a, b = socket.socketpair()
    with a, b:
        msg = {"type": "command", "mode": "position", "values": [0.1, -2.5], "blob": b"\x00\xff"}
        a.sendall(P.pack(msg) + P.pack({"type": "heartbeat"}))
        assert P.recv_message(b) == msg
        assert P.recv_message(b) == {"type": "heartbeat"}
        a.close()
        with pytest.raises(P.ConnectionClosed):
            P.recv_message(b)


def test_oversized_length_is_refused_before_the_body_arrives() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(P.HEADER.pack(10_000))  # header only: the body never comes
        b.settimeout(10.0)  # hang guard: the refusal must not wait for the body at all
        with pytest.raises(P.ProtocolError) as err:
            P.recv_message(b, max_bytes=4096)
        assert err.value.code == "too_large" and "10000" in str(err.value)


@pytest.mark.parametrize(
    "body", [b"\xc1\xc1\xc1", b"\x93\x01\x02\x03", b"\x81\xa1a\x01", b"\x92\x01"]
)
def test_garbage_bodies_are_malformed(body: bytes) -> None:
    with pytest.raises(P.ProtocolError) as err:
        P.unpack_body(body)
    assert err.value.code == "malformed"


def _frame() -> RGBDFrame:
    rng = np.random.default_rng(0)
    color = rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)
    depth = rng.integers(0, 65535, (30, 40), dtype=np.uint16)
    T = np.eye(4)
    T[:3, 3] = (0.1, -0.2, 0.3)
    return RGBDFrame(
        color,
        depth,
        0.001,
        Intrinsics(40, 30, 31.5, 32.0, 19.5, 14.5),
        timestamp=12.345,
        index=77,
        T_world_camera=T,
        meta={"aligned": True},
    )


def test_frame_roundtrip_is_exact() -> None:
    f = _frame()
    msg = P.unpack_body(P.pack(P.frame_to_message(f, "fixed"))[4:])
    g = P.frame_from_message(msg)
    np.testing.assert_array_equal(g.color, f.color)
    np.testing.assert_array_equal(g.depth, f.depth)
    assert g.depth.dtype == np.uint16 and g.color.dtype == np.uint8
    assert g.intrinsics == f.intrinsics and g.depth_scale == 0.001
    assert g.timestamp == 12.345 and g.index == 77
    np.testing.assert_allclose(g.T_world_camera, f.T_world_camera)
    assert g.meta["camera"] == "fixed" and g.meta["aligned"] is True


def test_frame_with_wrong_size_is_refused() -> None:
    msg = P.frame_to_message(_frame(), "fixed")
    msg["depth_z16"] = msg["depth_z16"][:-2]
    with pytest.raises(P.ProtocolError, match="depth"):
        P.frame_from_message(msg)


def test_array_wire_roundtrip_and_validation() -> None:
    a = np.arange(12, dtype=float).reshape(3, 4)
    np.testing.assert_array_equal(P.array_from_wire(P.array_to_wire(a), "a"), a)
    bad = P.array_to_wire(a)
    bad["shape"] = [5, 4]
    with pytest.raises(P.ProtocolError):
        P.array_from_wire(bad, "a")
    with pytest.raises(P.ProtocolError):
        P.array_from_wire({"dtype": "|O", "shape": [1], "data": b"x"}, "a")


def test_joint_vector_shape_is_checked() -> None:
    assert P.joint_vector([1, 2, 3], 3, "v").dtype == np.float64
    with pytest.raises(P.ProtocolError, match="3 values"):
        P.joint_vector([1, 2], 3, "v")
    with pytest.raises(P.ProtocolError):
        P.joint_vector("abc", 3, "v")


def test_token_from_file_env_and_errors(tmp_path, monkeypatch) -> None:
    tok = new_token()
    f = tmp_path / "token"
    write_token_file(f, tok)
    assert load_token(f) == tok
    assert (f.stat().st_mode & 0o077) == 0
    monkeypatch.setenv("TWINBENCH_TOKEN", tok)
    assert load_token() == tok
    monkeypatch.delenv("TWINBENCH_TOKEN")
    with pytest.raises(DeviceError, match="TWINBENCH_TOKEN"):
        load_token()
    (tmp_path / "short").write_text("abc\n")
    (tmp_path / "short").chmod(0o600)
    with pytest.raises(DeviceError, match="too short"):
        load_token(tmp_path / "short")
    with pytest.raises(DeviceError, match="missing"):
        load_token(tmp_path / "missing")
    assert token_matches(tok, tok) and not token_matches(tok, tok + "x")
    assert not token_matches(tok, None) and not token_matches(tok, 123)


def test_token_file_readable_by_others_is_refused_with_the_chmod(tmp_path) -> None:
    f = tmp_path / "token"
    write_token_file(f, new_token())
    for mode in (0o644, 0o640, 0o604, 0o660):
        f.chmod(mode)
        with pytest.raises(DeviceError, match=rf"group/others.*{oct(mode)[2:]}.*chmod 600 {f}"):
            load_token(f)
    f.chmod(0o600)
    assert len(load_token(f)) >= 16


def test_body_is_not_preallocated_and_has_a_deadline() -> None:
    """A peer announcing 64 MiB and sending 3 bytes costs 3 bytes, and times out."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(P.HEADER.pack(64 * 1024 * 1024) + b"abc")
        budget = P.ByteBudget(1 << 20)
        with pytest.raises(TimeoutError):
            P.recv_message(b, deadline=time.monotonic() + 0.2, budget=budget)
        assert budget.used == 0  # refunded


def test_read_budget_is_shared_and_refused_when_spent() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(P.pack({"type": "x", "blob": b"y" * 5000}))
        budget = P.ByteBudget(4000)
        with pytest.raises(P.ProtocolError) as err:
            P.recv_message(b, budget=budget)
        assert err.value.code == "too_large" and budget.used == 0


def test_a_large_body_arrives_whole_and_is_checked_before_decoding() -> None:
    """A body of many chunks (appended as they arrive, never joined) decodes exactly; with
    the server's limits, one over them is refused before msgpack sees it."""
    a, b = socket.socketpair()
    with a, b:
        msg = {"type": "policy_upload", "onnx": bytes(range(256)) * 12_000, "spec": {"x": [1.5]}}
        data = P.pack(msg)
        assert len(data) > 4 * P.READ_CHUNK
        sender = threading.Thread(target=a.sendall, args=(data + data,), daemon=True)
        sender.start()
        b.settimeout(10.0)
        assert P.recv_message(b, limits=P.CLIENT_LIMITS) == msg
        assert P.recv_message(b) == msg
        sender.join(5.0)
        a.sendall(P.pack({"type": "x", "v": list(range(P.CLIENT_LIMITS.max_elements))}))
        with pytest.raises(P.ProtocolError) as err:
            P.recv_message(b, limits=P.CLIENT_LIMITS)
        assert err.value.code == "too_large" and "max_elements" in str(err.value)
