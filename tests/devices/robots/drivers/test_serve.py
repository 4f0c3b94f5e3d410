"""`python -m devices.robots.agent.serve` (the agent's module entry point) in front of an emulated
servo arm: the workbench's RobotClient connects exactly as to the lab, gets the
robot-description bundle in get_info, moves the arm inside the envelope, and a stop holds it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from devices.robots.agent.launch import REPO_ROOT, start_agent_process
from devices.robots.client import RobotClient
from devices.robots.wire.auth import write_token_file


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["feetech", "dynamixel"])
def test_agent_serve_emulated_servo_arm(driver: str) -> None:
    with start_agent_process(driver, ["--emulate", "--rate", "100"], timeout_s=30) as proc:
        with RobotClient(proc.host, proc.port, proc.token) as c:
            assert c.info is not None
            info = c.info
            bundle = info.meta["bundle"]
            assert bundle["urdf"].count("<joint ") == 6
            assert [j["name"] for j in bundle["calibration"]["joints"]] == list(info.joint_names)
            np.testing.assert_allclose(bundle["limits"]["lower"], info.limits.lower)
            assert info.meta["driver"] == driver and info.control_rate_hz == 100.0
            c.take_control()
            target = np.array([0.3, -0.3, 0.3, -0.3, 0.3, 0.3])
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                c.command_position(target)
                time.sleep(0.02)
            q = c.latest_state().joint_pos
            np.testing.assert_allclose(q, target, atol=0.02, err_msg=proc.tail())
            c.stop("test stop")
            time.sleep(0.3)
            q1 = c.latest_state().joint_pos
            time.sleep(0.3)
            np.testing.assert_allclose(c.latest_state().joint_pos, q1, atol=2e-3)
            assert c.status()["mode"] == "stopped"
        assert proc.terminate() == 0
        assert "robot held" in proc.tail()


def test_agent_serve_refuses_a_servo_arm_without_calibration() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "devices.robots.agent.serve",
            "--driver",
            "feetech",
            "--device",
            "/dev/null",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"TWINBENCH_TOKEN": "x" * 32, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2
    assert "--calibration" in out.stderr


@pytest.mark.slow
def test_agent_describe_saves_the_bundle_of_a_served_arm(tmp_path: Path) -> None:
    with start_agent_process("dynamixel", ["--emulate"], timeout_s=30) as proc:
        token_file = tmp_path / "token"
        write_token_file(token_file, proc.token)
        out = subprocess.run(
            [
                sys.executable,
                "main.py",
                "agent",
                "describe",
                "--host",
                proc.host,
                "--port",
                str(proc.port),
                "--token-file",
                str(token_file),
                "--out",
                str(tmp_path / "koch"),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 0, out.stderr
    urdf = (tmp_path / "koch" / "koch.urdf").read_text()
    assert urdf.count('type="revolute"') == 6
    cal = json.loads((tmp_path / "koch" / "calibration.json").read_text())
    assert [j["id"] for j in cal["joints"]] == [1, 2, 3, 4, 5, 6]
