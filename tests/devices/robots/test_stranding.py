"""A robot that ended up outside the safe set (past a joint limit, out of the workspace box)
is never stranded: over real TCP, a command back towards the safe set moves it back."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.ideal import PANDA_UPPER, IdealDriver
from devices.robots.agent.server import RobotServer
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.client import RobotClient
from devices.robots.wire.auth import new_token
from tests.devices.robots.helpers import wait_for


@pytest.fixture
def outside() -> Iterator[tuple[Agent, RobotServer, str]]:
    """The toy arm standing straight up: end effector 0.3 m above the box, joint 4 past
    its upper limit."""
    initial = np.zeros(7)
    initial[3] = PANDA_UPPER[3] + 0.02
    driver = IdealDriver(initial=initial)
    agent = Agent(driver, watchdog=WatchdogConfig(heartbeat_timeout_s=0.5))
    agent.start()
    token = new_token()
    server = RobotServer(agent, token)
    server.start()
    try:
        yield agent, server, token
    finally:
        server.close()
        agent.close()


def test_command_back_towards_the_safe_set_moves_the_robot(outside) -> None:
    agent, server, token = outside
    env = agent.envelope
    with RobotClient("127.0.0.1", server.port, token) as c:
        s0 = c.latest_state()
        d0 = env.box_distance(s0.joint_pos)
        assert d0 > 0.1 and s0.joint_pos[3] > PANDA_UPPER[3]
        # a pose inside the box, reached along a joint path that only approaches the box
        # (the path to HOME leaves the box corner: that command is refused near the edge)
        home = np.array([0.0, 0.3, 0.0, -1.8, 0.0, 0.5, 0.0])

        def back_in(pred) -> bool:  # the client keeps sending its target, as clients do
            def step() -> bool:
                c.command_position(home)
                return bool(pred())

            return wait_for(step, 20.0, every_s=0.01)

        assert back_in(lambda: env.box_distance(c.latest_state().joint_pos) < d0 - 0.05)
        assert back_in(lambda: env.box_distance(c.latest_state().joint_pos) == 0.0)
        assert back_in(lambda: c.latest_state().joint_pos[3] < PANDA_UPPER[3])
        assert c.latest_status()["mode"] == "command"
        assert agent.stop_reason is None
