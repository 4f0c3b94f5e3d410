"""Pieces of the lab fit benchmark (benches/fit.py): the lab twin, recording through
the robot protocol, the lab replayed against itself, truth of the fitted parameters.

Benchmarks may read the lab's truth (devices.lab); the app proper never does.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.lab.scenes import get_scene
from devices.lab.sim import LabSim
from twins.from_scan import PANDA, robot_into
from twins.make import assemble, sim_params

ACTIVE = (0, 1, 2, 3)  # joints the excitation moves (the wrist is held still)
RATE_HZ = 250.0
FREQS_HZ = (0.35, 0.8, 1.3)  # multisine components (accelerations stay < 6 rad/s^2)
AMP_RAD = 0.06  # per component
LATENCY_MAX_S = 0.02  # the latency's upper bound in the lab twin (the default is 0.1 s)


def joint_names(cfg: Any) -> list[str]:
    return list(get_scene(cfg.scene).joint_names)


def lab_twin(folder: Path, cfg: Any, time_step: float | None = None) -> Any:
    """A PyBullet twin of the lab Panda (pybullet_data URDF, PD actuators with gravity
    compensation) with what a user knows about their robot set from the lab config:
    controller gains and force limits (they set them), rotor inertias (datasheet), and the
    damping and friction of the wrist joints the excitation holds still (it cannot identify
    them; the held joints swing through coupling, so they must be right). Every
    other physical parameter stays at the URDF's nominal (zero damping and friction, no
    latency) until fitted. Objects are left out: the excitation never touches them.
    The physics step defaults to the lab's (its controller runs every physics step: a twin
    at twice the lab's step is a different discrete controller, which biases the fitted
    latency by about a step)."""
    time_step = float(cfg.timestep) if time_step is None else time_step

    names = joint_names(cfg)
    q0 = tuple(cfg.initial_joint_pos) + (0.02, 0.02)
    robot, params, _ = robot_into(
        folder, PANDA, actuator="pd", initial_joint_pos=q0, time_step=time_step
    )
    spec = assemble("lab-panda", (robot, params), ground=True, sim=sim_params(), base_dir=folder)
    ac, jc = cfg.actuators, cfg.joints
    widened = []
    known: dict[str, float] = {"sim.time_step": time_step}
    for i, n in enumerate(names):
        pre = f"robot.actuators.{n}"
        for key, v in (("kp", ac.kp[i]), ("kd", ac.kv[i])):
            p = spec.params[f"{pre}.{key}"]
            widened.append(replace(p, low=min(p.low, v / 10), high=max(p.high, v * 10)))
            known[f"{pre}.{key}"] = float(v)
        known[f"{pre}.effort_limit"] = float(ac.force_limit[i])
        known[f"{pre}.gravity_compensation"] = 1.0 if ac.gravity_compensation else 0.0
        known[f"robot.joints.{n}.armature"] = float(jc.armature[i])
        if i not in ACTIVE:  # held wrist joints: not excited, so not identifiable here
            known[f"robot.joints.{n}.damping"] = float(jc.damping[i])
            known[f"robot.joints.{n}.friction"] = float(jc.frictionloss[i])
    for n in names:  # a position-controlled arm's command latency is a few ms, not 100
        p = spec.params[f"robot.actuators.{n}.latency"]
        widened.append(replace(p, high=min(p.high, LATENCY_MAX_S)))
    spec = replace(spec, params=spec.params.replace(*widened))
    return spec.with_values(known)


def fitted_truth(cfg: Any) -> dict[str, float]:
    """The lab's true values of the parameters the bench fits (twin names)."""
    names = joint_names(cfg)
    out: dict[str, float] = {}
    for i in ACTIVE:
        out[f"robot.joints.{names[i]}.damping"] = float(cfg.joints.damping[i])
        out[f"robot.joints.{names[i]}.friction"] = float(cfg.joints.frictionloss[i])
    out[f"robot.actuators.{names[0]}.latency"] = float(cfg.latency_s)
    return out


def tied_latency(cfg: Any) -> dict[str, tuple[str, ...]]:
    names = joint_names(cfg)
    lat = [f"robot.actuators.{n}.latency" for n in names]
    return {lat[0]: tuple(lat[1:])}


def multisine(
    q0: NDArray[np.float64], seed: int, seconds: float, joints: tuple[int, ...] = ACTIVE
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Joint targets (t, U) of a random-phase multisine on `joints`, eased in and out."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds, 1.0 / RATE_HZ)
    ease = np.clip(np.minimum(t, seconds - t) / 0.5, 0.0, 1.0)
    ease = 0.5 - 0.5 * np.cos(np.pi * ease)
    U = np.tile(np.asarray(q0, float), (len(t), 1))
    for j in joints:
        phase = rng.uniform(0, 2 * np.pi, len(FREQS_HZ))
        sign = rng.choice((-1.0, 1.0))
        wave = sum(np.sin(2 * np.pi * f * t + p) for f, p in zip(FREQS_HZ, phase, strict=True))
        U[:, j] += sign * AMP_RAD * ease * (wave - wave[0] * ease)
    return t, U


def record(
    client: Any, q0: NDArray[np.float64], t: NDArray[np.float64], U: NDArray[np.float64]
) -> Any:
    """Settle at `q0`, then play (t, U) through the protocol at its own rate while the state
    stream is recorded; returns the recording (time from the first command)."""
    for _ in range(int(0.8 * 50)):
        client.command_position(q0)
        time.sleep(0.02)
    box: dict[str, Any] = {}

    def stream() -> None:
        try:
            box["traj"] = client.stream(float(t[-1]) + 0.6)
        except Exception as exc:  # reported below
            box["error"] = exc

    th = threading.Thread(target=stream, daemon=True)
    th.start()
    time.sleep(0.1)
    start = time.monotonic()
    for k, u in enumerate(U):
        client.command_position(u)
        time.sleep(max(0.0, start + (k + 1) / RATE_HZ - time.monotonic()))
    th.join()
    if "error" in box:
        raise box["error"]
    traj = box["traj"]
    cmd = traj["robot/command"]
    moving = np.flatnonzero(np.any(np.abs(cmd - q0) > 1e-9, axis=1) & np.all(np.isfinite(cmd), 1))
    i0 = max(int(moving[0]) - 25, 0) if moving.size else 0
    i1 = min(int(moving[-1]) + 50, len(traj.t)) if moving.size else len(traj.t)
    part = traj.slice_time(float(traj.t[i0]), float(traj.t[i1 - 1]))
    names = list(traj.meta["joint_names"])
    return part.with_channels(
        t=part.t - part.t[0], meta={**dict(part.meta), "command_joints": names}
    )


def lab_replay(cfg: Any, rec: Any, seed: int) -> Any:
    """The recording's commands replayed in the lab itself (MuJoCo, in process) with
    sensor-noise seed `seed`, from the initial pose: what the lab gives for the same
    commands. Returns the measured joint positions on the recording's timestamps."""

    lab = LabSim(cfg.scene, replace(cfg, seed=seed))
    cmd = rec["robot/command"]
    out = np.empty((len(rec.t), lab.n))
    t0 = lab.time
    for k, tk in enumerate(rec.t):
        while lab.time - t0 < tk - 1e-9:
            lab.step()
        out[k] = lab.read_state().joint_pos
        lab.write_command("position", cmd[k])
    return out
