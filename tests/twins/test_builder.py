from __future__ import annotations

import numpy as np
import pybullet as pb
import pytest

from devices.trajectory import Trajectory
from twins import builder
from twins.builder import TwinWorld
from twins.errors import TwinError
from twins.make import assemble, primitive_object, robot_from_urdf, sim_params
from twins.rigs import qube_twin
from twins.simulate import replay_in
from twins.spec import TwinSpec


def test_values_are_written_and_read_back(demo_twin: TwinSpec) -> None:
    vals = {
        "objects.box.density": 800.0,
        "objects.box.friction": 0.9,
        "objects.box.restitution": 0.3,
        "sim.solver_iterations": 80,
        "robot.links.panda_link4.mass": 3.0,
    }
    with TwinWorld(demo_twin, vals) as w:
        info = pb.getDynamicsInfo(w.bodies["box"].body_id, -1, physicsClientId=w.cid)
        assert info[0] == pytest.approx(800.0 * demo_twin.object("box").volume)
        assert info[1] == pytest.approx(0.9) and info[5] == pytest.approx(0.3)
        li = w.link_index["panda_link4"]
        assert pb.getDynamicsInfo(w.robot_id, li, physicsClientId=w.cid)[0] == pytest.approx(3.0)
        assert pb.getPhysicsEngineParameters(physicsClientId=w.cid)["numSolverIterations"] == 80
        assert np.allclose(w.object_pose("box"), demo_twin.object("box").pose, atol=1e-9)


def test_a_value_the_engine_ignores_is_an_error(demo_twin: TwinSpec, monkeypatch) -> None:
    real = pb.getDynamicsInfo

    def ignoring_friction(body: int, link: int, physicsClientId: int = 0):  # noqa: N803
        info = list(real(body, link, physicsClientId=physicsClientId))
        info[1] = 0.5  # as if changeDynamics had silently kept the default
        return tuple(info)

    monkeypatch.setattr(builder.pb, "getDynamicsInfo", ignoring_friction)
    with pytest.raises(
        TwinError, match="parameter 'objects.box.friction': wrote 0.9 but PyBullet reports 0.5"
    ):
        TwinWorld(demo_twin, {"objects.box.friction": 0.9})


def test_reset_makes_rollouts_repeatable(demo_twin: TwinSpec) -> None:
    t = np.arange(0, 1.0001, 0.01)
    q0 = np.asarray(demo_twin.robot.initial_joint_pos)  # type: ignore[union-attr]
    cmd = q0 + 0.4 * np.sin(2 * np.pi * t)[:, None] * (np.arange(9) < 7)
    real = Trajectory(t, {"robot/command": cmd}, {"robot/command": "rad"})
    with TwinWorld(demo_twin) as w:
        a = replay_in(w, real)
        w.step(100)  # disturb, then replay again from reset
        b = replay_in(w, real)
    assert np.array_equal(a["robot/joint_pos"], b["robot/joint_pos"])
    assert np.array_equal(a["objects/u_block/pose"], b["objects/u_block/pose"])
    # the servo tracks the command (bandwidth 30/s: lag error ~ A w / 30 = 0.084 rad) where
    # its effort limit allows (the 12 N*m wrist saturates on this fast motion)
    err = np.abs(a["robot/joint_pos"][:, :4] - cmd[:, :4]).max()
    assert 0.04 < err < 0.12


def _falling_box(restitution: float = 0.0):
    box = primitive_object(
        "box",
        "box",
        (0.05, 0.05, 0.05),
        (0, 0, 0.5, 0, 0, 0, 1),
        mass=1.0,
        material={"restitution": restitution},
    )
    return assemble("drop", None, [box], ground=True, sim=sim_params())


def test_free_fall_matches_analytic() -> None:
    spec = _falling_box()
    with TwinWorld(spec) as w:
        w.step(48)  # 0.2 s, well before touching the ground
        z = w.object_pose("box")[2]
    dt = 1 / 240
    # semi-implicit Euler: z = z0 - g dt^2 n(n+1)/2
    assert z == pytest.approx(0.5 - 9.81 * dt * dt * 48 * 49 / 2, abs=1e-9)


def test_compliant_contact_sinks_by_weight_over_stiffness() -> None:
    box = primitive_object("box", "box", (0.05, 0.05, 0.05), (0, 0, 0.05, 0, 0, 0, 1), mass=1.0)
    spec = assemble(
        "soft", None, [box], ground=True, contact_model="compliant", stiffness=2000.0, damping=200.0
    )
    # box and ground springs in series, 1 / (1/k1 + 1/k2), at each of the 4 corner contacts
    k = 4 * 2000.0 / 2
    with TwinWorld(spec) as w:
        w.step(1200)
        z = w.object_pose("box")[2]
        assert len(pb.getContactPoints(physicsClientId=w.cid)) == 4
    assert 0.05 - z == pytest.approx(9.81 / k, rel=0.05)
    assert "objects.box.contact_stiffness" not in _falling_box().params


def test_dc_motor_reaches_back_emf_speed() -> None:
    spec = qube_twin()
    V = 2.0
    t = np.arange(0, 12.0001, 0.01)  # time constant ~1.5 s once the pendulum flies out
    real = Trajectory(
        t,
        {"robot/command": np.full((len(t), 1), V), "robot/joint_pos": np.zeros((len(t), 2))},
        {"robot/command": "V", "robot/joint_pos": "rad"},
        meta={"joint_names": ["arm", "pendulum"], "command_joints": ["arm"]},
    )
    with TwinWorld(spec) as w:
        sim = replay_in(w, real)
    km, Rm, Dr = 0.042, 8.4, 5e-6
    # steady state: km (V - km w) / Rm = Dr w
    w_ss = km * V / (km * km + Rm * Dr)
    assert sim["robot/joint_vel"][-1, 0] == pytest.approx(w_ss, rel=0.02)


def test_kuka_and_armature(tmp_path) -> None:
    """A second pybullet_data robot; armature adds exactly to the joint inertia."""
    import pybullet_data

    path = f"{pybullet_data.getDataPath()}/kuka_iiwa/model.urdf"
    robot = robot_from_urdf("pybullet_data:kuka_iiwa/model.urdf", path)
    spec = assemble("kuka", robot, ground=False)
    assert len(spec.robot.joints) == 7  # type: ignore[union-attr]
    with (
        TwinWorld(spec) as w0,
        TwinWorld(spec, {"robot.joints.lbr_iiwa_joint_7.armature": 0.05}) as w1,
    ):
        for w in (w0, w1):
            li = w.link_index["lbr_iiwa_link_7"]
            w.info = pb.getDynamicsInfo(w.robot_id, li, physicsClientId=w.cid)[2]  # type: ignore[attr-defined]
        assert w1.info[2] - w0.info[2] == pytest.approx(0.05)  # type: ignore[attr-defined]


def test_fixed_base_mass_is_refused(demo_twin: TwinSpec) -> None:
    assert "robot.links.panda_link0.mass" not in demo_twin.params
