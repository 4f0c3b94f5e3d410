"""Actuated joints a command leaves out are held by their own controller, as a robot holds a
joint nobody moves: the Panda's fingers stay where they were while the arm swings, and
the joint damping fitted against the lab (which has no finger play) is not skewed by them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from devices.trajectory import Trajectory
from twins.from_scan import PANDA, robot_into
from twins.make import assemble, sim_params
from twins.simulate import replay

ARM = [f"panda_joint{i}" for i in range(1, 8)]
FINGERS = ["panda_finger_joint1", "panda_finger_joint2"]
Q0 = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785, 0.02, 0.02)


@pytest.mark.parametrize("actuator", ["pd", "servo"])
def test_uncommanded_fingers_hold_while_the_arm_turns(tmp_path: Path, actuator: str) -> None:
    dt = 0.002  # the PD's default gains are made for the step they run at
    robot = robot_into(tmp_path, PANDA, actuator=actuator, initial_joint_pos=Q0, time_step=dt)[:2]
    spec = assemble("held", robot, ground=True, sim=sim_params(), base_dir=tmp_path)
    t = np.arange(0.0, 1.5, 0.004)
    U = np.tile(np.asarray(Q0[:7]), (len(t), 1))
    U[:, 0] += 0.2 * np.sin(2 * np.pi * 1.2 * t)  # the base swings the hand (1.5 rad/s)
    U[:, 2] += 0.2 * np.sin(2 * np.pi * 1.5 * t)
    cmd = Trajectory(
        t, {"robot/command": U}, {"robot/command": "rad"}, meta={"command_joints": ARM}
    )
    sim = replay(spec, {"sim.time_step": dt}, cmd)
    names = list(sim.meta["joint_names"])
    q = sim["robot/joint_pos"]
    arm_swing = np.ptp(q[:, names.index(ARM[0])])
    fingers = q[:, [names.index(f) for f in FINGERS]]
    assert arm_swing > 0.35  # the premise: the arm really turned
    # the default finger PD is a 2250 N/m spring: ~1 mm under the hand's accelerations;
    # left free, the fingers slid 20 mm to their stops even with the arm at rest
    assert np.abs(fingers - 0.02).max() < 2e-3, (
        f"fingers moved to {fingers.min():.4f}-{fingers.max():.4f} m"
    )
    assert sim["robot/command"].shape[1] == 7  # the command stays what was sent


@pytest.mark.slow
def test_damping_behind_the_pd_fits_the_lab_once_the_fingers_hold(tmp_path: Path) -> None:
    # Noise-free lab multisine (MuJoCo, fingers fixed there), replayed in the lab twin with
    # every other parameter at the lab's truth: the joint-angle error is smallest at the
    # lab's own damping of joint 3 (the joint that turns the hand about the upper arm; with
    # the fingers free it was smallest at 0.81x the truth).
    from benches.fit_lab import RATE_HZ, joint_names, lab_twin, multisine
    from devices.lab.scenes import get_scene
    from devices.lab.sim import LabSim
    from twins.fit.objective import replay_rmse

    cfg = get_scene("panda_table").default_config()
    cfg = replace(cfg, joint_pos_noise=0.0, joint_vel_noise=0.0, effort_noise=0.0)
    lab = LabSim(cfg.scene, cfg)
    q0 = np.asarray(cfg.initial_joint_pos)
    t_cmd, U = multisine(q0, 1, 3.0)
    per = int(round(1.0 / RATE_HZ / lab.dt))
    lab.write_command("position", q0)
    lab.run_for(0.8)
    t0, rows = lab.time, []
    for k in range(len(t_cmd) + 100):
        s = lab.read_state()
        u = U[min(k, len(U) - 1)]
        rows.append((lab.time - t0, s.joint_pos, s.joint_vel, u))
        lab.write_command("position", u)
        lab.step(per)
    names = joint_names(cfg)
    rec = Trajectory(
        np.array([r[0] for r in rows]),
        {
            "robot/joint_pos": np.array([r[1] for r in rows]),
            "robot/joint_vel": np.array([r[2] for r in rows]),
            "robot/command": np.array([r[3] for r in rows]),
        },
        {"robot/joint_pos": "rad", "robot/joint_vel": "rad/s", "robot/command": "rad"},
        "real",
        {"joint_names": names, "command_joints": names},
    )
    spec = lab_twin(tmp_path, cfg)
    truth = {f"robot.actuators.{n}.latency": cfg.latency_s for n in names}
    for i, n in enumerate(names):
        truth[f"robot.joints.{n}.damping"] = cfg.joints.damping[i]
        truth[f"robot.joints.{n}.friction"] = cfg.joints.frictionloss[i]
    key, true = f"robot.joints.{names[2]}.damping", cfg.joints.damping[2]
    scale = np.array([0.8, 1.0, 1.2])
    err = [
        replay_rmse(spec, [rec], 0.5, {**truth, key: true * s}, ("robot/joint_pos",))[
            "robot/joint_pos"
        ]
        for s in scale
    ]
    a, b, _ = np.polyfit(scale, err, 2)
    assert a > 0  # a minimum, not a maximum
    assert -b / (2 * a) == pytest.approx(1.0, abs=0.05)
