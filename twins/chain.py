"""A robot's serial kinematic chain as constants, for controllers that evaluate forward
kinematics themselves (a push primitive exported to ONNX computes its tool pose and
Jacobian from the measured joints, so it needs the chain, not PyBullet).

    chain = serial_chain(urdf, joints, "panda_grasptarget")
    # chain.steps: for each joint from the base to the link, (T0 4x4 in its parent's frame
    # at q = 0, axis (3,) in the child frame, index into `joints` or -1 if not commanded)

Computed from PyBullet's URDF loader (twins/kinematics.py) once; evaluating
T = prod(T0_i @ Rot(axis_i, q_i)) reproduces `RobotKinematics.link_pose` exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from twins.errors import TwinError
from twins.kinematics import RobotKinematics

Vec = NDArray[np.float64]


@dataclass(frozen=True)
class ChainStep:
    T0: Vec  # 4x4: the joint's child frame in its parent's frame at q = 0
    axis: Vec  # (3,) unit axis in the child frame (revolute joints)
    index: int  # position of the joint in the commanded joints; -1: fixed / not commanded


@dataclass(frozen=True)
class SerialChain:
    link: str
    joints: tuple[str, ...]
    steps: tuple[ChainStep, ...]
    # the URDF's position limits of `joints` (rad); a joint without (continuous) gets
    # -inf / inf
    lower: tuple[float, ...] = ()
    upper: tuple[float, ...] = ()

    def pose(self, q: Sequence[float] | Vec) -> Vec:
        """T_base_link (4x4) at joint positions q (ordered as `joints`)."""
        qv = np.asarray(q, float)
        T = np.eye(4)
        for s in self.steps:
            T = T @ s.T0
            if s.index >= 0:
                K = _skew(s.axis)
                v = qv[s.index]
                M = np.eye(4)
                M[:3, :3] += np.sin(v) * K + (1.0 - np.cos(v)) * (K @ K)
                T = T @ M
        return T


def _skew(a: Vec) -> Vec:
    return np.array([[0.0, -a[2], a[1]], [a[2], 0.0, -a[0]], [-a[1], a[0], 0.0]])


def serial_chain(urdf: Path, joints: Sequence[str], link: str) -> SerialChain:
    """The chain from the robot's base to `link`; TwinError naming a prismatic joint on the
    way or a link the URDF does not have."""
    with RobotKinematics(Path(urdf), joints) as kin:
        if link not in kin.links:
            raise TwinError(
                f"kinematics: {Path(urdf).name} has no link '{link}' "
                f"(links: {', '.join(sorted(kin.links))})"
            )
        index = {j: i for i, j in enumerate(kin.joint_index)}
        pb = kin._pb
        steps: list[ChainStep] = []
        j = kin.links[link]
        while j >= 0:
            parent, T0, kind, axis = kin._chain[j]
            commanded = j in index
            if commanded and kind != pb.JOINT_REVOLUTE:
                raise TwinError(f"kinematics: joint {j} on the chain to '{link}' is not revolute")
            if kind == pb.JOINT_PRISMATIC:
                raise TwinError(f"kinematics: a prismatic joint lies on the chain to '{link}'")
            steps.append(ChainStep(T0.copy(), axis.copy(), index[j] if commanded else -1))
            j = parent
        lower, upper = [], []
        for j in kin.joint_index:
            ji = kin.joint_info[j]
            lo, hi = float(ji[8]), float(ji[9])
            ok = hi > lo and int(ji[2]) == pb.JOINT_REVOLUTE
            lower.append(lo if ok else -np.inf)
            upper.append(hi if ok else np.inf)
    return SerialChain(link, tuple(joints), tuple(reversed(steps)), tuple(lower), tuple(upper))
