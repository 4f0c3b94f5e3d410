"""A robot link that rides out a busy machine (issue 24, item 1).

Over loopback, through a relay that stalls like a paused process (tests/app/flaky_link.py),
to an in-process agent on the ideal driver, and to the real lab process (SIGSTOP):

- the client's no-data timeout is sized from the robot's heartbeat deadline and the load,
  so a 1.5 s stall is no lost link, and the lab process is never stopped for one;
- a link that does drop reconnects by itself; the session says "reconnecting" then
  "connected" and logs "robot link lost (…); reconnected after 2.3 s"; the lab stays up;
  the view goes on; the new session must take control before anything moves;
- a motion that was streaming when the link dropped ends as an error naming the drop;
- the robot and camera rows say "stale" within 2 s of silence, and recover.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.controller import AppController, DeviceStatus
from devices.errors import DeviceError
from resources.jobs import run_to_end
from tests.app.flaky_link import FakeLab, Robot
from tests.devices.robots.helpers import wait_for

# live links judged on the wall clock
pytestmark = [pytest.mark.slow, pytest.mark.realtime]


@pytest.fixture
def robot() -> Iterator[Robot]:
    r = Robot()
    try:
        yield r
    finally:
        r.close()


def _rows(controller: AppController) -> list[tuple[str, str, str]]:
    seen: list[tuple[str, str, str]] = []

    def note(devs: dict[str, DeviceStatus]) -> None:  # each row's changes of state
        for name in ("robot", "camera"):
            d = devs[name]
            if [s for n, s, _ in seen if n == name][-1:] != [d.state]:
                seen.append((name, d.state, d.detail))

    controller.devices_changed.connect(note)
    return seen


def _states(seen: list[tuple[str, str, str]], name: str) -> list[str]:
    out: list[str] = []
    for n, s, _ in seen:
        if n == name and (not out or out[-1] != s):
            out.append(s)
    return out


def test_the_no_data_timeout_is_sized_from_the_heartbeat_deadline_and_the_load(
    robot: Robot,
) -> None:
    from devices.robots.client import no_data_timeout

    assert no_data_timeout(0.25, load=0.3) == 3.0  # 10 x 0.25 s, but at least 3 s
    assert no_data_timeout(0.5, load=0.3) == 5.0
    assert no_data_timeout(0.25, load=2.0) == 6.0  # a loaded machine waits longer
    assert no_data_timeout(0.25, load=50.0) == 9.0  # at most 3x
    assert no_data_timeout(2.0, load=1.0) == 10.0  # never past the server's idle timeout
    assert no_data_timeout(None, load=0.0) == 3.0  # a robot that cannot say: 0.25 s
    c = robot.client()
    try:
        assert c.stale_timeout_s >= 3.0  # was a fixed 1.0 s
        assert c.stale_timeout_s == pytest.approx(no_data_timeout(0.25), abs=1.0)
    finally:
        c.close()


def test_a_1_5_s_stall_is_ridden_out_without_losing_the_link(robot: Robot) -> None:
    c = robot.client()
    try:
        seq0 = c.latest_state().seq
        robot.link.freeze(1.5)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            assert c.connected, c._lost  # the stall is not a lost robot
            time.sleep(0.05)
        assert wait_for(lambda: c.latest_state().seq > seq0 + 50, 5.0)  # states flow again
        assert c.connected and c.epoch == 0 and c.link_state == "connected"
        assert robot.link.connections == 1  # no reconnect was needed
    finally:
        c.close()


def test_the_lab_process_outlives_a_1_5_s_stop_and_the_app_keeps_it(tmp_path: Any) -> None:
    """The user's report: a 1 s hiccup dropped the link and the workbench stopped the lab.
    Here the lab process itself is stopped (SIGSTOP) for 1.5 s while the app polls it as
    the devices panel does: the lab stays up, attached and connected."""
    from app import robot_link

    controller = AppController(config=tmp_path / "config")
    # what the devices panel calls while it shows the robot (poll_devices: the rows' truth)
    poll = getattr(controller, "poll_devices", lambda: None)
    link = run_to_end(robot_link.lab_job())
    controller.attach_robot(link, detail="lab")
    try:
        assert wait_for(lambda: controller.robot_state() is not None, 5.0)
        seq0 = controller.robot_state().seq  # type: ignore[union-attr]
        os.kill(link.process.proc.pid, signal.SIGSTOP)
        try:
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                controller.robot_state()
                poll()
                time.sleep(0.05)
        finally:
            with contextlib.suppress(ProcessLookupError):  # (stopped by the app: the bug)
                os.kill(link.process.proc.pid, signal.SIGCONT)

        def flowing() -> bool:
            st = controller.robot_state()
            poll()
            return st is not None and st.seq > seq0 + 100

        assert link.process.alive and controller.robot_link is link, controller.devices()
        assert wait_for(flowing, 10.0, 0.05)
        assert wait_for(lambda: controller.devices()["robot"].state == "connected", 5.0)
        assert link.client.connected and link.client.epoch == 0
    finally:
        controller.shutdown()
    assert not link.process.alive  # closing the session is what stops it


def test_a_dropped_link_reconnects_by_itself_keeps_the_lab_and_says_so(
    robot: Robot, tmp_path: Any
) -> None:
    from app.robot_link import AgentLink

    lab = FakeLab(robot.link.port, robot.token)
    client = robot.client(stale_timeout_s=1.0, reconnect=True, reconnect_while=lambda: lab.alive)
    controller = AppController(config=tmp_path / "config")
    controller.install_log_handler()
    seen = _rows(controller)
    link = AgentLink(client, f"{lab.host}:{lab.port}", process=lab, is_lab=True)
    controller.attach_robot(link, detail="ideal (virtual lab)")
    controller.poll_devices()
    try:
        q = client.latest_state().joint_pos.copy()
        client.take_control()
        client.command_position(q)
        robot.link.freeze(2.0)  # longer than the 1 s this client allows: the link drops
        t0 = time.monotonic()
        assert wait_for(lambda: client.link_state == "reconnecting", 5.0)
        # the row follows the link's news (told on the link's thread, just after it changes)
        assert wait_for(lambda: controller.devices()["robot"].state == "reconnecting", 2.0)
        assert controller.robot_state() is None  # nothing to show, and nothing torn down
        assert wait_for(lambda: client.link_state == "connected", 10.0)
        took = time.monotonic() - t0
        assert took < 8.0
        # the session: reconnecting -> connected, both rows, a log line saying what happened
        assert wait_for(lambda: _states(seen, "camera")[-1:] == ["connected"], 2.0), seen
        assert _states(seen, "robot")[-2:] == ["reconnecting", "connected"], seen
        assert _states(seen, "camera")[-2:] == ["reconnecting", "connected"], seen
        assert controller.devices()["camera"].state == "connected"
        lines = [e.message for e in controller.log_entries()]
        assert any("robot link lost (no data for 1.0 s); reconnected after" in m for m in lines), (
            lines
        )
        # the lab was never stopped, the view goes on with fresh states
        assert lab.terminated == 0 and controller.robot_link is link
        seq = client.latest_state().seq
        assert wait_for(lambda: (controller.robot_state() or client.latest_state()).seq > seq, 3)
        assert controller.devices()["robot"] == DeviceStatus(
            "robot", "connected", "ideal (virtual lab)"
        )
        # a new session: the agent dropped our control with the old one; nothing moves until
        # we take it again
        assert client.epoch == 1
        with pytest.raises(DeviceError, match="reconnected as a new session.*take control"):
            client.command_position(q)
        client.take_control()
        client.command_position(q)
        assert wait_for(lambda: client.latest_status()["mode"] == "command", 3.0)
    finally:
        controller.shutdown()
    assert lab.terminated == 1  # closing the session stops the lab, as before


def test_a_streaming_motion_ends_as_an_error_naming_the_drop(robot: Robot) -> None:
    from app.workflows.record import plan_motion, play_motion

    client = robot.client(stale_timeout_s=1.0, reconnect=True)
    try:
        motion = plan_motion(client, "chirp", duration=6.0, amplitude=0.05, velocity=0.2)
        t0 = time.monotonic()

        def stall(_: Any) -> None:
            if time.monotonic() - t0 > 0.5 and not robot.link.frozen and client.epoch == 0:
                robot.link.freeze(2.0)

        with pytest.raises(DeviceError, match=r"link lost \(no data for 1.0 s\)"):
            run_to_end(play_motion(client, motion, pre_s=0.1, post_s=0.1), stall)
        assert time.monotonic() - t0 < 6.0  # it ended at the drop, not after the motion
        assert wait_for(lambda: client.link_state == "connected", 10.0)  # then reconnected
        assert wait_for(lambda: robot.agent.mode in ("stopped", "idle"), 3.0)  # robot held
        with pytest.raises(DeviceError, match="take control"):
            client.command(motion.mode, motion.at(0.0))  # the motion does not resume
    finally:
        client.close()


def test_robot_and_camera_rows_go_stale_within_2_s_and_recover(robot: Robot, tmp_path: Any) -> None:
    from app.robot_link import AgentLink

    client = robot.client(stale_timeout_s=8.0, reconnect=True)
    controller = AppController(config=tmp_path / "config")
    controller.attach_robot(AgentLink(client, f"127.0.0.1:{robot.link.port}"), detail="ideal")
    frames: list[int] = []
    stop = threading.Event()

    def watch_camera() -> None:  # a live preview: frames pulled as they come
        it = client.camera_frames("synthetic", timeout_s=20.0)
        try:
            for f in it:
                frames.append(f.index)
                if stop.is_set():
                    break
        except DeviceError:
            pass
        finally:
            it.close()

    viewer = threading.Thread(target=watch_camera, name="test-camera-viewer")
    viewer.start()
    try:
        assert wait_for(lambda: len(frames) > 5, 5.0)
        controller.poll_devices()
        assert controller.devices()["camera"].state == "connected"
        assert "streaming synthetic" in controller.devices()["camera"].detail
        robot.link.freeze(3.5)
        t0 = time.monotonic()
        first: dict[str, float] = {}
        while time.monotonic() - t0 < 3.4 and len(first) < 2:
            controller.poll_devices()
            for name in ("robot", "camera"):
                if controller.devices()[name].state == "stale" and name not in first:
                    first[name] = time.monotonic() - t0
            time.sleep(0.05)
        assert set(first) == {"robot", "camera"}, controller.devices()
        assert 1.5 < first["robot"] < 3.0 and 1.5 < first["camera"] < 3.0, first
        assert "no state for" in controller.devices()["robot"].detail
        assert "no frames from 'synthetic'" in controller.devices()["camera"].detail

        def recovered() -> bool:
            controller.poll_devices()
            d = controller.devices()
            return d["robot"].state == "connected" and d["camera"].state == "connected"

        assert wait_for(recovered, 6.0, 0.05), controller.devices()
        assert client.epoch == 0  # no reconnect was needed: the link rode it out
    finally:
        stop.set()
        viewer.join(timeout=5.0)
        controller.shutdown()
