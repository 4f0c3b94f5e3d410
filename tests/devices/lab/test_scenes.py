"""Every registered lab scene builds and steps; configs round-trip; the U-block is sound."""

from __future__ import annotations

import numpy as np
import pytest

from devices.lab.config import LabConfig, LabError
from devices.lab.meshes import load_mesh, u_block_parts
from devices.lab.scenes import SCENES, build_model, default_config_path
from devices.lab.sim import LabSim


@pytest.mark.parametrize("name", sorted(SCENES))
def test_scene_builds_and_steps(name: str) -> None:
    sim = LabSim(name)
    sim.run_for(0.2)
    assert sim.time == pytest.approx(0.2, abs=sim.dt)
    assert np.all(np.isfinite(sim.data.qpos))
    s = sim.read_state()
    assert s.joint_pos.shape == (len(SCENES[name].joint_names),)
    assert s.seq == round(0.2 / sim.dt)


@pytest.mark.parametrize("name", sorted(SCENES))
def test_default_config_round_trips_and_matches_bundled_file(name: str, tmp_path) -> None:
    cfg = SCENES[name].default_config()
    p = tmp_path / "c.json"
    cfg.save(p)
    assert LabConfig.load(p) == cfg
    assert LabConfig.load(default_config_path(name)) == cfg, (
        "resources/lab JSON is stale: run python -m devices.lab.scenes"
    )


def test_bad_configs_are_named() -> None:
    cfg = SCENES["panda_table"].default_config().to_dict()
    cfg["objects"][0]["mass"] = -1.0
    with pytest.raises(LabError, match="box"):
        LabConfig.from_dict(cfg)
    with pytest.raises(LabError, match="unknown lab scene"):
        build_model("no_such_scene")
    with pytest.raises(LabError, match="not a valid lab config"):
        LabConfig.from_dict({"scene": "pendulum", "bogus": 1})


def test_panda_has_seven_actuated_joints_and_truth_applied() -> None:
    sim = LabSim("panda_table")
    m, cfg = sim.model, sim.config
    assert m.nu == 7
    np.testing.assert_allclose(m.dof_damping[:7], cfg.joints.damping)
    np.testing.assert_allclose(m.dof_frictionloss[:7], cfg.joints.frictionloss)
    np.testing.assert_allclose(m.actuator_ctrlrange[:, 1], cfg.actuators.force_limit)
    for o in cfg.objects:
        assert m.body(o.name).mass[0] == pytest.approx(o.mass)
        np.testing.assert_allclose(m.body(o.name).ipos, o.com_offset, atol=1e-12)


def test_u_block_is_non_convex_and_parts_tile_it() -> None:
    m = load_mesh("u_block")
    assert m.is_watertight
    assert m.volume < 0.8 * m.convex_hull.volume  # really non-convex
    parts = u_block_parts()
    assert all(p.is_convex for p in parts)
    assert sum(p.volume for p in parts) == pytest.approx(m.volume, rel=1e-9)


@pytest.mark.parametrize("name", sorted(SCENES))
def test_randomized_truth_differs_builds_and_round_trips(name: str, tmp_path) -> None:
    from devices.lab.randomize import randomized_config

    base = SCENES[name].default_config()
    cfg = randomized_config(name, np.random.default_rng(3), rel=0.2)
    if base.actuators is not None:
        ratio = np.array(cfg.actuators.kp) / np.array(base.actuators.kp)
        assert np.all((ratio >= 0.8) & (ratio <= 1.2)) and np.all(ratio != 1.0)
    for a, b in zip(cfg.objects, base.objects, strict=True):
        assert 0.8 <= a.mass / b.mass <= 1.2 and a.mass != b.mass
    cfg.save(tmp_path / "r.json")
    sim = LabSim(name, tmp_path / "r.json")
    sim.run_for(0.1)
    assert np.all(np.isfinite(sim.data.qpos))
