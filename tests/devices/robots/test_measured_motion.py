"""The envelope's limits on what the lab robot DOES: bench safety's random position
sequences (seed 10), which drove the measured wrist to 1.10-1.14x its speed limit when the
governors snapped targets back onto the joints (the big joints braked at full force and
flung the wrist). Judged on the measured state, with bench safety's own targets: over real
TCP against `lab serve`, and replayed deterministically (agent and MuJoCo lab stepped by
hand, no threads), where the old envelope reproducibly reached 1.08x."""

from __future__ import annotations

import time

import numpy as np
import pytest

from devices.lab.driver import LabDriver
from devices.lab.sim import LabSim
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.lab import LAB_WORKSPACE
from devices.robots.agent.launch import start_lab_process
from devices.robots.agent.safety_config import SafetyConfig
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.client import RobotClient
from tests.devices.robots.helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

READY = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


def _bench_position_sequences(lo: np.ndarray, hi: np.ndarray, vmax: np.ndarray) -> list:
    """bench safety's random sequences 0 and 9 (position mode), drawn as the bench does."""
    rng = np.random.default_rng(10)
    out = []
    for k in range(12):
        mode = ("position", "velocity", "torque")[k % 3]
        xs = []
        for _ in range(6):
            if mode == "position":
                xs.append(rng.uniform(lo - 0.3, hi + 0.3))
            elif mode == "velocity":
                xs.append(rng.uniform(-2, 2, 7) * vmax)
            else:
                xs.append(rng.uniform(-1, 1, 7))  # torque: only the draws matter here
        if k in (0, 9):
            out.append(xs)
    return out


def test_random_position_sequences_keep_measured_speed_and_position_limits() -> None:
    with start_lab_process("panda_table", extra_args=["--no-cameras"]) as lab:
        with RobotClient(lab.host, lab.port, lab.token) as c:
            assert c.info is not None
            lim = c.info.limits
            vmax, lo, hi = (np.asarray(x, float) for x in (lim.velocity, lim.lower, lim.upper))
            for seq in _bench_position_sequences(lo, hi, vmax):
                c.take_control()

                def at_ready() -> bool:
                    c.command_position(READY)
                    s = c.latest_state()
                    return bool(
                        np.abs(s.joint_pos - READY).max() < 0.02
                        and np.abs(s.joint_vel).max() < 0.05
                    )

                assert wait_for(at_ready, 15.0, every_s=0.01)
                rec: list[dict] = []
                c._recorders.append(rec)  # noqa: SLF001 - the raw measured stream
                for x in seq:
                    end = time.monotonic() + 0.3
                    while time.monotonic() < end:
                        c.command_position(x)
                        time.sleep(0.005)
                c._recorders.remove(rec)  # noqa: SLF001
                q = np.array([m["joint_pos"] for m in rec])
                v = np.array([m["joint_vel"] for m in rec])
                assert len(rec) > 300
                ratio = np.abs(v) / vmax
                assert ratio.max() <= 1.05, ratio.max(axis=0)
                assert np.max(np.maximum(q - hi, lo - q)) <= 0.005
                # and it still moves: the joints reach most of their governed speed
                assert ratio.max() > 0.8


class _SteppedDriver(LabDriver):
    """The lab driver without its physics thread: the test steps the sim itself."""

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_random_position_sequence_replayed_deterministically() -> None:
    """Agent ticks and lab physics interleaved by hand (one tick per 4 ms control period,
    two 2 ms physics steps), so the outcome does not depend on the machine's load."""
    sim = LabSim("panda_table")
    safety = SafetyConfig(
        workspace_lower=LAB_WORKSPACE["lower"], workspace_upper=LAB_WORKSPACE["upper"]
    )
    agent = Agent(
        _SteppedDriver(sim),
        safety=safety,
        watchdog=WatchdogConfig(heartbeat_timeout_s=1e3, command_timeout_s=1e3),
    )
    agent.start(thread=False)
    lim = agent.info.limits
    vmax, lo, hi = (np.asarray(x, float) for x in (lim.velocity, lim.lower, lim.upper))
    per_tick = int(round(agent.dt / sim.dt))

    def tick(target: np.ndarray) -> None:
        agent.heartbeat()
        agent.command("position", target)
        agent.tick()
        sim.step(per_tick)

    for _ in range(int(6.0 / agent.dt)):
        tick(READY)
        s = sim.read_state()
        if np.abs(s.joint_pos - READY).max() < 0.02 and np.abs(s.joint_vel).max() < 0.05:
            break
    qs, vs = [], []
    for x in _bench_position_sequences(lo, hi, vmax)[1]:  # sequence 9
        for _ in range(int(0.3 / agent.dt)):
            tick(x)
            s = sim.read_state()
            qs.append(s.joint_pos)
            vs.append(s.joint_vel)
    q, v = np.array(qs), np.array(vs)
    ratio = np.abs(v) / vmax
    assert agent.stop_reason is None
    assert ratio.max() <= 1.05, ratio.max(axis=0)
    assert np.max(np.maximum(q - hi, lo - q)) <= 0.005
    assert ratio.max() > 0.8  # it still moves
