"""`LabSim`: one lab scene stepped deterministically, without threads.

It is the lab's "reality": the joint controller runs with the TRUE gains and force limits
(config.actuators), commands reach it after the TRUE latency (a delay queue on the lab
clock), and measured states carry the TRUE sensor noise. Tests and benchmarks drive it
directly; `LabDriver` runs it in real time on its own thread.

The lab clock is simulated time in seconds since reset (monotonic).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
from numpy.typing import NDArray

from devices.lab.config import LabConfig, LabError
from devices.lab.scenes import Scene, build_model, get_scene
from devices.poses import matrix_to_pose, quat_xyzw_to_wxyz
from devices.robots.wire.robot_types import CommandMode, RobotInfo, RobotState

MODES = ("position", "velocity", "torque")


class LabSim:
    """A scene, its truth, and its joint controller. Not thread-safe (LabDriver locks)."""

    def __init__(self, scene: str, config: LabConfig | Path | None = None) -> None:
        self.scene: Scene = get_scene(scene)
        if isinstance(config, (str, Path)):
            config = LabConfig.load(Path(config))
        self.config: LabConfig = config or self.scene.default_config()
        if self.config.scene != scene:
            raise LabError(f"lab config is for scene {self.config.scene!r}, not {scene!r}")
        self.config.validate()
        self.model = build_model(scene, self.config)
        self.data = mujoco.MjData(self.model)
        self._scratch = mujoco.MjData(self.model)  # kinematics without touching data
        names = self.scene.joint_names
        self.n = len(names)
        jids = [self.model.joint(n).id for n in names]
        self._qadr = np.array([self.model.jnt_qposadr[j] for j in jids], dtype=int)
        self._dadr = np.array([self.model.jnt_dofadr[j] for j in jids], dtype=int)
        ac = self.config.actuators
        self._kp = np.array(ac.kp if ac else (), float)
        self._kv = np.array(ac.kv if ac else (), float)
        self._flim = np.array(ac.force_limit if ac else (), float)
        self._tool = self.model.body(self.scene.tool_body).id if self.scene.tool_body else -1
        self._hull_geoms, self._hull_corners = self._moving_collision_boxes()
        self.seq = 0  # physics steps since reset: the state sequence number
        self.reset()

    # --- time and state ----------------------------------------------------------------

    def reset(self, keep_clock: bool = False) -> None:
        """Back to the config's initial state, holding the initial joint positions.

        keep_clock: keep the lab time and state sequence counting (a running lab's clock
        must stay monotonic); otherwise both restart at 0.
        """
        t, seq = (self.data.time, self.seq) if keep_clock else (0.0, 0)
        mujoco.mj_resetData(self.model, self.data)
        self.data.time = t
        if self.n and self.config.initial_joint_pos:
            self.data.qpos[self._qadr] = self.config.initial_joint_pos
        mujoco.mj_forward(self.model, self.data)
        self._rng = np.random.default_rng(self.config.seed)
        self._queue: deque[tuple[float, str, NDArray[np.float64]]] = deque()
        self._mode: str = "position"
        self._ref = self.data.qpos[self._qadr].copy()
        self._tau = np.zeros(self.n)
        self._cmd_time = float(self.data.time)  # when the newest command reached the lab
        self.seq = seq
        self._state: RobotState | None = None  # measured lazily: noise only when read

    @property
    def time(self) -> float:
        return float(self.data.time)

    @property
    def command_time(self) -> float:
        """Lab time (s) the newest command (or hold) arrived; its latency comes on top."""
        return self._cmd_time

    @property
    def dt(self) -> float:
        return float(self.model.opt.timestep)

    def step(self, n: int = 1) -> None:
        """Advance n physics steps (controller, physics, measurement each step)."""
        for _ in range(n):
            if self.n:
                self._control()
            mujoco.mj_step(self.model, self.data)
            self.seq += 1
        self._state = None

    def run_for(self, seconds: float) -> None:
        self.step(max(1, int(round(seconds / self.dt))))

    def _control(self) -> None:
        now = self.data.time + 1e-9
        while self._queue and self._queue[0][0] <= now:
            _, self._mode, self._ref = self._queue.popleft()
        q = self.data.qpos[self._qadr]
        qd = self.data.qvel[self._dadr]
        if self._mode == "position":
            tau = self._kp * (self._ref - q) - self._kv * qd
        elif self._mode == "velocity":
            tau = self._kv * (self._ref - qd)
        else:
            tau = self._ref
        self._tau = np.clip(tau, -self._flim, self._flim)
        self.data.ctrl[: self.n] = self._tau

    def _measure(self) -> RobotState:
        c, r, n = self.config, self._rng, self.n
        return RobotState(
            t=self.time,
            seq=self.seq,
            joint_pos=self.data.qpos[self._qadr] + r.normal(0, c.joint_pos_noise, n),
            joint_vel=self.data.qvel[self._dadr] + r.normal(0, c.joint_vel_noise, n),
            joint_effort=self._tau + r.normal(0, c.effort_noise, n),
        )

    def read_state(self) -> RobotState:
        """The newest measured state (noisy), with ee_pos from the measured joints and the
        lab time the newest command arrived (`command_time`: a command written between two
        steps arrives at the next step's start; the lab's latency comes on top). Reading
        twice between steps returns the same sample (its `command_time` follows writes)."""
        if self._state is not None and self._state.command_time != self._cmd_time:
            self._state = replace(self._state, command_time=self._cmd_time)
        if self._state is None:
            s = self._measure()
            if self._tool >= 0:
                s = RobotState(
                    s.t,
                    s.seq,
                    s.joint_pos,
                    s.joint_vel,
                    s.joint_effort,
                    self.forward_kinematics(s.joint_pos),
                )
            s = replace(s, command_time=self._cmd_time)
            self._state = s
        return self._state

    # --- commands ----------------------------------------------------------------------

    def write_command(self, mode: CommandMode, values: NDArray[np.float64]) -> None:
        """Queue a command; the controller sees it `latency_s` later on the lab clock."""
        if mode not in MODES:
            raise LabError(
                f"lab {self.scene.name}: command mode {mode!r} not supported (supports {MODES})"
            )
        v = np.array(values, dtype=float).reshape(-1)
        if v.shape != (self.n,) or not np.all(np.isfinite(v)):
            raise LabError(
                f"lab {self.scene.name}: {mode} command needs {self.n} finite "
                f"values, got {np.asarray(values).tolist()}"
            )
        self._queue.append((self.time + self.config.latency_s, mode, v))
        self._cmd_time = self.time

    def hold(self) -> None:
        """Stop now (no latency: the controller's own brake): hold the true position."""
        self._queue.clear()
        self._cmd_time = self.time
        self._mode = "position"
        self._ref = self.data.qpos[self._qadr].copy()

    # --- kinematics (nominal model, not truth) -----------------------------------------

    def forward_kinematics(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64] | None:
        """Tool (end-effector) position in the base frame for joint_pos, m."""
        if self._tool < 0:
            return None
        return self.body_pose(self.scene.tool_body, joint_pos)[:3, 3].copy()

    def _moving_collision_boxes(self) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """The collision geoms of every robot body a joint moves, and the 8 corners of each
        one's bounding box in its own frame (G, 8, 3): what the safety envelope checks
        against the workspace box besides the tool point (a fixed base may sit in the table)."""
        m = self.model
        moved = np.zeros(m.nbody, bool)
        for b in range(1, m.nbody):  # parents come before children
            moved[b] = m.body_jntnum[b] > 0 or moved[m.body_parentid[b]]
        arm = {m.jnt_bodyid[m.joint(j).id] for j in self.scene.joint_names}
        root = {b for b in range(m.nbody) if b in arm or m.body_parentid[b] in arm}
        robot = np.zeros(m.nbody, bool)
        for b in range(1, m.nbody):
            robot[b] = b in root or robot[m.body_parentid[b]]
        geoms = [
            g
            for g in range(m.ngeom)
            if (m.geom_contype[g] or m.geom_conaffinity[g])
            and moved[m.geom_bodyid[g]]
            and robot[m.geom_bodyid[g]]
        ]
        signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)
        aabb = m.geom_aabb[geoms].reshape(-1, 2, 3)  # center, half size (geom frame)
        corners = aabb[:, None, 0, :] + signs[None] * aabb[:, None, 1, :]
        return np.asarray(geoms, np.int64), corners

    def collision_points(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64] | None:
        """(K, 3), m, base frame: the tool point first, then the corners of the bounding box
        of every moving robot collision geom at joint_pos (nominal kinematics)."""
        tool = self.forward_kinematics(joint_pos)
        if tool is None:
            return None
        d = self._scratch  # forward_kinematics left it at joint_pos
        g = self._hull_geoms
        R = d.geom_xmat[g].reshape(-1, 3, 3)
        pts = d.geom_xpos[g][:, None, :] + np.einsum("gij,gkj->gki", R, self._hull_corners)
        return np.vstack([tool[None, :], pts.reshape(-1, 3)])

    def body_pose(self, body: str, joint_pos: NDArray[np.float64]) -> NDArray[np.float64]:
        """T_base_body (4x4) of a robot body (e.g. "panda_hand") at joint_pos."""
        d = self._scratch
        d.qpos[:] = self.data.qpos
        d.qpos[self._qadr] = np.asarray(joint_pos, float)
        mujoco.mj_kinematics(self.model, d)
        try:
            b = self.model.body(body).id
        except KeyError:
            raise LabError(f"lab {self.scene.name}: no body {body!r}") from None
        T = np.eye(4)
        T[:3, :3] = d.xmat[b].reshape(3, 3)
        T[:3, 3] = d.xpos[b]
        return T

    def info(self) -> RobotInfo:
        """What the lab robot says about itself: names, NOMINAL limits, rate. No truth."""
        meta: dict[str, Any] = {"simulator": "mujoco", "lab_scene": self.scene.name}
        if self.config.actuators is not None:
            meta["gravity_compensation"] = self.config.actuators.gravity_compensation
        if self.scene.tool_body:
            meta["ee_link"] = self.scene.tool_body
        for c in self.config.cameras:
            if c.kind == "wrist" and c.nominal_pose is not None:
                meta[f"camera/{c.name}/mount_body"] = c.mount_body
                meta[f"camera/{c.name}/nominal_T_mount_camera"] = list(c.nominal_pose)
        return RobotInfo(
            name=f"lab/{self.scene.name}",
            joint_names=self.scene.joint_names,
            limits=self.scene.nominal_limits(),
            control_rate_hz=self.config.control_rate_hz,
            command_modes=MODES if self.n else (),
            cameras=tuple(c.name for c in self.config.cameras),
            description=self.scene.robot_description,
            meta=meta,
        )

    # --- truth (benchmarks and tests only; never on the protocol) ----------------------

    def truth_object_poses(self) -> dict[str, NDArray[np.float64]]:
        """Current true pose (xyz + quat xyzw, world frame) of every free object."""
        out = {}
        for o in self.config.objects:
            b = self.model.body(o.name).id
            T = np.eye(4)
            T[:3, :3] = self.data.xmat[b].reshape(3, 3)
            T[:3, 3] = self.data.xpos[b]
            out[o.name] = matrix_to_pose(T)
        return out

    def set_object(
        self,
        name: str,
        pose: NDArray[np.float64] | None = None,
        lin_vel: NDArray[np.float64] | None = None,
        ang_vel: NDArray[np.float64] | None = None,
    ) -> None:
        """Place / throw a free object (the experimenter's hand): pose xyz + quat xyzw in
        the world, velocities in m/s and rad/s (world frame)."""
        try:
            j = self.model.joint(f"{name}_free").id
        except KeyError:
            raise LabError(
                f"lab {self.scene.name}: no free object {name!r} "
                f"(has {[o.name for o in self.config.objects]})"
            ) from None
        qa, da = self.model.jnt_qposadr[j], self.model.jnt_dofadr[j]
        if pose is not None:
            p = np.asarray(pose, float)
            self.data.qpos[qa : qa + 3] = p[:3]
            self.data.qpos[qa + 3 : qa + 7] = quat_xyzw_to_wxyz(p[3:7])
        if lin_vel is not None:
            self.data.qvel[da : da + 3] = np.asarray(lin_vel, float)
        if ang_vel is not None:
            # MuJoCo's free-joint angular velocity is in the body frame
            R = self.data.xmat[self.model.body(name).id].reshape(3, 3)
            self.data.qvel[da + 3 : da + 6] = R.T @ np.asarray(ang_vel, float)
        mujoco.mj_forward(self.model, self.data)

    def truth_joint_pos(self) -> NDArray[np.float64]:
        return self.data.qpos[self._qadr].copy()
