"""Contact pairs (twins/contacts.py): a twin can say the μ and e of one object's contact with
the ground as the pair's own values; PyBullet multiplies the two bodies' values, and the
builder hides that."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from devices.poses import POSE_UNIT
from devices.trajectory import Trajectory
from twins.builder import TwinWorld
from twins.engine import pb
from twins.errors import TwinError
from twins.make import assemble, primitive_object, sim_params, with_contact_pair
from twins.object_motion import FALLING_KEY, TWIST_KEY
from twins.params import ParamSet
from twins.retune import retune
from twins.rigs import cube_toss_twin
from twins.simulate import replay, replay_in
from twins.spec import TwinSpec, param

H = 0.0524
MU, E = "contacts.cube.ground.friction", "contacts.cube.ground.restitution"


def _bodies_twin() -> TwinSpec:
    cube = primitive_object("cube", "box", (H, H, H), (0, 0, 0.5, 0, 0, 0, 1), mass=1.0)
    spec = assemble("bodies", objects=[cube], sim=sim_params(time_step=1 / 480))
    return replace(spec, object_sleeping=False)


def _toss() -> Trajectory:
    """A toss that lands on an edge, slides and tumbles (poses only: the start state)."""
    t = np.arange(0, 0.8, 1 / 150)
    pose = np.tile([0.0, 0.0, 0.2, 0.2, 0.1, 0.0, 0.97], (len(t), 1))
    pose[:, 3:] /= np.linalg.norm(pose[0, 3:])
    meta = {TWIST_KEY: {"cube": [1.2, 0.3, 0.4, 2.0, -3.0, 4.0]}, FALLING_KEY: {"cube": True}}
    return Trajectory(t, {"objects/cube/pose": pose}, {"objects/cube/pose": POSE_UNIT}, meta=meta)


def test_the_builder_writes_the_pair_on_the_object_and_one_on_the_ground() -> None:
    spec = cube_toss_twin(table_z=0.0, friction=0.18, restitution=0.125)
    assert MU in spec.params and E in spec.params
    assert (
        "objects.cube.friction" not in spec.params and "env.ground.restitution" not in spec.params
    )
    with TwinWorld(spec) as w:
        cube = pb.getDynamicsInfo(w.bodies["cube"].body_id, -1, physicsClientId=w.cid)
        ground = pb.getDynamicsInfo(w.bodies["ground"].body_id, -1, physicsClientId=w.cid)
        assert (cube[1], cube[5]) == pytest.approx((0.18, 0.125))
        assert (ground[1], ground[5]) == pytest.approx((1.0, 1.0))
    again = TwinSpec.from_json(spec.to_json())
    assert again.params[E].nominal == 0.125


def test_a_pair_moves_the_cube_as_the_product_of_the_body_values_would() -> None:
    """The pair (μ 0.25, e 0.3) against bodies 0.5 x 0.5 and 0.6 x 0.5: the same toss to
    the sample; the bodies' 0.5 x 0.5 read as a pair would be μ 0.5, a different toss."""
    bodies = _bodies_twin()
    pair = with_contact_pair(bodies, "cube", "ground", friction=0.25, restitution=0.3)
    prod = {
        "objects.cube.friction": 0.5,
        "env.ground.friction": 0.5,
        "objects.cube.restitution": 0.6,
        "env.ground.restitution": 0.5,
    }
    a = replay(pair, None, _toss())["objects/cube/pose"]
    b = replay(bodies, prod, _toss())["objects/cube/pose"]
    assert np.abs(a - b).max() < 1e-9
    c = replay(pair, {MU: 0.5}, _toss())["objects/cube/pose"]
    assert np.abs(a[:, :3] - c[:, :3]).max() > 0.01


def test_the_pair_friction_is_the_sliding_deceleration_over_g() -> None:
    spec = cube_toss_twin(table_z=0.0, friction=0.3)
    with TwinWorld(spec) as w:
        w.set_object_pose("cube", np.array([0, 0, H, 0, 0, 0, 1.0]), np.array([2.0, 0, 0, 0, 0, 0]))
        v = []
        for _ in range(70):
            w.step()
            v.append(pb.getBaseVelocity(w.bodies["cube"].body_id, physicsClientId=w.cid)[0][0])
    decel = (v[10] - v[60]) / (50 * w.dt)
    assert decel / 9.81 == pytest.approx(0.3, rel=0.06)


def test_a_retuned_pair_replays_as_a_fresh_build() -> None:
    spec = cube_toss_twin(table_z=0.0)
    new = {MU: 0.2, E: 0.4}
    with TwinWorld(spec) as w:
        assert retune(w, new)
        got = replay_in(w, _toss())["objects/cube/pose"]
    fresh = replay(spec, new, _toss())["objects/cube/pose"]
    assert np.abs(got - fresh).max() < 1e-12


def test_contradicting_pairs_are_refused_naming_the_parameter() -> None:
    spec = cube_toss_twin(table_z=0.0)
    with pytest.raises(TwinError, match=r"'objects\.cube\.friction' would be overwritten"):
        replace(spec, params=spec.params.merged([param("objects.cube.friction", "1", 0.5, 0, 2)]))
    stray = param("contacts.ball.ground.friction", "1", 0.5, 0, 2)
    with pytest.raises(TwinError, match=r"'contacts\.ball\.ground\.friction' names object 'ball'"):
        replace(spec, params=spec.params.merged([stray]))
    bad = param("contacts.cube.floor.friction", "1", 0.5, 0, 2)
    with pytest.raises(TwinError, match=r"contacts\.cube\.floor\.friction.*surface one of ground"):
        replace(spec, params=ParamSet([*spec.params.values(), bad]))
    with pytest.raises(TwinError, match="has no object 'ball'"):
        with_contact_pair(_bodies_twin(), "ball")
