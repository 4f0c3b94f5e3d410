"""Camera waits of the guided scan sized to the source: the camera's frame rate and the
machine's load set how long the first and the next frame may take; a long wait is reported
while it lasts; a camera that never streams (or stalls) fails with a message naming the
camera, the robot, the time waited and what to do. Driven through the robot client's
interface by an in-process kinematic lab (tests/app/kinematic_lab.py): no `lab serve`."""

from __future__ import annotations

import re

import pytest

from app.workflows import connected_arm as ca
from app.workflows.connected_arm import ConnectedArm, camera_waits, stated_fps
from app.workflows.scan_plan import RobotScanError
from resources.jobs import Progress
from tests.app.kinematic_lab import KinematicLabClient


def test_waits_follow_frame_rate_and_load() -> None:
    fast, slow = camera_waits(30.0, load=0.0), camera_waits(6.0, load=0.0)
    # next frame: 100 frame periods, never under the 15 s scans always allowed
    assert fast.next_s == pytest.approx(15.0)
    assert slow.next_s == pytest.approx(100 / 6.0)
    assert camera_waits(1.0, load=0.0).next_s == pytest.approx(100.0)
    # first frame: the camera's start-up (the lab renderer's 60 s) on top
    assert fast.first_s == pytest.approx(75.0)
    assert slow.first_s == pytest.approx(60.0 + 100 / 6.0)
    assert slow.first_s > fast.first_s > 15.0
    # the load per core stretches both (between 1x and 4x)
    busy = camera_waits(30.0, load=2.5)
    assert (busy.first_s, busy.next_s) == pytest.approx((2.5 * 75.0, 2.5 * 15.0))
    assert camera_waits(30.0, load=9.0).first_s == pytest.approx(4 * 75.0)
    assert camera_waits(30.0, load=0.3).first_s == pytest.approx(75.0)
    # no stated rate: the default is assumed, and said to be
    unknown = camera_waits(None, load=0.0)
    assert unknown.fps == 15.0 and not unknown.fps_stated
    assert "assumed" in unknown.describe() and "assumed" not in fast.describe()
    assert stated_fps({"camera/wrist/fps": 6}, "wrist") == 6.0
    assert stated_fps({"camera/wrist/fps": "x"}, "wrist") is None
    assert stated_fps({}, "wrist") is None


@pytest.mark.slow
def test_slow_camera_start_is_reported_then_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca, "load_per_core", lambda: 0.0)
    client = KinematicLabClient(first_frame_delay_s=4.5, fps=6.0, stated_fps=True)
    arm = ConnectedArm(client.robot())
    try:
        said: list[str] = []
        job = arm.wait_camera()
        for p in job:
            assert isinstance(p, Progress)
            said.append(p.message)
        # the client was asked for the wait sized to the stated 6 fps, not today's 15 s
        ((cam, timeout_s),) = client.subscriptions
        assert cam == "wrist" and timeout_s >= 60.0 + 100 / 6.0
        secs = [int(m) for s in said for m in re.findall(r"\((\d+) s of up to 77 s\)", s)]
        assert said and len(secs) == len(said), said
        assert secs[0] >= 2 and secs == sorted(secs) and secs[-1] >= 3, said
        assert all(s.startswith("waiting for camera 'wrist' frames") for s in said)
        f, q = arm.grab(client.latest_state().t)  # and frames then flow
        assert f.color.shape[:2] == (240, 424) and len(q) == 7
    finally:
        arm.stop()
    assert client.stopped == ["scan finished"]


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m is not None, text
    return float(m.group(1))


def _small_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits of seconds: start-up 2 s, next frame 1 s, no load stretch."""
    monkeypatch.setattr(ca, "load_per_core", lambda: 0.0)
    monkeypatch.setattr(ca, "CAMERA_STARTUP_S", 2.0)
    monkeypatch.setattr(ca, "NEXT_FRAME_MIN_S", 1.0)
    monkeypatch.setattr(ca, "LATE_FRAME_PERIODS", 1)


@pytest.mark.slow
def test_camera_that_never_streams_fails_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _small_waits(monkeypatch)
    client = KinematicLabClient(frame_limit=0)
    arm = ConnectedArm(client.robot())
    said: list[str] = []
    try:
        with pytest.raises(RobotScanError) as err:
            for p in arm.wait_camera():
                said.append(p.message)
    finally:
        arm.stop()
    msg = str(err.value)
    assert "camera 'wrist'" in msg and "kinematic-lab:0" in msg, msg
    waited = _number(r"no frame from camera 'wrist' in (\d+) s", msg)
    assert 3.0 <= waited <= 4.0, msg  # 2 s start-up + 1 s
    assert "up to 3 s" in msg and "15 fps assumed" in msg, msg
    assert "Check on the robot's side" in msg and "close heavy programs" in msg, msg
    assert said and said[-1].startswith("waiting for camera 'wrist' frames"), said


@pytest.mark.slow
def test_camera_that_stalls_mid_scan_fails_within_its_next_frame_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _small_waits(monkeypatch)
    client = KinematicLabClient(frame_limit=2)
    arm = ConnectedArm(client.robot())
    try:
        for _ in arm.wait_camera():
            pass
        with pytest.raises(RobotScanError) as err:
            for _ in range(8):
                arm.grab(client.latest_state().t)
    finally:
        arm.stop()
    msg = str(err.value)
    assert "camera 'wrist' stopped sending frames" in msg and "after 2 frames" in msg, msg
    waited = _number(r"none for (\d+) s", msg)
    assert 1.0 <= waited <= 2.0, msg  # the 1 s next-frame wait, not the 3 s first one
    assert "kinematic-lab:0" in msg and "start again" in msg


@pytest.mark.slow
def test_scan_cancelled_while_camera_starts_hands_its_stream_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job stopped before the first frame does not block on the camera's start-up, and
    the next job on the same client takes over its subscription instead of subscribing
    beside it (the client keeps one frame queue per camera)."""
    import time

    monkeypatch.setattr(ca, "load_per_core", lambda: 0.0)
    client = KinematicLabClient(first_frame_delay_s=3.0)
    first = ConnectedArm(client.robot())
    first.prime_camera()
    t0 = time.monotonic()
    first.stop()
    assert time.monotonic() - t0 < 1.0  # not the old 20 s join
    second = ConnectedArm(client.robot())
    try:
        for _ in second.wait_camera():
            pass
        f, _ = second.grab(client.latest_state().t)
        assert f.timestamp >= 3.0
    finally:
        second.stop()
    assert [c for c, _ in client.subscriptions] == ["wrist"]  # one subscription, handed on


@pytest.mark.slow
def test_a_camera_slower_than_the_grab_window_still_gives_still_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A camera at 2 fps (the lab's renderer on a busy machine): a 0.3 s state window that
    starts as a frame arrives never holds the next one, and every try used to fail ("frame
    timestamps never fall inside the state stream"); the window now grows until it does."""
    monkeypatch.setattr(ca, "load_per_core", lambda: 0.0)
    client = KinematicLabClient(fps=2.0)
    arm = ConnectedArm(client.robot())
    try:
        for _ in arm.wait_camera():
            pass
        for _ in range(2):
            f, q = arm.grab(client.latest_state().t)
            assert f.color.shape[:2] == (240, 424)
            assert q == pytest.approx(client.latest_state().joint_pos, abs=1e-3)
        monkeypatch.setattr(ca, "MAX_GRAB_WINDOW_S", 0.3)  # the fixed window of before
        with pytest.raises(RobotScanError, match="never fall inside the state stream"):
            arm.grab(client.latest_state().t)
    finally:
        arm.stop()
