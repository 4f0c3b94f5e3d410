"""The Calibrate page's preview project: the procedural Panda twin and a 5 s recording of
the Panda with 3 objects, made with the twin at other parameter values (the arm sweeps while
the box and the cylinder drop onto the table), so there is something to tune by eye without
a robot. The window's preview (widgets/calibrate_draw.demo_project) makes it, and so does
`bench calibrate` for the project it tunes in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.workflows.twin import build_twin, load_twin
from devices.trajectory import Trajectory
from resources.jobs import run_to_end
from resources.project import Project
from twins.simulate import replay

# the "real" values of the recording (the twin starts at its nominals)
TRUTH = {
    "robot.actuators.panda_joint1.latency": 0.04,
    "robot.actuators.panda_joint2.bandwidth": 12.0,
    "objects.box.friction": 0.35,
    "objects.cylinder.restitution": 0.5,
}


def panda_recording(spec: Any, duration_s: float = 5.0, rate_hz: float = 100.0) -> Trajectory:
    """A `duration_s` recording of the Panda twin with its objects, simulated at TRUTH:
    joints 1, 2 and 4 sweep; the box and the cylinder start 5 cm up, tilted, and drop."""

    t = np.arange(0.0, duration_s + 1e-9, 1.0 / rate_hz)
    q0 = np.asarray(spec.robot.initial_joint_pos, float)
    q = np.repeat(q0[None, :], len(t), axis=0)
    ramp = np.minimum(1.0, t / 1.0)
    q[:, 0] += 0.5 * ramp * np.sin(2 * np.pi * 0.3 * t)
    q[:, 1] += 0.3 * ramp * np.sin(2 * np.pi * 0.5 * t)
    q[:, 3] += 0.3 * ramp * np.sin(2 * np.pi * 0.4 * t + 1.0)
    chans: dict[str, Any] = {"robot/command": q}
    units = {"robot/command": "rad"}
    tilt = np.array([np.sin(0.15), 0.0, 0.0, np.cos(0.15)])
    for o in spec.objects:
        pose = np.array(o.pose, float)
        if o.name in ("box", "cylinder"):
            pose[2] += 0.05
            pose[3:] = tilt
        chans[f"objects/{o.name}/pose"] = np.repeat(pose[None, :], len(t), axis=0)
        units[f"objects/{o.name}/pose"] = "xyz_m+quat_xyzw"
    cmd = Trajectory(t, chans, units)
    sim = replay(spec, {**spec.params.nominal(), **TRUTH}, cmd)
    meta = {
        "name": "panda-3-objects",
        "robot": "panda (twin at other values)",
        "joint_names": [j.name for j in spec.robot.joints],
        "command_joints": list(sim.meta.get("command_joints", [])),
    }
    return Trajectory(sim.t, dict(sim.channels), dict(sim.units), "real", meta)


def make_project(root: Path, name: str = "calibrate preview") -> tuple[Project, str, str]:
    """A project with the procedural Panda twin and the 5 s recording; (project, twin id,
    trajectory id)."""

    proj = Project.create(root, name)
    tid = run_to_end(build_twin(proj, None, procedural=True, name="demo twin"))
    _, spec = load_twin(proj, tid)
    traj = panda_recording(spec)
    with proj.new_artifact(
        "trajectory",
        settings={"robot": "panda"},
        summary=f"Panda + 3 objects, {traj.duration:.0f} s (twin at other values)",
    ) as folder:
        traj.save(folder)
    return proj, tid, proj.artifacts("trajectory")[-1].id
