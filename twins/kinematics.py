"""Forward kinematics of a robot description (URDF) with PyBullet, for the workbench side of a
connected robot (e.g. the wrist-camera pose of a guided scan).

    kin = RobotKinematics.from_description("franka_panda/panda.urdf", joint_names)
    T_base_hand = kin.link_pose("panda_hand", q)     # 4x4, base frame, m

A URDF is read once through PyBullet (a DIRECT client, closed at once) and its chain kept
per file (in a spawned worker process once `read_in_worker()` is called: the desktop app
does, PyBullet holds the GIL while it reads); poses are evaluated in float64 numpy.
`close()` an instance that used
`link_pose_pybullet` (its own client).
Poses are URDF link frames (not the inertial/COM frame PyBullet reports first).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from twins.engine import connect_direct, pb
from twins.errors import TwinError

log = logging.getLogger(__name__)


def description_path(description: str) -> Path:
    """The URDF for a robot's self-reported description: `pybullet_data:<path>`,
    `resources:<path>`, a file, or a bare pybullet_data key such as the lab's
    "franka_panda/panda.urdf". Raises TwinError naming the description."""
    # 0.5 s (trimesh, scipy, twins.make) that app/robot_link.py, which imports us, never needs
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


_Chain = list[tuple[int, NDArray[np.float64], int, NDArray[np.float64]]]


@dataclass(frozen=True)
class _Loaded:
    """What a URDF's kinematics need, read once through PyBullet (shared: read only)."""

    joints: dict[str, int]  # joint name -> PyBullet joint index
    links: dict[str, int]  # child link name -> the index of the joint that carries it
    base_link: str
    chain: _Chain  # per joint: (parent, T_parent_link at q = 0, joint type, unit axis)
    info: tuple[tuple[Any, ...], ...]  # getJointInfo per joint


_LOADED: dict[tuple[str, int, int], _Loaded] = {}
_LOADED_LOCK = threading.Lock()
_IN_WORKER = False


def read_in_worker(on: bool = True) -> None:
    """Read URDFs not read yet in a spawned worker process from now on (the desktop app: a
    job thread reading a Panda through PyBullet held the GIL, and the window, 200 ms on a
    loaded laptop). Off by default: a command line pays no process start."""
    global _IN_WORKER
    _IN_WORKER = on


def _load(urdf: Path) -> _Loaded:
    """The URDF's chain, from PyBullet at q = 0 (cached per file and version: loading a
    Panda holds the GIL for 10-60 ms, and a scan or deploy on a busy laptop waited 200 ms
    for it; each later instance costs nothing)."""
    try:
        st = urdf.stat()
    except OSError as exc:
        raise TwinError(f"kinematics: cannot read {urdf} ({exc})") from None
    key = (str(urdf.resolve()), st.st_mtime_ns, st.st_size)
    with _LOADED_LOCK:
        hit = _LOADED.get(key)
    if hit is not None:
        return hit
    loaded: _Loaded | None = None
    if _IN_WORKER:
        try:
            ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no Qt, no threads
            with ProcessPoolExecutor(1, mp_context=ctx) as ex:
                loaded = ex.submit(_read, str(urdf)).result()
        except (OSError, BrokenProcessPool) as exc:
            log.warning("URDF reader process failed (%s); reading %s here", exc, urdf)
    if loaded is None:
        loaded = _read(str(urdf))
    with _LOADED_LOCK:
        _LOADED[key] = loaded
    return loaded


def _read(urdf: str) -> _Loaded:
    """Read `urdf`'s chain through a DIRECT PyBullet client (closed at once)."""
    cid = connect_direct()
    try:
        try:
            # no visual meshes: only the chain is read, and parsing a Panda's meshes took
            # 50-180 ms of 60 (10-16 without), with the GIL held (the window waited)
            body = pb.loadURDF(
                urdf,
                useFixedBase=True,
                flags=pb.URDF_USE_INERTIA_FROM_FILE | pb.URDF_IGNORE_VISUAL_SHAPES,
                physicsClientId=cid,
            )
        except pb.error as exc:
            raise TwinError(f"kinematics: PyBullet cannot load {urdf}: {exc}") from None
        n = pb.getNumJoints(body, physicsClientId=cid)
        info = tuple(tuple(pb.getJointInfo(body, j, physicsClientId=cid)) for j in range(n))
        return _Loaded(
            {ji[1].decode(): j for j, ji in enumerate(info)},
            {ji[12].decode(): j for j, ji in enumerate(info)},
            pb.getBodyInfo(body, physicsClientId=cid)[0].decode(),
            _frames_at_zero(pb, cid, body, info),
            info,
        )
    finally:
        pb.disconnect(physicsClientId=cid)


def _frames_at_zero(pb: Any, cid: int, body: int, info: tuple[tuple[Any, ...], ...]) -> _Chain:
    """Constant parts of the chain from PyBullet at q = 0: each link's frame in its parent's
    frame, and its joint (type, axis in the child frame). Evaluating the chain in float64
    keeps FK smooth for numeric IK (PyBullet's own link states are single precision: steps
    below ~1e-7 m vanish, which breaks finite-difference Jacobians)."""
    for j in range(len(info)):
        pb.resetJointState(body, j, 0.0, physicsClientId=cid)
    world = [_link_state(pb, cid, body, j) for j in range(len(info))]
    chain: _Chain = []
    for j, ji in enumerate(info):
        parent = int(ji[16])
        Tp = np.eye(4) if parent < 0 else world[parent]
        chain.append(
            (
                parent,
                np.asarray(np.linalg.solve(Tp, world[j]), float),
                int(ji[2]),
                _unit(np.asarray(ji[13], float)),
            )
        )
    return chain


def _link_state(pb: Any, cid: int, body: int, j: int) -> NDArray[np.float64]:
    st = pb.getLinkState(body, j, computeForwardKinematics=True, physicsClientId=cid)
    T = np.eye(4)
    T[:3, :3] = np.asarray(pb.getMatrixFromQuaternion(st[5]), float).reshape(3, 3)
    T[:3, 3] = st[4]
    return T


class RobotKinematics:
    """Link poses of a fixed-base URDF robot for given joint positions."""

    def __init__(self, urdf: Path, joint_names: Sequence[str]) -> None:
        self._pb = pb
        self.urdf = Path(urdf)
        loaded = _load(self.urdf)
        self.links = loaded.links
        self.base_link = loaded.base_link
        self.joint_info = loaded.info
        self._chain = loaded.chain
        missing = [n for n in joint_names if n not in loaded.joints]
        if missing:
            raise TwinError(
                f"kinematics: {self.urdf.name} has no joint(s) {missing} "
                f"(it has {sorted(loaded.joints)})"
            )
        self.joint_index = [loaded.joints[n] for n in joint_names]
        self.joint_names = tuple(joint_names)
        self.cid = -1  # a PyBullet client only for `link_pose_pybullet`
        self._figure: list[str] | None = None  # `figure_links`, once computed
        self.body = -1

    @classmethod
    def from_description(cls, description: str, joint_names: Sequence[str]) -> RobotKinematics:
        return cls(description_path(description), joint_names)

    def speed_effort_limits(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The URDF's velocity (rad/s or m/s) and effort limits of `joint_names`; 0 where
        the URDF gives none."""
        vel, eff = [], []
        for j in self.joint_index:
            ji = self.joint_info[j]
            vel.append(max(float(ji[11]), 0.0))
            eff.append(max(float(ji[10]), 0.0))
        return np.array(vel), np.array(eff)

    def _check(self, link: str, joint_pos: ArrayLike) -> NDArray[np.float64]:
        q = np.asarray(joint_pos, float).ravel()
        if q.size != len(self.joint_index):
            raise TwinError(
                f"kinematics: {q.size} joint positions for "
                f"{len(self.joint_index)} joints {self.joint_names}"
            )
        if link != self.base_link and link not in self.links:
            raise TwinError(
                f"kinematics: {self.urdf.name} has no link '{link}' "
                f"(links: {', '.join(sorted(self.links))})"
            )
        return q

    def link_pose(self, link: str, joint_pos: ArrayLike) -> NDArray[np.float64]:
        """T_base_link (4x4) of URDF link `link` at `joint_pos` (ordered as joint_names);
        joints not named stay at 0."""
        q = self._check(link, joint_pos)
        if link == self.base_link:
            return np.eye(4)
        qj = dict(zip(self.joint_index, q, strict=True))
        T = np.eye(4)
        j = self.links[link]
        while j >= 0:
            parent, T0, kind, axis = self._chain[j]
            M = np.eye(4)
            v = qj.get(j, 0.0)
            if kind == self._pb.JOINT_REVOLUTE:
                K = np.array(
                    [[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]]
                )
                M[:3, :3] += np.sin(v) * K + (1.0 - np.cos(v)) * (K @ K)  # Rodrigues
            elif kind == self._pb.JOINT_PRISMATIC:
                M[:3, 3] = axis * v
            T = T0 @ M @ T
            j = parent
        return T

    def figure_links(self) -> list[str]:
        """The links a stick figure of the arm joins: the child link of each joint from the
        base to the last named joint, then on along fixed joints to the tool (the longest
        fixed run: a Panda's flange and grasp target). Computed once."""
        if self._figure is not None:
            return self._figure
        names = {j: n for n, j in self.links.items()}
        chain, j = [], max(self.joint_index, key=self._depth) if self.joint_index else -1
        while j >= 0:
            chain.append(j)
            j = self._chain[j][0]
        chain.reverse()
        children: dict[int, list[int]] = {}
        for k, (parent, _, _, _) in enumerate(self._chain):
            children.setdefault(parent, []).append(k)

        def fixed_run(k: int) -> list[int]:
            runs = [
                fixed_run(c)
                for c in children.get(k, [])
                if self._chain[c][2] == self._pb.JOINT_FIXED
            ]
            return [k, *max(runs, key=len)] if runs else [k]

        # a fixed link that only turns the frame (a Panda's hand on its flange) adds no point
        tool = [k for k in (fixed_run(chain[-1])[1:] if chain else []) if self._offset(k) > 1e-9]
        joints = chain + tool
        figure = [self.base_link] + [names[k] for k in joints]
        self._figure = figure
        return figure

    def _offset(self, j: int) -> float:
        return float(np.linalg.norm(self._chain[j][1][:3, 3]))

    def _depth(self, j: int) -> int:
        d = 0
        while j >= 0:
            d, j = d + 1, self._chain[j][0]
        return d

    def figure_points(self, joint_pos: ArrayLike) -> NDArray[np.float64]:
        """Points (K, 3) in the base frame, m, of `figure_links` at `joint_pos`: what the
        workbench draws as the arm's stick figure."""
        return np.array([self.link_pose(n, joint_pos)[:3, 3] for n in self.figure_links()])

    def link_pose_pybullet(self, link: str, joint_pos: ArrayLike) -> NDArray[np.float64]:
        """The same pose straight from PyBullet's link state (single precision; a check)."""
        q = self._check(link, joint_pos)
        if link == self.base_link:
            return np.eye(4)
        pb = self._pb
        if self.cid < 0:
            self.cid = connect_direct()
            self.body = pb.loadURDF(
                str(self.urdf),
                useFixedBase=True,
                flags=pb.URDF_USE_INERTIA_FROM_FILE | pb.URDF_IGNORE_VISUAL_SHAPES,
                physicsClientId=self.cid,
            )
        for j, v in zip(self.joint_index, q, strict=True):
            pb.resetJointState(self.body, j, float(v), physicsClientId=self.cid)
        return _link_state(pb, self.cid, self.body, self.links[link])

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


def _unit(v: NDArray[np.float64]) -> NDArray[np.float64]:
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v
