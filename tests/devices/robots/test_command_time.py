"""`command_time`: when the robot's controller received each command. The agent stamps it on
the state message after writing (PROTOCOL.md); the lab reports the step a command arrived at,
and its controller starts using it exactly the lab's latency later. Agent ticks and lab
physics are interleaved by hand, with the physics sometimes one 2 ms step ahead of the
agent's write (what a loaded machine does), so the jitter is known exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from devices.lab.driver import LabDriver
from devices.lab.sim import LabSim
from devices.robots.agent.control import Agent
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.wire import protocol as P
from devices.robots.wire.robot_types import RobotState


class _LoggedSim(LabSim):
    """The lab, logging which reference its controller used at every physics step."""

    def __init__(self, scene: str) -> None:
        self.used: list[tuple[float, np.ndarray]] = []
        super().__init__(scene)

    def _control(self) -> None:
        super()._control()
        self.used.append((self.time, self._ref.copy()))


class _JitteryDriver(LabDriver):
    """No physics thread; on a late tick the lab steps once between the agent's state read
    and its command write, as the real-time lab thread sometimes does."""

    late = False

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def write_command(self, mode: Any, values: np.ndarray) -> None:
        if self.late:
            self.sim.step()
        super().write_command(mode, values)


def test_agent_stamps_when_the_lab_received_each_command() -> None:
    sim = _LoggedSim("panda_table")
    drv = _JitteryDriver(sim)
    agent = Agent(drv, watchdog=WatchdogConfig(heartbeat_timeout_s=1e3, command_timeout_s=1e3))
    agent.start(thread=False)
    msgs: list[dict[str, Any]] = []
    agent.add_state_listener(
        lambda seq, st, cmd, mode, status: msgs.append(P.state_message(st, cmd, mode, status))
    )
    per_tick = int(round(agent.dt / sim.dt))
    assert per_tick == 2
    rng = np.random.default_rng(3)
    late = rng.random(120) < 0.3
    q0 = sim.read_state().joint_pos.copy()
    for k, is_late in enumerate(late):
        target = q0.copy()
        target[0] += 0.002 * (k + 1)  # every command distinct: its first use is findable
        drv.late = bool(is_late)
        agent.heartbeat()
        agent.command("position", target)
        agent.tick()
        sim.step(per_tick - int(is_late))
    sim.step(10)
    delay = P.command_delay(msgs)
    assert delay is not None and delay.shape == (len(msgs), 1)
    # the late writes arrive one physics step after the state they were decided on
    assert delay[:, 0] == pytest.approx(np.where(late, sim.dt, 0.0), abs=1e-9)
    used_t = np.array([u[0] for u in sim.used])
    used_ref = np.array([u[1][0] for u in sim.used])
    lat = sim.config.latency_s
    for m in msgs:
        first = used_t[np.flatnonzero(np.abs(used_ref - m["command"][0]) < 1e-12)[0]]
        # the controller starts using it exactly the lab's latency after it arrived
        assert first == pytest.approx(m["command_time"] + lat, abs=1e-9)


def test_state_messages_without_command_time_still_parse() -> None:
    z = np.zeros(3)
    st = RobotState(0.5, 7, z, z, z, command_time=0.502)
    msg = P.state_message(st, z + 1, "command", {})
    assert P.state_from_message(msg).command_time == pytest.approx(0.502)
    old = {k: v for k, v in msg.items() if k != "command_time"}  # an older agent's message
    assert P.state_from_message(old).command_time is None
    assert P.command_delay([msg])[0, 0] == pytest.approx(0.002)  # type: ignore[index]
    assert P.command_delay([msg, {**old, "t": 0.504}]) is None  # cannot say: no channel
    idle = {**old, "t": 0.508, "command": None}  # no command sent: nothing to time
    assert np.isnan(P.command_delay([msg, idle])[1, 0])  # type: ignore[index]
