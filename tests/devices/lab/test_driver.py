"""LabDriver: real time on its own thread, thread-safe, clean shutdown."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from devices.lab.config import LabError
from devices.lab.driver import LabDriver, make_driver
from devices.robots.agent.drivers.interface import RobotDriver

pytestmark = pytest.mark.realtime


def test_driver_runs_in_real_time_and_moves() -> None:
    drv = make_driver("panda_table")
    assert isinstance(drv, LabDriver)
    _: RobotDriver = drv  # structural typing holds
    try:
        s0 = drv.read_state()
        q = s0.joint_pos.copy()
        q[0] += 0.2
        drv.write_command("position", q)
        time.sleep(1.5)
        s1 = drv.read_state()
        assert s1.t - s0.t == pytest.approx(1.5, rel=0.15)
        assert s1.seq > s0.seq
        assert s1.joint_pos[0] == pytest.approx(q[0], abs=0.02)
        assert drv.realtime_factor() == pytest.approx(1.0, abs=0.1)
        assert drv.forward_kinematics(s1.joint_pos) == pytest.approx(s1.ee_pos, abs=1e-9)
    finally:
        drv.close()
    assert drv._thread is None
    assert not any(t.name.startswith("lab-") for t in threading.enumerate())


def test_driver_is_thread_safe_and_rejects_bad_commands() -> None:
    with make_driver("pendulum") as drv:
        errors: list[BaseException] = []

        def hammer() -> None:
            try:
                for i in range(300):
                    drv.write_command("torque", np.array([0.1 * np.sin(i)]))
                    drv.read_state()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        s = drv.wait_state(drv.read_state().seq)
        assert np.all(np.isfinite(s.joint_pos))
        with pytest.raises(LabError, match="1 finite"):
            drv.write_command("position", np.array([np.inf]))
        drv.hold()


def test_unknown_scene_is_a_named_error(tmp_path) -> None:
    with pytest.raises(LabError, match="unknown lab scene"):
        make_driver("mars_rover")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LabError, match="bad.json"):
        make_driver("pendulum", bad)
