"""`python main.py lab serve` end to end: the MuJoCo lab as a robot + camera server,
reached only through the protocol (like real hardware)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from devices.robots.client import RobotClient
from devices.robots.launch import start_lab_process
from tests.devices.robots.helpers import constant_policy, wait_for

pytestmark = pytest.mark.slow


def test_lab_serve_robot_policy_and_camera() -> None:
    with start_lab_process("panda_table", camera_size="424x240", camera_fps=15) as lab:
        with RobotClient(lab.host, lab.port, lab.token) as c:
            info = c.info
            assert info is not None and info.name == "lab/panda_table"
            assert len(info.joint_names) == 7 and set(info.cameras) == {"fixed", "wrist"}
            assert not any(k in str(info.to_dict()) for k in ("mass", "friction", "damping"))
            traj = c.stream(0.5)
            assert abs(traj.meta["rate_hz"] - info.control_rate_hz) < 0.15 * info.control_rate_hz
            q0 = c.latest_state().joint_pos.copy()
            target = q0.copy()
            target[0] += 0.1
            c.command_position(target)
            assert wait_for(lambda: abs(c.latest_state().joint_pos[0] - target[0]) < 0.01, 3.0)
            # a policy that goes back home, ramped in from where the arm is now
            c.upload_policy(constant_policy(7, q0), {"observation": ["joint_pos", "joint_vel"]})
            c.run_policy(ramp_s=0.3)
            ok = wait_for(lambda: abs(c.latest_state().joint_pos[0] - q0[0]) < 0.01, 3.0)
            assert ok, (c.latest_status(), list(c.events))
            assert c.latest_status()["mode"] == "policy"
            c.stop()
            assert wait_for(lambda: c.latest_status()["mode"] == "stopped", 1.0)
            frames = c.camera_frames("fixed", timeout_s=60.0)
            f1, f2 = next(frames), next(frames)
            frames.close()
            assert f1.color.shape == (240, 424, 3) and f1.depth.shape == (240, 424)
            assert f1.intrinsics.fx == pytest.approx(920 * 240 / 720, rel=1e-6)
            assert f1.depth_scale == 0.001 and f2.index > f1.index
            assert np.mean(f1.depth > 0) > 0.5
            z = f1.depth_m[f1.depth > 0]
            assert 0.2 < float(np.median(z)) < 3.0  # a table about a metre away
            # the controlling client vanishes while commanding: the lab stops the arm
            c.command_position(c.latest_state().joint_pos)
        with RobotClient(lab.host, lab.port, lab.token) as watcher:
            time.sleep(0.1)
            assert watcher.latest_status()["mode"] == "stopped"
        assert lab.terminate() == 0
        assert "robot held" in lab.tail()


def test_lab_process_stops_when_its_parent_dies(tmp_path) -> None:
    import os
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import os\n"
        "from devices.robots.launch import start_lab_process\n"
        "lab = start_lab_process('pendulum', extra_args=['--no-cameras'])\n"
        "print(lab.proc.pid, flush=True)\n"
        "os._exit(0)\n"
    )  # dies without terminating the lab
    from devices.robots.launch import REPO_ROOT

    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    pid = int(out.stdout.split()[-1])

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:  # a zombie counts as gone
            return f.read().split()[2] == "Z"

    assert wait_for(gone, 10.0, 0.05)
