"""`TwinEnv`: a Gymnasium environment over a twin that sees and acts exactly like a policy
on the robot agent (devices/robots/wire/policy_spec.py, devices/robots/wire/PROTOCOL.md).

Per control tick (the robot's rate): the policy gets the observation the agent would build
(terms of its `PolicySpec`, through the episode's sensor noise, latency and tracking
dropouts), its action in [-1, 1] is scaled and, for `delta` actions, added to the
*observed* joint positions (as the agent adds it to the measured state), blended in over
the agent's start ramp (`start_ramp_s`), then passes the agent's own safety envelope
(devices/robots/agent/safety.py: limits, speed, acceleration, lead on the measured joint; its
stops end the episode as failures), the twin's per-joint actuator latency, and the twin's
actuators.
Physical parameters come from the episode's `Conditions` (policies/randomization.py); the
world is rebuilt only when they change.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray

from devices.poses import drop_spin, pose_to_matrix
from devices.robots.agent.safety import SafetyEnvelope
from devices.robots.agent.safety_config import default_config
from devices.robots.wire.policy_spec import PolicySpec, build_observation
from devices.robots.wire.robot_types import JointLimits, RobotInfo, RobotState
from policies.errors import PolicyError
from policies.randomization import Conditions, Randomization, SensorNoise
from twins.actuators import Actuators
from twins.builder import TwinWorld
from twins.errors import TwinError
from twins.kinematics import RobotKinematics
from twins.spec import TwinSpec

Vec = NDArray[np.float64]


@dataclass(frozen=True)
class TaskConfig:
    """Settings every task shares; tasks subclass it with their own fields."""

    control_rate_hz: float = 250.0  # the robot agent's rate (the lab's and the test driver's)
    episode_s: float = 2.0
    action_scale: float = 0.05  # rad per unit action (delta position)
    # rad/s: a joint's speed limit where the robot's URDF gives none (the agent's envelope
    # takes the URDF's)
    max_joint_speed: float = 1.9
    # s: the agent's start ramp (`run_policy(ramp_s)`; deploy's default 0.5 s) blends the
    # policy's commands in from the start pose, ramp_from + a (cmd - ramp_from) with a
    # rising 0 -> 1 over it; the episode runs episode_s past its end. 0: no ramp
    start_ramp_s: float = 0.0
    joints: tuple[str, ...] = ()  # commanded joints; () = the twin's actuated revolute joints
    # Failure-driven curriculum: initial conditions of real runs that failed ({"start": q,
    # "goal": ..., "object_start": pose}, from their run.json), each episode replays one of
    # them with probability `replay_share` instead of drawing its own.
    replay_starts: tuple[Any, ...] = ()
    replay_share: float = 0.3

    def to_json(self) -> dict[str, Any]:
        return {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()
        }

    def replace(self, overrides: Mapping[str, Any]) -> TaskConfig:
        """Copy with some fields changed; PolicyError naming an unknown field or bad value."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        kw: dict[str, Any] = {}
        for k, v in overrides.items():
            if k not in fields:
                raise PolicyError(
                    f"task config has no setting '{k}' (settings: {', '.join(fields)})"
                )
            cur = getattr(self, k)
            try:
                if isinstance(cur, tuple):
                    kw[k] = tuple(v)
                elif isinstance(cur, bool):
                    kw[k] = bool(v)
                elif isinstance(cur, (int, float)):
                    kw[k] = type(cur)(v)
                else:
                    kw[k] = v
            except (TypeError, ValueError):
                raise PolicyError(
                    f"task setting '{k}': {v!r} is not a {type(cur).__name__}"
                ) from None
        return dataclasses.replace(self, **kw)


def ee_link(spec: TwinSpec) -> str:
    """The end-effector link: a hand/tool/grasp link if the robot names one, else its last
    massive link."""
    assert spec.robot is not None
    links = list(spec.robot.links)
    for key in ("hand", "tool", "ee", "grasp"):
        hit = [n for n in links if key in n and "finger" not in n]
        if hit:
            return hit[0]
    if not links:
        raise PolicyError(f"twin '{spec.name}': robot lists no links to use as end effector")
    return links[-1]


class TwinEnv(gym.Env[NDArray[np.float32], NDArray[np.float32]]):
    """Base of every task. Subclasses set `observation_terms`, and implement `_task_spec`,
    `_place(rng)`, `_reward()`, `_success()` and `_goal_spec()`."""

    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium declares it so)
    observation_terms: ClassVar[tuple[str, ...]] = ("joint_pos", "joint_vel", "target")
    task_name: ClassVar[str] = ""
    spinless: bool = False  # observe the object without its spin about its own z axis

    def __init__(
        self,
        spec: TwinSpec,
        config: TaskConfig,
        randomization: Randomization | None = None,
        seed: int | None = None,
    ) -> None:
        if spec.robot is None:
            raise PolicyError(f"task {self.task_name}: twin '{spec.name}' has no robot")
        self.config = config
        self.twin: TwinSpec = self._task_spec(spec)
        self.dr = randomization or Randomization()
        self.dr.check(self.twin.params)
        robot = self.twin.robot
        assert robot is not None
        acted = {a.joint: a.model for a in robot.actuators}
        kinds = {j.name: j for j in robot.joints}
        joints = config.joints or tuple(
            j.name for j in robot.joints if j.name in acted and j.kind != "prismatic"
        )
        for j in joints:
            if j not in acted:
                raise PolicyError(f"task {self.task_name}: joint '{j}' has no actuator in the twin")
            if acted[j] not in ("servo", "pd"):
                raise PolicyError(
                    f"task {self.task_name}: joint '{j}' is driven by a '{acted[j]}' actuator; "
                    "policies command joint positions (servo or pd)"
                )
        self.joints = tuple(joints)
        n = len(joints)
        self.lower = np.array(
            [kinds[j].lower if kinds[j].lower is not None else -np.pi for j in joints]
        )
        self.upper = np.array(
            [kinds[j].upper if kinds[j].upper is not None else np.pi for j in joints]
        )
        all_names = [j.name for j in robot.joints]
        q_init = np.asarray(robot.initial_joint_pos or [0.0] * len(all_names), float)
        self.q_home = q_init[[all_names.index(j) for j in joints]]
        self.policy_spec = PolicySpec(
            observation=self.observation_terms,
            joints=self.joints,
            action_mode="position",
            action_type="delta",
            action_scale=config.action_scale,
            object=self._object_name(),
            control_rate_hz=config.control_rate_hz,
            object_max_age_s=float(getattr(config, "object_max_age_s", 0.2)),
        )
        dim = self.policy_spec.obs_dim
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (n,), np.float32)
        self._rng = np.random.default_rng(seed)
        self._world: TwinWorld | None = None
        self._world_values: dict[str, float] | None = None
        self._kin = RobotKinematics(self.twin.resolve(robot.urdf), self.joints)
        self._envelope = self._agent_envelope()
        self._ee = ee_link(self.twin)
        self._T_world_base = pose_to_matrix(robot.base_pose)
        self.conditions = Conditions({})
        self.t = 0.0
        self.q = self.q_home.copy()
        self.qd = np.zeros(n)
        self.target = self.q_home.copy()

    # -- task hooks ----------------------------------------------------------------------
    def _task_spec(self, spec: TwinSpec) -> TwinSpec:
        return dataclasses.replace(spec, objects=())

    def _object_name(self) -> str | None:
        return None

    def _place(self, rng: np.random.Generator) -> None:
        raise NotImplementedError

    def _place_replayed(self, cond: Mapping[str, Any]) -> None:
        """Set up one recorded initial condition (see TaskConfig.replay_starts)."""
        raise PolicyError(f"task {self.task_name}: cannot replay recorded initial conditions")

    def _recorded_q(self, cond: Mapping[str, Any]) -> Vec:
        q = np.asarray(cond.get("start", ()), dtype=np.float64)
        if q.shape != self.q_home.shape or not np.all(np.isfinite(q)):
            raise PolicyError(
                f"task {self.task_name}: a replayed start has {q.size} joint values, the twin's "
                f"commanded joints are {len(self.q_home)}"
            )
        return np.clip(q, self.lower, self.upper)

    def _reward(self, action: Vec) -> float:
        raise NotImplementedError

    def _success(self) -> bool:
        raise NotImplementedError

    def _goal_spec(self) -> PolicySpec:
        raise NotImplementedError

    def _true_object_pose(self) -> Vec:
        return np.zeros(7)

    # -- geometry --------------------------------------------------------------------------
    def ee_position(self, q: Vec | None = None) -> Vec:
        """End-effector position (3,) in the world at joint positions `q` (now: measured)."""
        T = self._T_world_base @ self._kin.link_pose(self._ee, self.q if q is None else q)
        return np.asarray(T[:3, 3], float)

    @property
    def world(self) -> TwinWorld:
        if self._world is None:
            raise PolicyError(f"task {self.task_name}: call reset() before step()")
        return self._world

    def _agent_envelope(self, rate_hz: float | None = None) -> SafetyEnvelope:
        """The robot agent's own default envelope (devices/robots/agent/safety.py) over the twin's
        joint limits and the URDF's speed limits (`max_joint_speed` where it has none), at
        the twin's control tick (`rate_hz`; before the first reset the task's control rate):
        the twin's commands are shaped (speed, acceleration, lead on the measured joint,
        braking before limits) and stopped as the agent shapes and stops the policy's on
        the robot. No workspace box: the twin does not know the robot's."""
        vel, eff = self._kin.speed_effort_limits()
        vel = np.where(vel > 0, vel, self.config.max_joint_speed)
        eff = np.where(eff > 0, eff, np.inf)
        info = RobotInfo(
            self.twin.name,
            self.joints,
            JointLimits(self.lower.copy(), self.upper.copy(), vel, eff),
            float(rate_hz or self.config.control_rate_hz),
        )
        return SafetyEnvelope(info, default_config(info))

    @property
    def ramp_s(self) -> float:
        """The agent's start ramp the episode models (s; `TaskConfig.start_ramp_s`)."""
        r = float(self.config.start_ramp_s)
        if not (np.isfinite(r) and r >= 0.0):
            raise PolicyError(f"task {self.task_name}: start_ramp_s must be >= 0 s, got {r}")
        return r

    @property
    def deploy_spec(self) -> PolicySpec:
        """The spec this episode's policy would be uploaded with (its target / goal)."""
        return self._goal_spec()

    # -- gymnasium -------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        rng = self._rng
        self.conditions = self.dr.sample(rng, self.twin.params)
        if self._world is None or self._world_values != self.conditions.values:
            if self._world is not None:
                self._world.close()
            try:
                self._world = TwinWorld(self.twin, self.conditions.values)
            except TwinError as exc:
                raise PolicyError(f"task {self.task_name}: cannot build the twin ({exc})") from exc
            self._world_values = dict(self.conditions.values)
            self._bank = Actuators(self._world, list(self.joints))
            self._bank.units_ok("rad")
        world = self.world
        world.reset()
        self.per_ctrl = max(1, int(round(1.0 / (self.config.control_rate_hz * world.dt))))
        self.ctrl_dt = self.per_ctrl * world.dt
        if abs(self._envelope.dt - self.ctrl_dt) > 1e-9:  # the agent's tick is the twin's
            self._envelope = self._agent_envelope(1.0 / self.ctrl_dt)
        self._ramp = self.ramp_s
        self.n_steps = int(round((self.config.episode_s + self._ramp) / self.ctrl_dt))
        self.k = 0
        self.t = 0.0
        self._place(rng)
        self.replayed = None
        if self.config.replay_starts and rng.random() < self.config.replay_share:
            self.replayed = int(rng.integers(len(self.config.replay_starts)))
            self._place_replayed(self.config.replay_starts[self.replayed])
        self.q, self.qd = world.joint_state(list(self.joints))
        self.cmd = self.q.copy()
        self._ramp_from = self.q.copy()
        self._envelope.start(RobotState(0.0, 0, self.q.copy(), self.qd.copy(), 0.0 * self.qd))
        self._lat = np.asarray(self._bank.latency, float)
        self._hist: deque[tuple[float, Vec]] = deque()
        self._hist.append((-1.0, self.cmd.copy()))
        self._applied = self.cmd.copy()
        self._bank.apply(self.cmd)
        self._true: deque[tuple[Vec, Vec, Vec]] = deque(maxlen=self.conditions.latency_ticks + 1)
        self._true.append((self.q.copy(), self.qd.copy(), self._true_object_pose()))
        self._seen_object = self._as_tracked(self._true[-1][2])  # starts at the scan pose
        self._seen_t = 0.0
        self._next_capture = 0.0
        self._dropout_until = -1.0
        self._captures: deque[tuple[float, Vec | None]] = deque()
        self.stopped = ""
        obs = self._observe()
        return obs, {"target": self.target.copy()}

    def step(
        self, action: NDArray[np.float32]
    ) -> tuple[NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        world = self.world
        a = np.asarray(action, dtype=float).reshape(-1)
        if a.shape != (len(self.joints),):
            raise PolicyError(
                f"task {self.task_name}: action has {a.size} values, the task commands "
                f"{len(self.joints)} joints"
            )
        if not np.all(np.isfinite(a)):  # the agent's envelope stops on NaN: a failure
            self.stopped = "non-finite action"
            obs = self._last_obs
            return obs, -10.0, True, False, self._info()
        a = np.clip(a, -1.0, 1.0)
        q_seen = self._last_obs_q
        cmd = q_seen + self.config.action_scale * a
        if self.k * self.ctrl_dt < self._ramp:  # the agent's start ramp
            cmd = self._ramp_from + (self.k * self.ctrl_dt / self._ramp) * (cmd - self._ramp_from)
        state = RobotState(self.t, self.k, q_seen, self.qd, np.zeros_like(self.qd))
        res = self._envelope.apply("position", cmd, state, self.cmd)
        if res.stop is not None:  # the agent stops the policy; the robot holds
            self.stopped = f"safety: {res.stop}"
            return self._last_obs, -10.0, True, False, self._info()
        cmd = res.command
        self.cmd = cmd
        self._hist.append((self.t, cmd.copy()))
        for _ in range(self.per_ctrl):
            eff = self._effective_command()
            if not np.array_equal(eff, self._applied) or self._bank.needs_per_step:
                self._bank.apply(eff)
                self._applied = eff
            if self._bank.needs_per_step:
                self._bank.before_step()
            world.step()
            self.t += world.dt
        self.k += 1
        self.q, self.qd = world.joint_state(list(self.joints))
        if not (np.all(np.isfinite(self.q)) and np.all(np.abs(self.qd) < 1e3)):
            raise PolicyError(
                f"task {self.task_name}: twin '{self.twin.name}' exploded at t={self.t:.3f} s"
            )
        self._true.append((self.q.copy(), self.qd.copy(), self._true_object_pose()))
        obs = self._observe()
        reward = self._reward(a)
        terminated = bool(self.stopped)
        truncated = self.k >= self.n_steps
        info = self._info()
        if truncated or terminated:
            info["is_success"] = (not terminated) and self._success()
        return obs, float(reward), terminated, truncated, info

    def _info(self) -> dict[str, Any]:
        return {"t": self.t, "stopped": self.stopped}

    def _effective_command(self) -> Vec:
        """Per joint, the newest command older than that joint's actuator latency."""
        if not np.any(self._lat):
            return self._hist[-1][1]
        now = self.t + 1e-9
        eff = self._hist[0][1].copy()
        for tc, c in self._hist:
            ok = tc + self._lat <= now
            eff[ok] = c[ok]
        while len(self._hist) > 2 and self._hist[1][0] + float(self._lat.max()) <= now:
            self._hist.popleft()
        return eff

    def _observe(self) -> NDArray[np.float32]:
        """The agent's observation vector from the (delayed, noisy) measured state, built
        by the agent's own builder (policy_spec.build_observation)."""
        noise: SensorNoise = self.conditions.noise
        rng = self._rng
        q, qd, _ = self._true[0]  # joints: the agent's state latency
        obj = self._true[-1][2]  # the object now: the tracker's own latency applies
        if noise.joint_pos_std:
            q = q + rng.normal(0.0, noise.joint_pos_std, q.shape)
        if noise.joint_vel_std:
            qd = qd + rng.normal(0.0, noise.joint_vel_std, qd.shape)
        self._last_obs_q = q
        pose = None
        if "object_pose" in self.policy_spec.observation:
            pose = self._tracked_object(obj, noise)
        self._last_obs = build_observation(
            self.policy_spec,
            q,
            qd,
            target=self.target,
            object_pose=pose,
            object_goal=self._object_goal(),
        )
        return self._last_obs

    def _object_goal(self) -> Vec:
        return np.zeros(2)

    def _tracked_object(self, true_pose: Vec, noise: SensorNoise) -> Vec:
        """Object pose as the agent would observe it: the camera tracker captures the
        object at its frame rate (noisy; nothing during a dropout), each pose reaches the
        agent `object_latency_s` after its capture, and the policy sees the newest one
        that arrived. When that pose is older than the policy's `object_max_age_s` (or
        the noise's `max_stale_s`) the agent stops the policy, and so does the episode."""
        rng = self._rng
        now = self.t
        dt = getattr(self, "ctrl_dt", 0.0)
        if now + 1e-9 >= self._next_capture:
            period = 1.0 / noise.object_rate_hz if noise.object_rate_hz else 0.0
            self._next_capture = now + period
            every = period or dt
            pose: Vec | None = None
            if now < self._dropout_until:
                pass
            elif noise.dropout_rate_hz and rng.random() < noise.dropout_rate_hz * every:
                self._dropout_until = now + rng.exponential(noise.dropout_mean_s)
            else:
                pose = np.asarray(true_pose, float).copy()
                if noise.object_pos_std:
                    pose[:3] += rng.normal(0.0, noise.object_pos_std, 3)
                if noise.object_yaw_std:
                    h = 0.5 * rng.normal(0.0, noise.object_yaw_std)
                    qz = np.array([0.0, 0.0, np.sin(h), np.cos(h)])
                    pose[3:] = _quat_mul(qz, pose[3:])
                pose = self._as_tracked(pose)
            self._captures.append((now, pose))
        lat = self.conditions.object_latency_s
        while self._captures and self._captures[0][0] + lat <= now + 1e-9:
            tc, seen = self._captures.popleft()
            if seen is not None:
                self._seen_object, self._seen_t = seen, tc
        max_age = min(noise.max_stale_s, self.policy_spec.object_max_age_s)
        if now - self._seen_t > max_age + 1e-9:
            self.stopped = (
                f"object tracking lost: pose {1e3 * (now - self._seen_t):.0f} ms old "
                f"(limit {1e3 * max_age:.0f} ms)"
            )
        return self._seen_object

    def _as_tracked(self, pose: Vec) -> Vec:
        """A symmetric object's spin about its axis is invisible to the camera: the agent
        gets (and the policy sees) its pose without it (devices.poses.drop_spin)."""
        if self.spinless:
            return drop_spin(pose)
        return np.asarray(pose, float).copy()

    def close(self) -> None:
        if self._world is not None:
            self._world.close()
            self._world = None
        self._kin.close()


def _quat_mul(a: Vec, b: Vec) -> Vec:
    """Hamilton product of xyzw quaternions."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array(
        [
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz,
        ]
    )
