"""The Franka Panda of the lab: pybullet_data's franka_panda/panda.urdf read by MuJoCo.

The URDF is found without importing pybullet_data (pybullet and its data live in twins/);
`importlib.util.find_spec` only locates the installed files. Conversion (docs/TRAPS.md): strip
`package://`, add `<mujoco><compiler meshdir=… balanceinertia="true"/></mujoco>`; the finger
joints are made fixed (closed gripper = the pusher tool), so the arm has 7 joints. URDF
carries no actuators; scenes.py adds them on the MjSpec.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import mujoco
import numpy as np

from devices.lab.config import LabError
from devices.robots.wire.robot_types import JointLimits

URDF_KEY = "franka_panda/panda.urdf"  # relative to pybullet_data (the twin uses the same)
JOINT_NAMES = tuple(f"panda_joint{i}" for i in range(1, 8))
ROBOT_BODIES = (
    "panda_link0",
    "panda_link1",
    "panda_link2",
    "panda_link3",
    "panda_link4",
    "panda_link5",
    "panda_link6",
    "panda_link7",
    "panda_link8",
    "panda_hand",
    "panda_leftfinger",
    "panda_rightfinger",
    "panda_grasptarget",
)
HAND_BODY = "panda_hand"
TOOL_BODY = "panda_grasptarget"  # 0.105 m past the flange: between the fingertips
READY_POSE = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785)


def urdf_path() -> Path:
    """Path of pybullet_data's Panda URDF (raises LabError if pybullet_data is missing)."""
    spec = importlib.util.find_spec("pybullet_data")
    if spec is None or not spec.submodule_search_locations:
        raise LabError(
            "virtual lab: the pybullet_data package (which ships "
            f"{URDF_KEY}) is not installed; run scripts/setup.sh"
        )
    p = Path(next(iter(spec.submodule_search_locations))) / URDF_KEY
    if not p.exists():
        raise LabError(f"virtual lab: {p} not found in the installed pybullet_data")
    return p


def panda_spec() -> mujoco.MjSpec:
    """The Panda as an MjSpec (base body panda_link0 fixed at the world origin)."""
    p = urdf_path()
    txt = p.read_text().replace("package://", "")
    txt = re.sub(r'(<joint name="panda_finger_joint\d" type=")prismatic', r"\1fixed", txt)
    head = (
        f'<mujoco><compiler meshdir="{p.parent}" balanceinertia="true" '
        'discardvisual="true" fusestatic="false"/></mujoco>'
    )
    txt = re.sub(r"(<robot[^>]*>)", lambda m: m.group(1) + head, txt, count=1)
    try:
        return mujoco.MjSpec.from_string(txt)
    except ValueError as exc:
        raise LabError(f"virtual lab: MuJoCo cannot read {p}: {exc}") from exc


def nominal_limits() -> JointLimits:
    """The datasheet limits of the 7 arm joints, from the URDF (not lab truth)."""
    txt = urdf_path().read_text()
    lo, hi, vel, eff = [], [], [], []
    for name in JOINT_NAMES:
        m = re.search(rf'<joint name="{name}".*?<limit ([^/]*)/>', txt, re.S)
        if m is None:
            raise LabError(f"virtual lab: no <limit> for {name} in {urdf_path()}")
        attrs = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        lo.append(float(attrs["lower"]))
        hi.append(float(attrs["upper"]))
        vel.append(float(attrs["velocity"]))
        eff.append(float(attrs["effort"]))
    return JointLimits(np.array(lo), np.array(hi), np.array(vel), np.array(eff))
