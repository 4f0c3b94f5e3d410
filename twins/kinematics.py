"""Forward kinematics of a robot description (URDF) with PyBullet, for the workbench side of a
connected robot (e.g. the wrist-camera pose of a guided scan).

    kin = RobotKinematics.from_description("franka_panda/panda.urdf", joint_names)
    T_base_hand = kin.link_pose("panda_hand", q)     # 4x4, base frame, m

Each instance owns its own PyBullet DIRECT client (no GUI, no shared state); `close()` it.
Poses are URDF link frames (not the inertial/COM frame PyBullet reports first).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from twins.errors import TwinError


def description_path(description: str) -> Path:
    """The URDF for a robot's self-reported description: `pybullet_data:<path>`,
    `resources:<path>`, a file, or a bare pybullet_data key such as the lab's
    "franka_panda/panda.urdf". Raises TwinError naming the description."""
    from twins.from_scan import resolve_robot_ref

    d = description.strip()
    if not d:
        raise TwinError("robot reports no description (URDF); cannot compute its kinematics")
    if d.startswith(("pybullet_data:", "resources:")):
        p = resolve_robot_ref(d)
    else:
        p = Path(d).expanduser()
        if not p.is_file():
            p = resolve_robot_ref("pybullet_data:" + d)
    if not p.is_file():
        raise TwinError(f"robot description '{description}': no URDF at {p}")
    return p


class RobotKinematics:
    """Link poses of a fixed-base URDF robot for given joint positions."""

    def __init__(self, urdf: Path, joint_names: Sequence[str]) -> None:
        import pybullet as pb

        self._pb = pb
        self.urdf = Path(urdf)
        self.cid = pb.connect(pb.DIRECT)
        try:
            self.body = pb.loadURDF(str(self.urdf), useFixedBase=True,
                                    flags=pb.URDF_USE_INERTIA_FROM_FILE,
                                    physicsClientId=self.cid)
        except pb.error as exc:
            pb.disconnect(physicsClientId=self.cid)
            raise TwinError(f"kinematics: PyBullet cannot load {self.urdf}: {exc}") from None
        joints, links = {}, {}
        for j in range(pb.getNumJoints(self.body, physicsClientId=self.cid)):
            ji = pb.getJointInfo(self.body, j, physicsClientId=self.cid)
            joints[ji[1].decode()] = j
            links[ji[12].decode()] = j
        self.links = links
        self.base_link = pb.getBodyInfo(self.body, physicsClientId=self.cid)[0].decode()
        missing = [n for n in joint_names if n not in joints]
        if missing:
            self.close()
            raise TwinError(f"kinematics: {self.urdf.name} has no joint(s) {missing} "
                            f"(it has {sorted(joints)})")
        self.joint_index = [joints[n] for n in joint_names]
        self.joint_names = tuple(joint_names)

    @classmethod
    def from_description(cls, description: str, joint_names: Sequence[str]
                         ) -> RobotKinematics:
        return cls(description_path(description), joint_names)

    def link_pose(self, link: str, joint_pos: ArrayLike) -> NDArray[np.float64]:
        """T_base_link (4x4) of URDF link `link` at `joint_pos` (ordered as joint_names)."""
        pb = self._pb
        q = np.asarray(joint_pos, float).ravel()
        if q.size != len(self.joint_index):
            raise TwinError(f"kinematics: {q.size} joint positions for "
                            f"{len(self.joint_index)} joints {self.joint_names}")
        if link == self.base_link:
            return np.eye(4)
        if link not in self.links:
            raise TwinError(f"kinematics: {self.urdf.name} has no link '{link}' "
                            f"(links: {', '.join(sorted(self.links))})")
        for j, v in zip(self.joint_index, q, strict=True):
            pb.resetJointState(self.body, j, float(v), physicsClientId=self.cid)
        st = pb.getLinkState(self.body, self.links[link], computeForwardKinematics=True,
                             physicsClientId=self.cid)
        T = np.eye(4)
        T[:3, :3] = np.asarray(pb.getMatrixFromQuaternion(st[5]), float).reshape(3, 3)
        T[:3, 3] = st[4]
        return T   # loadURDF puts the base link frame at the world origin

    def close(self) -> None:
        if self.cid is not None and self.cid >= 0:
            try:
                self._pb.disconnect(physicsClientId=self.cid)
            except self._pb.error:
                pass
            self.cid = -1

    def __enter__(self) -> RobotKinematics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
