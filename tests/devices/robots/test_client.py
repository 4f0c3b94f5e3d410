from __future__ import annotations

import socket

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.robots.agent.agent_log import MODES
from devices.robots.client import RobotClient
from tests.devices.robots.conftest import Rig
from tests.devices.robots.helpers import wait_for


def test_info_and_stream_to_trajectory(rig: Rig) -> None:
    with RobotClient("127.0.0.1", rig.port, rig.token) as c:
        assert c.info is not None and c.info.joint_names == rig.agent.info.joint_names
        np.testing.assert_allclose(c.info.limits.upper, rig.agent.info.limits.upper)
        q = c.latest_state().joint_pos.copy()
        target = q.copy()
        target[1] += 0.2
        c.command_position(target)
        traj = c.stream(0.6)
    assert set(traj.channels) == {
        "robot/joint_pos",
        "robot/joint_vel",
        "robot/joint_effort",
        "robot/command",
    }
    assert traj.units["robot/joint_pos"] == "rad" and traj.units["robot/joint_vel"] == "rad/s"
    assert traj.units["robot/joint_effort"] == "N*m" and traj.source == "real"
    assert traj["robot/joint_pos"].shape == (len(traj), 7)
    assert np.all(np.diff(traj.t) > 0)
    # the rate itself is a benchmark number (bench lab); here: states came, in order
    assert len(traj) > 10 and traj.meta["rate_hz"] > 0
    assert traj.meta["robot"] == "ideal" and traj.meta["device"] == f"127.0.0.1:{rig.port}"
    # the robot moved towards the target; commands are the rate-limited ones actually sent
    jp = traj["robot/joint_pos"][:, 1]
    assert jp[-1] > jp[0] + 0.1
    cmd = traj["robot/command"][:, 1]
    cmd = cmd[~np.isnan(cmd)]
    assert np.all(np.diff(cmd) >= -1e-12) and cmd.max() <= target[1] + 1e-12  # ramps to target


def test_connection_loss_is_reported_promptly_with_the_address(rig: Rig) -> None:
    c = RobotClient("127.0.0.1", rig.port, rig.token, stale_timeout_s=0.5)
    c.connect()
    try:
        c.latest_state()
        rig.server.close()
        assert wait_for(lambda: not c.connected, 10.0)  # hang guard
        with pytest.raises(DeviceError, match=f"127.0.0.1:{rig.port}"):
            c.latest_state()
        with pytest.raises(DeviceError, match=f"127.0.0.1:{rig.port}"):
            c.command_position(np.zeros(7))
    finally:
        c.close()


def test_silent_robot_is_detected_as_lost() -> None:
    """A robot that stops sending (frozen process, pulled cable) is noticed by silence."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    c = RobotClient("127.0.0.1", port, "t" * 20, connect_timeout_s=0.5)
    with pytest.raises(DeviceError, match=f"127.0.0.1:{port}.*handshake.*timed out"):
        c.connect()  # accepted by the kernel, never answered: times out, does not hang
    srv.close()


def test_connect_refused_names_the_address() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(DeviceError, match=f"127.0.0.1:{port}.*cannot connect"):
        RobotClient("127.0.0.1", port, "t" * 20).connect()


def test_log_status_and_camera_frames(rig: Rig) -> None:
    with RobotClient("127.0.0.1", rig.port, rig.token) as c:
        q = c.latest_state().joint_pos
        c.command_position(q + 0.01)
        # behaviour, not speed: wait (hang guard only) until 20 ticks ran in command mode
        assert wait_for(lambda: np.all(c.get_log(last=20)["mode"] == MODES.index("command")), 10.0)
        log = c.get_log(last=20)
        assert log["sent"].shape == (20, 7) and log["t"].shape == (20,)
        assert np.all(log["mode"] == MODES.index("command"))
        st = c.status(jitter_window_s=0.1)
        assert st["mode"] == "command" and st["owner"] == c.session
        assert st["safety"]["workspace_upper"] == [0.6, 0.6, 0.9]
        frames = c.camera_frames("synthetic")
        got = [next(frames) for _ in range(4)]
        frames.close()
        idx = [f.index for f in got]
        assert idx == sorted(idx) and len(set(idx)) == 4
        f = got[-1]
        assert f.color.shape == (48, 64, 3) and f.depth.shape == (48, 64)
        assert int(f.color[0, 0, 0]) == f.index % 256  # content survived
        assert int(f.depth[0, 0]) == f.index and f.T_world_camera[0, 3] == pytest.approx(
            0.01 * f.index
        )
        with pytest.raises(DeviceError, match="no camera 'nope'"):
            next(c.camera_frames("nope"))
        assert c.connected


def test_the_collector_waits_while_any_recording_runs_and_resumes_after_the_last() -> None:
    """Recordings overlap (a camera capture beside a motion, two threads): the collector
    stays off until the last one ends, and is left off when it was off before."""
    import gc

    from devices.robots.client import collector_paused

    assert gc.isenabled()
    first, second = collector_paused(), collector_paused()
    first.__enter__()
    assert not gc.isenabled()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second recording still runs
    second.__exit__(None, None, None)
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before: not switched on behind the caller's back
    finally:
        gc.enable()
