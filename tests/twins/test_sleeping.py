"""Resting objects sleep (twins/sleeping.py): same physics when touched, deterministic from
reset, faster when nothing touches them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pybullet as pb
import pytest

from devices.trajectory import Trajectory
from twins.builder import TwinWorld
from twins.make import assemble, primitive_object, sim_params
from twins.simulate import replay_in
from twins.spec import TwinSpec


def _two_boxes(sleep: bool, gap: float = 0.1) -> TwinSpec:
    """Box A at rest; box B at rest `gap` m to its left (-x), 2 cm off-centre (a push
    that turns A one way, not a symmetric one whose turn is decided by round-off)."""
    a = primitive_object("a", "box", (0.05, 0.05, 0.05), (0, 0, 0.05, 0, 0, 0, 1), mass=0.5)
    b = primitive_object(
        "b", "box", (0.05, 0.05, 0.05), (-0.1 - gap, 0.02, 0.05, 0, 0, 0, 1), mass=0.5
    )
    spec = assemble("push", None, [a, b], ground=True, sim=sim_params())
    return dataclasses.replace(spec, object_sleeping=sleep)


def _push(world: TwinWorld, speed: float = 1.5, steps: int = 240) -> np.ndarray:
    """Send B sliding into A; A's body pose after `steps` steps."""
    world.reset()
    world.set_object_pose("b", world.object_pose("b"), np.array([speed, 0, 0, 0, 0, 0.0]))
    world.step(steps)
    return world.object_pose("a")


def test_a_pushed_sleeping_object_moves_like_an_awake_one() -> None:
    with TwinWorld(_two_boxes(True)) as w_on, TwinWorld(_two_boxes(False)) as w_off:
        assert set(w_on.sleepers) == {"a", "b"} and w_off.sleepers == []
        start = w_on.object_pose("a")
        on, off = _push(w_on), _push(w_off)
        # B arrives at ~1.1 m/s (mu g = 4.9 m/s^2 over 0.1 m) and shoves A several cm
        assert on[0] - start[0] > 0.02
        # within the push's own sensitivity: a 0.07 % faster push moves A 1.7 mm and turns
        # it 2 degrees (measured); sleeping vs awake: 1.3 mm, 3.8 degrees
        assert on[:3] == pytest.approx(off[:3], abs=3e-3)
        turn = 2 * np.arccos(min(1.0, abs(float(np.dot(on[3:], off[3:])))))
        assert turn < 0.1
        assert 2 * np.arccos(min(1.0, abs(on[6]))) > 0.1  # A did turn (off-centre push)
        # untouched (too slow to reach A), A stays exactly where it started while asleep
        assert np.array_equal(_push(w_on, speed=0.5), start)


def test_only_objects_at_rest_sleep_and_falling_ones_still_fall() -> None:
    rest = primitive_object("rest", "box", (0.05, 0.05, 0.05), (0, 0, 0.05, 0, 0, 0, 1), mass=1.0)
    drop = primitive_object("drop", "sphere", (0.05,), (0.5, 0, 0.4, 0, 0, 0, 1), mass=1.0)
    with TwinWorld(assemble("mixed", None, [rest, drop], ground=True)) as w:
        assert w.sleepers == ["rest"]
        w.step(240)
        assert w.object_pose("drop")[2] == pytest.approx(0.05, abs=2e-3)
        assert np.array_equal(w.object_pose("rest"), np.asarray(rest[0].pose))


def test_replay_is_deterministic_from_reset_with_sleepers(demo_twin: TwinSpec) -> None:
    assert demo_twin.object_sleeping
    t = np.arange(0, 0.5001, 0.01)
    q0 = np.asarray(demo_twin.robot.initial_joint_pos)  # type: ignore[union-attr]
    cmd = q0 + 0.3 * np.sin(2 * np.pi * t)[:, None] * (np.arange(9) < 7)
    real = Trajectory(t, {"robot/command": cmd}, {"robot/command": "rad"})
    with TwinWorld(demo_twin) as w:
        assert set(w.sleepers) == {o.name for o in demo_twin.objects}
        a = replay_in(w, real)
        # disturb: wake an object by moving it, run on, then replay again from reset
        w.set_object_pose("box", w.object_pose("box") + np.r_[0, 0, 0.05, 0, 0, 0, 0])
        w.step(300)
        b = replay_in(w, real)
    for ch in a.channels:
        assert np.array_equal(a[ch], b[ch], equal_nan=True), ch


def test_sleeping_is_saved_with_the_twin(demo_twin: TwinSpec) -> None:
    off = dataclasses.replace(demo_twin, object_sleeping=False)
    assert TwinSpec.from_json(off.to_json(), demo_twin.base_dir).object_sleeping is False
    d = demo_twin.to_json()
    del d["object_sleeping"]  # twins saved before the setting existed: on
    assert TwinSpec.from_json(d, demo_twin.base_dir).object_sleeping is True


def test_resting_objects_are_not_integrated_when_asleep() -> None:
    """Asleep, resting objects are skipped by the solver (what makes them cheap: the speed
    is in `bench twin`): not one bit of their pose changes over 500 steps, while awake
    the same boxes creep on the contact solver's residuals."""
    boxes = [
        primitive_object(
            f"b{i}", "box", (0.03, 0.03, 0.03), (0.1 * i, 0, 0.03, 0, 0, 0, 1), mass=0.2
        )
        for i in range(6)
    ]
    spec = assemble("rest", None, boxes, ground=True)
    creep = {}
    for sleep in (True, False):
        with TwinWorld(dataclasses.replace(spec, object_sleeping=sleep)) as w:
            w.reset()
            before = [np.asarray(w.object_pose(f"b{i}")) for i in range(6)]
            w.step(500)
            after = [np.asarray(w.object_pose(f"b{i}")) for i in range(6)]
            creep[sleep] = max(
                float(np.max(np.abs(a - b))) for a, b in zip(after, before, strict=True)
            )
    assert creep[True] == 0.0
    assert creep[False] > 0.0


def test_the_robot_pushes_a_sleeping_object_like_an_awake_one(demo_twin: TwinSpec) -> None:
    """The Panda's fingertips sweep through the box's place at 3 cm above the table."""
    box = np.asarray(demo_twin.object("box").pose)
    with TwinWorld(demo_twin) as w:
        tip = w.link_index["panda_grasptarget"]
        down = pb.getQuaternionFromEuler([np.pi, 0, 0])
        keys = np.asarray(
            [
                pb.calculateInverseKinematics(
                    w.robot_id,
                    tip,
                    [x, box[1], 0.03],
                    down,
                    maxNumIterations=200,
                    physicsClientId=w.cid,
                )
                for x in np.linspace(box[0] - 0.15, box[0] + 0.08, 6)
            ]
        )
    t = np.arange(0, 3.0001, 0.01)
    q0 = np.asarray(demo_twin.robot.initial_joint_pos)  # type: ignore[union-attr]
    tk = np.r_[0.0, np.linspace(1.0, 3.0, len(keys))]
    pts = np.vstack([q0, keys])
    cmd = np.stack([np.interp(t, tk, pts[:, j]) for j in range(pts.shape[1])], 1)
    real = Trajectory(t, {"robot/command": cmd}, {"robot/command": "rad"})
    poses = {}
    for sleep in (True, False):
        with TwinWorld(dataclasses.replace(demo_twin, object_sleeping=sleep)) as w:
            assert ("box" in w.sleepers) == sleep
            poses[sleep] = replay_in(w, real)["objects/box/pose"]
    on, off = poses[True], poses[False]
    assert on[-1, 0] - box[0] > 0.05  # pushed along +x
    assert np.abs(on[:, :3] - off[:, :3]).max() < 3e-3  # measured 1.7 mm
    assert np.abs(on[:, 3:] - off[:, 3:]).max() < 5e-3
