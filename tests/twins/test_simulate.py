from __future__ import annotations

import numpy as np
import pytest

from devices.trajectory import Trajectory
from twins.builder import TwinWorld
from twins.errors import TwinError
from twins.make import assemble, primitive_object, sim_params
from twins.rigs import qube_twin
from twins.simulate import replay, rollout
from twins.spec import TwinSpec


def _qube_traj(V: np.ndarray, t: np.ndarray, unit: str = "V") -> Trajectory:
    return Trajectory(
        t,
        {"robot/command": V[:, None], "robot/joint_pos": np.zeros((len(t), 2))},
        {"robot/command": unit, "robot/joint_pos": "rad"},
        meta={"joint_names": ["arm", "pendulum"], "command_joints": ["arm"]},
    )


def test_explosion_names_the_joint_and_time() -> None:
    t = np.arange(0, 1.0, 0.01)
    real = _qube_traj(np.zeros(len(t)), t)
    real = real.with_channels(
        channels={**real.channels, "robot/joint_vel": np.tile([0, 1.0], (len(t), 1))},
        units={**real.units, "robot/joint_vel": "rad/s"},
    )
    # explicit joint damping d dt / I = 5 * 0.01 / 1.3e-4 >> 2: the integrator diverges
    vals = {"robot.joints.pendulum.damping": 5.0, "sim.time_step": 0.01}
    with pytest.raises(TwinError, match=r"exploded: joint '(arm|pendulum)' at t=0\.\d+ s"):
        replay(qube_twin(), vals, real)


def test_wrong_command_unit_is_refused() -> None:
    t = np.arange(0, 0.1, 0.01)
    with pytest.raises(TwinError, match="command unit 'rad' does not fit joint 'arm'.*takes V"):
        replay(qube_twin(), None, _qube_traj(np.zeros(len(t)), t, unit="rad"))


def test_latency_delays_the_response() -> None:
    t = np.arange(0, 0.3, 0.002)
    V = np.where(t >= 0.1, 3.0, 0.0)
    fast = replay(qube_twin(), None, _qube_traj(V, t))
    slow = replay(qube_twin(), {"robot.actuators.arm.latency": 0.05}, _qube_traj(V, t))
    # the delayed motor starts moving 50 ms later: same curve, shifted by 25 samples
    v_fast, v_slow = fast["robot/joint_vel"][:, 0], slow["robot/joint_vel"][:, 0]
    assert np.allclose(v_slow[25 + 50 : 140], v_fast[50:115], atol=1e-6)
    assert np.all(v_slow[: 50 + 25] == 0.0)


def test_objects_fall_and_are_recorded() -> None:
    box = primitive_object("box", "box", (0.05, 0.05, 0.05), (0, 0, 0.5, 0, 0, 0, 1), mass=1.0)
    spec = assemble("drop", None, [box], ground=True, sim=sim_params())
    t = np.linspace(0, 1.0, 11)
    real = Trajectory(
        t,
        {"objects/box/pose": np.tile([0, 0, 0.5, 0, 0, 0, 1.0], (11, 1))},
        {"objects/box/pose": "xyz_m+quat_xyzw"},
    )
    sim = replay(spec, None, real)
    z = sim["objects/box/pose"][:, 2]
    assert z[0] == pytest.approx(0.5) and z[-1] == pytest.approx(0.05, abs=2e-3)


def test_policy_rollout_closed_loop(demo_twin: TwinSpec) -> None:
    q0 = np.asarray(demo_twin.robot.initial_joint_pos)  # type: ignore[union-attr]
    target = q0 + np.r_[0.3, 0, 0, 0, 0, 0, 0, 0, 0]

    def policy(t: float, obs: dict[str, np.ndarray]) -> np.ndarray:
        return target

    with TwinWorld(demo_twin) as w:
        traj = rollout(w, policy, duration=1.0, control_rate_hz=50)
    assert len(traj) == 50 and "objects/box/pose" in traj.channels
    assert traj["robot/joint_pos"][-1, 0] == pytest.approx(0.3, abs=0.01)


def test_com_to_body_matches_matrix_composition() -> None:
    from scipy.spatial.transform import Rotation

    from devices.poses import matrix_to_pose, pose_to_matrix
    from twins.simulate import _com_to_body

    T = np.eye(4)
    T[:3, :3] = Rotation.from_euler("xyz", [0.3, -1.2, 2.5]).as_matrix()
    T[:3, 3] = [0.01, -0.02, 0.03]
    rng = np.random.default_rng(0)
    pos = rng.normal(size=(20, 3))
    quat = Rotation.random(20, random_state=1).as_quat()
    got = _com_to_body(pos, quat, T)
    want = np.stack(
        [matrix_to_pose(pose_to_matrix(np.r_[p, q]) @ T) for p, q in zip(pos, quat, strict=True)]
    )
    assert np.allclose(got, want, atol=1e-12)
    assert np.all(got[:, 6] >= 0)
