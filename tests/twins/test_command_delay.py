"""A recording that says when each command reached the robot's controller
(`robot/command_delay`) is replayed with each command from then: jittered command timing no
longer shows up as a model error. Truth: the same twin driven by the commands switching at
the known jittered times, given on the physics-step grid (one command row per step)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from devices.trajectory import COMMAND_DELAY, Trajectory
from twins.fit.objective import _replay_window, _Worlds, windows
from twins.from_scan import PANDA, robot_into
from twins.make import assemble, sim_params
from twins.simulate import replay

DT = 0.002  # physics step (the lab's)
RATE = 250.0  # commands, one per sample
ARM = [f"panda_joint{i}" for i in range(1, 8)]
Q0 = (0.0, -0.6, 0.0, -2.2, 0.0, 1.6, 0.8, 0.02, 0.02)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = Path(tmp_path_factory.mktemp("delay"))
    robot = robot_into(tmp, PANDA, actuator="pd", initial_joint_pos=Q0, time_step=DT)[:2]
    s = assemble("delay", robot, ground=True, sim=sim_params(), base_dir=tmp)
    gains = {f"robot.actuators.{j}.{k}": v for j in ARM for k, v in (("kp", 600.0), ("kd", 40.0))}
    gains.update({f"robot.actuators.{j}.gravity_compensation": 1.0 for j in ARM})
    return s.with_values({**gains, "sim.time_step": DT})


def _recording(seconds: float = 0.8, seed: int = 5) -> tuple[Trajectory, Trajectory]:
    """(recording at 250 Hz with its delay channel, the same commands one row per physics
    step at the times they took effect). 30 % of the commands arrive one step late."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds, 1.0 / RATE)
    U = np.tile(np.asarray(Q0[:7]), (len(t), 1))
    for j in range(4):
        U[:, j] += 0.15 * np.sin(2 * np.pi * (1.5 + 0.4 * j) * t + rng.uniform(0, 6))
    d = np.where(rng.random(len(t)) < 0.3, DT, 0.0)
    d[0] = 0.0
    q = np.tile(np.asarray(Q0[:7]), (len(t), 1))
    units = {"robot/command": "rad", "robot/joint_pos": "rad", COMMAND_DELAY: "s"}
    meta = {"joint_names": ARM, "command_joints": ARM}
    rec = Trajectory(
        t, {"robot/command": U, "robot/joint_pos": q, COMMAND_DELAY: d}, units, "real", meta
    )
    ts = np.arange(0.0, t[-1] + DT / 2, DT)
    row = np.searchsorted(t + d, ts + 1e-9, side="right") - 1  # the command in force
    fine_q = np.tile(np.asarray(Q0[:7]), (len(ts), 1))
    fine = Trajectory(ts, {"robot/command": U[row], "robot/joint_pos": fine_q}, units, "real", meta)
    return rec, fine


def _at(sim: Trajectory, t: np.ndarray) -> np.ndarray:
    k = np.rint(np.asarray(t) / DT).astype(int)
    ks = np.rint(sim.t / DT).astype(int)
    return sim["robot/joint_pos"][np.searchsorted(ks, k)][:, :4]


def test_replay_applies_each_command_when_it_took_effect(spec) -> None:  # type: ignore[no-untyped-def]
    rec, fine = _recording()
    truth = _at(replay(spec, None, fine), rec.t)
    honoured = replay(spec, None, rec)["robot/joint_pos"][:, :4]
    plain = rec.with_channels(
        channels={k: v for k, v in rec.channels.items() if k != COMMAND_DELAY}
    )
    ignored = replay(spec, None, plain)["robot/joint_pos"][:, :4]
    err_on, err_off = (float(np.abs(x - truth).max()) for x in (honoured, ignored))
    assert err_on < 1e-6
    assert err_off > 1e-4  # the premise: 2 ms of jitter is visible
    assert err_off > 100 * err_on


def test_fit_windows_honour_it_with_latency(spec) -> None:  # type: ignore[no-untyped-def]
    """The fit's windows (commands before each window kept for the latency) and its replay
    of a window with the latency precomputed on the step grid."""
    rec, fine = _recording()
    lat = {f"robot.actuators.{j}.latency": 0.004 for j in ARM}
    values = spec.params.validate({**spec.params.nominal(), **lat})
    win = windows(rec, 0.4, lead_s=0.02)
    fwin = windows(fine, 0.4, lead_s=0.02)
    assert len(win) == len(fwin) == 2
    # the lead commands are timed by when they took effect, relative to the window start
    before = (rec.t >= 0.4 - 0.02 - 1e-9) & (rec.t < win[1].meta["window_start_s"])
    want = rec.t[before] + rec[COMMAND_DELAY][before, 0] - win[1].meta["window_start_s"]
    assert win[1].meta["command_before_t"] == pytest.approx(want.tolist(), abs=1e-12)
    with _Worlds(spec, values) as worlds:
        for w, fw in zip(win, fwin, strict=True):
            fw = fw.with_channels(  # the same initial state (windows re-fit it from samples)
                channels={
                    **fw.channels,
                    "robot/joint_pos": np.repeat(w["robot/joint_pos"][:1], len(fw.t), 0),
                }
            )
            truth = _at(_replay_window(worlds, values, fw), w.t)
            got = _replay_window(worlds, values, w)["robot/joint_pos"][:, :4]
            assert float(np.abs(got - truth).max()) < 1e-6
