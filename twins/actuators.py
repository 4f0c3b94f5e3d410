"""Actuator models on top of the twin's joints.

- "servo": PyBullet's own position servo (an implicit velocity constraint, force-limited):
  each step it drives the joint velocity to `bandwidth * (q* - q)` (positionGain =
  bandwidth * dt, capped at 1). Stable at any step and free of per-step Python, so it is the
  default for position-controlled arms. It shares PyBullet's joint motor with friction, so
  servo joints have no separate joint-friction parameter.
- "pd": explicit tau = kp (q* - q) - kd qd, clipped to the effort limit, computed every step
  (physical gains; stable only while kd dt / I and kp dt^2 / I stay small — the default
  gains in twins/make.py are critically damped at wn = 0.3 / dt). Optional
  `gravity_compensation` (0..1, default 0): that share of the arm's gravity torque at the
  current pose is added outside the PD and its limit, as a Franka's controller does (the
  reported effort is the PD's alone, as the robot reports it).
- "torque": tau = gain * u + bias, clipped; re-applied every step (PyBullet clears torques).
- "dc_motor": voltage u -> tau = N km (u - N km qd) / R. The back-EMF part is a viscous
  damping N^2 km^2 / R added to the joint damping; the rest is a torque N km u / R.
Joint friction (non-servo joints) is a zero-velocity motor whose force is the friction
torque (Coulomb with stiction). PyBullet's PD_CONTROL plugin is not used: one call costs
about 3 ms here. Latency shifts when a command takes effect (handled by the caller).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from twins.engine import pb
from twins.errors import TwinError
from twins.spec import COMMAND_UNITS

if TYPE_CHECKING:
    from twins.builder import TwinWorld


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cross product of (k, 3) arrays: np.cross's arithmetic without its axis
    handling, which costs more than the products for a few rows every physics step."""
    a0, a1, a2 = a[:, 0], a[:, 1], a[:, 2]
    b0, b1, b2 = b[:, 0], b[:, 1], b[:, 2]
    return np.stack((a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0), axis=1)


def emf_damping(values: dict[str, float], joint: str) -> float:
    pre = f"robot.actuators.{joint}"
    n, k, r = values[f"{pre}.gear_ratio"], values[f"{pre}.k_emf"], values[f"{pre}.resistance"]
    return n * n * k * k / r


def step_commands(
    t: np.ndarray, U_ext: np.ndarray, t_steps: np.ndarray, dt: float, latency: np.ndarray
) -> np.ndarray:
    """Command of each physics step: the step's average of the delayed, held command.

    Row k+1 of `U_ext` is commanded at `t[k]` (row 0 holds before) and takes effect
    `latency[j]` later on joint j; step s spans [t_steps[s], t_steps[s] + dt). Averaging
    over the step (the impulse a held command gives) rather than sampling at its start
    makes the replay continuous in the latency (a fit gets a gradient below one step);
    when every switch falls on a step boundary it equals the sampled command.
    """
    t = np.asarray(t, float)
    out = np.empty((len(t_steps), U_ext.shape[1]))
    for j, lat in enumerate(np.asarray(latency, float)):
        u = U_ext[:, j]
        s = t + lat  # switch k: u[k] -> u[k + 1]
        # G(x) = integral of (u(tau) - u[0]) from s[0] to x, piecewise linear in x
        g = np.concatenate([[0.0], np.cumsum((u[1:-1] - u[0]) * np.diff(s))])

        def G(x: np.ndarray, s: np.ndarray = s, g: np.ndarray = g, u: np.ndarray = u) -> np.ndarray:
            m = np.searchsorted(s, x, side="right") - 1  # last switch at or before x
            mm = np.clip(m, 0, len(s) - 1)
            return np.where(m < 0, 0.0, g[mm] + (u[mm + 1] - u[0]) * (x - s[mm]))

        out[:, j] = u[0] + (G(t_steps + dt) - G(t_steps)) / dt
    return out


def configure_joints(world: TwinWorld) -> None:
    """Joint damping (+ back-EMF) and friction motors for every twin joint."""
    r, v, cid = world.spec.robot, world.values, world.cid
    assert r is not None and world.robot_id is not None
    ids, friction = [], []
    for j in r.joints:
        a = r.actuator(j.name)
        damping = v[f"robot.joints.{j.name}.damping"]
        if a is not None and a.model == "dc_motor":
            damping += emf_damping(v, j.name)
        # Two calls on purpose: given together with maxJointVelocity, PyBullet 3.2.7 silently
        # drops jointDamping (measured: tests/twins/test_builder.py, DC motor speed).
        li = world.joint_index[j.name]
        pb.changeDynamics(world.robot_id, li, maxJointVelocity=1e4, physicsClientId=cid)
        pb.changeDynamics(world.robot_id, li, jointDamping=damping, physicsClientId=cid)
        if a is None or a.model != "servo":
            ids.append(world.joint_index[j.name])
            friction.append(v[f"robot.joints.{j.name}.friction"])
    if ids:
        pb.setJointMotorControlArray(
            world.robot_id,
            ids,
            pb.VELOCITY_CONTROL,
            targetVelocities=[0.0] * len(ids),
            forces=friction,
            physicsClientId=cid,
        )


def hold_initial(world: TwinWorld) -> None:
    """Robot at its initial joint positions, servos holding them, no torques."""
    r = world.spec.robot
    if r is None or world.robot_id is None:
        return
    q0 = np.asarray(r.initial_joint_pos or [0.0] * len(r.joints), float)
    names = [j.name for j in r.joints]
    world.set_joint_state(q0, None, names)
    acted = [a.joint for a in r.actuators]
    if acted:
        bank = Actuators(world, acted)
        bank.apply(bank.hold_command(q0[[names.index(a) for a in acted]]))


class Actuators:
    """Applies a command vector for `joints` (the command's columns) through their models.

    `apply(u)` takes a new command into effect (servo targets are set at once);
    `before_step()` must run before every physics step when `needs_per_step` (PD and
    torque-like joints: PyBullet clears applied torques after each step).

    Actuated joints the command leaves out are held where they are when the bank is made,
    by their own servo or PD, as a robot's controller holds a joint nobody moves (a
    gripper stays shut or open). Left free, they swing: the Panda's fingers slid along
    the hand and knocked on their stops whenever the arm turned, which the fits took as
    extra damping of the joints that turn the hand (joints 1 and 3 fitted 15-20 % low on
    noise-free lab data; within 2 % with the fingers held). Torque-like joints left out
    get no torque, as before.
    """

    def __init__(self, world: TwinWorld, joints: list[str]) -> None:
        r = world.spec.robot
        if r is None or world.robot_id is None:
            raise TwinError("the twin has no robot to command")
        self.world, self.cid, self.rid = world, world.cid, world.robot_id
        self.joints = list(joints)
        v = world.values
        self.models: list[str] = []
        for j in joints:
            a = r.actuator(j)
            if a is None:
                raise TwinError(f"joint '{j}' has no actuator in the twin; it cannot be commanded")
            self.models.append(a.model)
        m = np.array(self.models)
        self.sv = np.flatnonzero(m == "servo")
        self.pd = np.flatnonzero(m == "pd")
        self.tq = np.flatnonzero((m == "torque") | (m == "dc_motor"))
        ids = np.array(world.joint_ids(self.joints), dtype=int)
        self.sv_ids, self.pd_ids, self.tq_ids = (
            ids[g].tolist() for g in (self.sv, self.pd, self.tq)
        )
        # the actuated joints the command leaves out, held by their servo or PD (see above)
        held = [
            a.joint
            for a in r.actuators
            if a.joint not in self.joints and a.model in ("servo", "pd")
        ]
        held_sv = [j for j in held if r.actuator(j).model == "servo"]  # type: ignore[union-attr]
        held_pd = [j for j in held if j not in held_sv]
        self.n_pd = len(self.pd)  # commanded PD joints: the first n_pd of the PD arrays
        self.pd_ids += world.joint_ids(held_pd)
        self.step_ids = self.pd_ids + self.tq_ids

        def arr(idx: np.ndarray, key: str, default: float = 0.0) -> np.ndarray:
            return np.array([v.get(f"robot.actuators.{joints[i]}.{key}", default) for i in idx])

        def arr_held(names: list[str], key: str) -> np.ndarray:
            return np.array([v.get(f"robot.actuators.{j}.{key}", 0.0) for j in names])

        def pd_arr(key: str) -> np.ndarray:
            return np.concatenate([arr(self.pd, key), arr_held(held_pd, key)])

        dt = world.dt
        self.sv_kp = np.minimum(arr(self.sv, "bandwidth") * dt, 1.0).tolist()
        self.sv_kd = arr(self.sv, "velocity_gain").tolist()
        self.sv_force = arr(self.sv, "effort_limit").tolist()
        self.kp, self.kd = pd_arr("kp"), pd_arr("kd")
        self.gravity_share = pd_arr("gravity_compensation")
        self._gc_links: list[int] = []
        arm = np.array([v.get(f"robot.joints.{j.name}.armature", 0.0) for j in r.joints])
        self._rotor = bool(self.step_ids) and bool(np.any(arm > 0))
        if np.any(self.gravity_share > 0) or self._rotor:
            self._gravity_setup(world)
        if self._rotor:
            self._rotor_setup(world, [j.name for j in r.joints], arm)
        self.pd_force = pd_arr("effort_limit")
        # torque-like models: tau = a * clip(u, -ulim, ulim) + b, then clip(tau, -e, e)
        is_dc = np.array([self.models[i] == "dc_motor" for i in self.tq], dtype=bool)
        kt = (
            arr(self.tq, "gear_ratio", 1.0)
            * arr(self.tq, "k_emf", 1.0)
            / arr(self.tq, "resistance", 1.0)
        )
        self.tq_a = np.where(is_dc, kt, arr(self.tq, "gain", 1.0))
        self.tq_b = np.where(is_dc, 0.0, arr(self.tq, "bias"))
        self.tq_ulim = np.where(is_dc, arr(self.tq, "voltage_limit", np.inf), np.inf)
        self.tq_elim = np.where(is_dc, np.inf, arr(self.tq, "effort_limit", np.inf))
        self.emf = np.array(
            [emf_damping(v, joints[i]) if self.models[i] == "dc_motor" else 0.0 for i in self.tq]
        )
        self.latency = np.array([v.get(f"robot.actuators.{j}.latency", 0.0) for j in joints])
        self.needs_per_step = bool(len(self.step_ids))
        self._pd_target = np.zeros(len(self.pd_ids))
        if held_pd:
            self._pd_target[self.n_pd :] = world.joint_state(held_pd)[0]
        if held_sv:
            sv_held = world.joint_ids(held_sv)
            pb.setJointMotorControlArray(
                self.rid,
                sv_held,
                pb.POSITION_CONTROL,
                targetPositions=world.joint_state(held_sv)[0].tolist(),
                targetVelocities=[0.0] * len(sv_held),
                positionGains=np.minimum(arr_held(held_sv, "bandwidth") * dt, 1.0).tolist(),
                velocityGains=arr_held(held_sv, "velocity_gain").tolist(),
                forces=arr_held(held_sv, "effort_limit").tolist(),
                physicsClientId=self.cid,
            )
        self.held = held
        self.last_pd_tau: np.ndarray | None = None  # commanded PD joints' torque, last step
        self._tau: list[float] = [0.0] * len(self.tq)

    def units_ok(self, unit: str) -> None:
        """TwinError unless `unit` is what every commanded joint's model accepts."""
        for j, model in zip(self.joints, self.models, strict=True):
            if unit not in COMMAND_UNITS[model]:
                raise TwinError(
                    f"command unit '{unit}' does not fit joint '{j}', whose "
                    f"'{model}' actuator takes {' or '.join(COMMAND_UNITS[model])}"
                )

    def hold_command(self, q: np.ndarray) -> np.ndarray:
        """Command that holds position `q` for servos and applies nothing elsewhere."""
        u = np.zeros(len(self.joints))
        for g in (self.sv, self.pd):
            u[g] = np.asarray(q)[g]
        return u

    def torques(self, u: np.ndarray) -> np.ndarray:
        """Torques of the torque-like joints for command `u` (vectorised over leading axes)."""
        uu = np.clip(np.asarray(u)[..., self.tq], -self.tq_ulim, self.tq_ulim)
        return np.clip(self.tq_a * uu + self.tq_b, -self.tq_elim, self.tq_elim)

    def apply(self, u: np.ndarray, tau: np.ndarray | None = None) -> None:
        """Take command `u` (and optionally its precomputed torques) into effect now."""
        u = np.asarray(u)
        if len(self.sv):
            pb.setJointMotorControlArray(
                self.rid,
                self.sv_ids,
                pb.POSITION_CONTROL,
                targetPositions=u[self.sv].tolist(),
                targetVelocities=[0.0] * len(self.sv),
                positionGains=self.sv_kp,
                velocityGains=self.sv_kd,
                forces=self.sv_force,
                physicsClientId=self.cid,
            )
        if len(self.pd):
            self._pd_target[: self.n_pd] = u[self.pd]
        if len(self.tq):
            self._tau = (self.torques(u) if tau is None else tau).tolist()

    def before_step(self) -> None:
        # one forward-kinematics query per step serves gravity and the rotor coupling
        ls = (
            pb.getLinkStates(
                self.rid, self._gc_links, computeForwardKinematics=True, physicsClientId=self.cid
            )
            if self._gc_links
            else []
        )
        if len(self.pd_ids):
            st = pb.getJointStates(self.rid, self.pd_ids, physicsClientId=self.cid)
            q = np.array([s[0] for s in st])
            qd = np.array([s[1] for s in st])
            pd = np.clip(
                self.kp * (self._pd_target - q) - self.kd * qd, -self.pd_force, self.pd_force
            )
            self.last_pd_tau = pd[: self.n_pd]
            if np.any(self.gravity_share > 0):
                pd = pd + self.gravity_share * self._gravity(ls)
            tau = pd.tolist() + self._tau
        else:
            tau = self._tau
        if self._rotor:
            tau = (np.asarray(tau) + self._rotor_coupling(ls)).tolist()
        pb.setJointMotorControlArray(
            self.rid, self.step_ids, pb.TORQUE_CONTROL, forces=tau, physicsClientId=self.cid
        )

    def _gravity_setup(self, world: TwinWorld) -> None:
        """Masses, joint kinds and subtrees for `_gravity` (PyBullet's inverse dynamics
        refuses the inertia tensors an armature makes, so gravity is summed here)."""
        rid, cid = self.rid, self.cid
        n = pb.getNumJoints(rid, physicsClientId=cid)
        self._gc_links = list(range(n))
        self._gc_mass = np.array(
            [pb.getDynamicsInfo(rid, i, physicsClientId=cid)[0] for i in range(n)]
        )
        info = [pb.getJointInfo(rid, i, physicsClientId=cid) for i in range(n)]
        parent = [int(j[16]) for j in info]
        self._gc_axis = np.array([j[13] for j in info], dtype=float)
        self._gc_prismatic = np.array([info[i][2] == pb.JOINT_PRISMATIC for i in self.pd_ids])
        below = np.zeros((len(self.pd_ids), n), dtype=bool)  # link i moves with joint j
        for row, j in enumerate(self.pd_ids):
            for i in range(n):
                k = i
                while k >= 0 and k != j:
                    k = parent[k]
                below[row, i] = k == j
        self._gc_below = below
        self._axes_of: Any = None
        self._axes_all = np.zeros((0, 3))
        self._gc_g = np.array([0.0, 0.0, -float(world.values["sim.gravity"])])
        self._gc_weight = self._gc_mass[:, None] * self._gc_g  # (n, 3)
        self._gc_force = below @ self._gc_weight  # (pd, 3): weight of all the joint moves

    def _rotor_setup(self, world: TwinWorld, names: list[str], arm: np.ndarray) -> None:
        """What `_rotor_coupling` needs: the twin joints' ids, armatures and which joints
        carry each rotor (its joint's ancestors)."""
        self._ro_ids = world.joint_ids(names)
        self._ro_arm = arm
        n = pb.getNumJoints(self.rid, physicsClientId=self.cid)
        parent = [int(pb.getJointInfo(self.rid, i, physicsClientId=self.cid)[16]) for i in range(n)]
        anc = np.zeros((len(names), len(names)))  # anc[k, i]: joint i carries joint k's link
        for k, jk in enumerate(self._ro_ids):
            for i, ji in enumerate(self._ro_ids):
                p = parent[jk]
                while p >= 0 and p != ji:
                    p = parent[p]
                anc[k, i] = float(p == ji and ji != jk)
        self._ro_anc = anc
        self._ro_rows = [self._ro_ids.index(j) for j in self.step_ids]
        self._ro_qd: np.ndarray | None = None

    def _rotor_coupling(self, ls: Any) -> np.ndarray:
        """Torques D qdd that turn the builder's armature (rotor inertia added to the child
        link's inertia about the joint axis, so PyBullet couples it into every ancestor
        joint: M = M_links + diag(a) + D) into a joint-space diagonal one, as a motor's rotor
        behaves (MuJoCo's `armature`). D = sum_k a_k (w_k w_k^T - e_k e_k^T), w_k[i] =
        axis_k . axis_i for the joints i that carry rotor k, w_k[k] = 1. qdd is the last
        step's velocity change (explicit, but D is small next to M, so it stays stable)."""
        st = pb.getJointStates(self.rid, self._ro_ids, physicsClientId=self.cid)
        qd = np.array([s[1] for s in st])
        prev, self._ro_qd = self._ro_qd, qd
        if prev is None:
            return np.zeros(len(self._ro_rows))
        qdd = (qd - prev) / self.world.dt
        axis = self._axes(ls)[self._ro_ids]  # `ls`: every link's state
        a = axis
        W = (axis @ axis.T) * self._ro_anc  # W[k, i] = axis_k . axis_i for ancestors i of k
        # D qdd = sum_k a_k (w_k (w_k . qdd) - e_k qdd_k), with w_k = W[k] + e_k
        w = W + np.eye(len(a))
        Dq = w.T @ (self._ro_arm * (w @ qdd)) - self._ro_arm * qdd
        return np.asarray(Dq[self._ro_rows], dtype=float)

    def _axes(self, ls: Any) -> np.ndarray:
        """Every joint's axis in the world from every link's state `ls` (once a step)."""
        if self._axes_of is not ls:
            quat = np.array([s[5] for s in ls])  # xyzw
            a = self._gc_axis
            qv, qw = quat[:, :3], quat[:, 3:]
            t = 2 * _cross(qv, a)
            self._axes_all = a + qw * t + _cross(qv, t)
            self._axes_of = ls
        return self._axes_all

    def _gravity(self, ls: Any = None) -> np.ndarray:
        """Torques (forces) that cancel gravity at the PD joints at the current pose (`ls`:
        every link's state, queried when not given)."""
        if ls is None:
            ls = pb.getLinkStates(
                self.rid, self._gc_links, computeForwardKinematics=True, physicsClientId=self.cid
            )
        com = np.array([s[0] for s in ls])
        weight, force = self._gc_weight, self._gc_force
        ids = self.pd_ids
        origin = np.array([ls[j][4] for j in ids])
        axis = self._axes(ls)[ids]  # joint axes in the world
        moment = self._gc_below @ _cross(com, weight) - _cross(origin, force)
        torque = np.sum(moment * axis, axis=1)
        lin = np.sum(force * axis, axis=1)
        return np.asarray(-np.where(self._gc_prismatic, lin, torque), dtype=float)

    def effort(self, u: np.ndarray, q: np.ndarray, qd: np.ndarray) -> np.ndarray:
        """Joint torque the models produce for command u at state (q, qd); servo joints
        report NaN (PyBullet does not expose the constraint force cheaply)."""
        out = np.full(len(self.joints), np.nan)
        if len(self.pd):
            m = self.n_pd
            tau = self.kp[:m] * (u[self.pd] - q[self.pd]) - self.kd[:m] * qd[self.pd]
            out[self.pd] = np.clip(tau, -self.pd_force[:m], self.pd_force[:m])
        if len(self.tq):
            out[self.tq] = self.torques(u) - self.emf * qd[self.tq]
        return out
