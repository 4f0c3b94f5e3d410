"""Starting the lab as a process leaves nothing behind: its token folder is gone as soon as
it serves (a crash of the workbench cannot strand secrets in /tmp), and the lab still
accepts the token it was started with."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.robots.agent.launch import start_lab_process
from devices.robots.client import RobotClient

pytestmark = pytest.mark.slow


def test_token_folder_removed_once_serving() -> None:
    with start_lab_process("pendulum") as lab:
        folder = Path(lab._token_dir.name)
        assert not folder.exists(), f"{folder} left behind"
        with RobotClient(lab.host, lab.port, lab.token) as robot:
            assert robot.latest_state(timeout_s=10.0) is not None
