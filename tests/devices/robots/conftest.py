from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.ideal import IdealDriver
from devices.robots.agent.server import RobotServer
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.wire.auth import new_token
from tests.devices.robots.helpers import synthetic_frames

OUR_THREADS = ("robot-", "twinbench-", "ideal-driver", "camera-")


@dataclass
class Rig:
    driver: IdealDriver
    agent: Agent
    server: RobotServer
    token: str

    @property
    def port(self) -> int:
        return self.server.port


def _leftover_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(OUR_THREADS)]


@pytest.fixture
def rig() -> Iterator[Rig]:
    """Ideal driver + agent + server on a free loopback port (a synthetic camera too)."""
    driver = IdealDriver()
    driver.record_commands = True
    agent = Agent(driver, watchdog=WatchdogConfig(heartbeat_timeout_s=0.2))
    agent.start()
    token = new_token()
    server = RobotServer(agent, token, cameras={"synthetic": synthetic_frames}, hello_timeout_s=0.5)
    server.start()
    try:
        yield Rig(driver, agent, server, token)
    finally:
        try:
            server.close()
        finally:
            agent.close()
        end = time.monotonic() + 3.0
        while _leftover_threads() and time.monotonic() < end:
            time.sleep(0.02)
        assert not _leftover_threads(), f"threads left running: {_leftover_threads()}"
