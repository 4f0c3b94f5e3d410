from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pybullet as pb
import pytest

from twins.errors import TwinError
from twins.spec import TwinSpec


def test_json_round_trip_and_version(demo_twin: TwinSpec, tmp_path: Path) -> None:
    d = demo_twin.to_json()
    again = TwinSpec.from_json(json.loads(json.dumps(d)), demo_twin.base_dir)
    assert again.to_json() == d
    assert again.params == demo_twin.params
    loaded = TwinSpec.load(demo_twin.base_dir)  # type: ignore[arg-type]
    assert loaded.to_json() == d
    newer = dict(d, format_version=99)
    with pytest.raises(TwinError, match="version 99"):
        TwinSpec.from_json(newer)
    (tmp_path / "twin.json").write_text("{not json")
    with pytest.raises(TwinError, match="twin.json: unreadable"):
        TwinSpec.load(tmp_path)


def test_every_number_is_a_param(demo_twin: TwinSpec) -> None:
    names = set(demo_twin.params)
    assert set(demo_twin.required_params()) <= names
    for key in (
        "sim.time_step",
        "sim.solver_iterations",
        "objects.u_block.density",
        "objects.box.restitution",
        "env.table.friction",
        "robot.actuators.panda_joint1.bandwidth",
        "robot.joints.panda_joint4.armature",
        "robot.links.panda_link3.mass",
    ):
        assert key in names
        p = demo_twin.params[key]
        assert p.low <= p.nominal <= p.high and p.unit


def test_urdf_export_loads_with_the_same_mass(demo_twin: TwinSpec) -> None:
    folder = demo_twin.base_dir / "urdf"  # type: ignore[operator]
    for o in demo_twin.objects:
        f = folder / f"{o.name}.urdf"
        ET.parse(f)
        cid = pb.connect(pb.DIRECT)
        try:
            bid = pb.loadURDF(str(f), flags=pb.URDF_USE_INERTIA_FROM_FILE, physicsClientId=cid)
            mass = pb.getDynamicsInfo(bid, -1, physicsClientId=cid)[0]
        finally:
            pb.disconnect(cid)
        expected = demo_twin.params.nominal()[f"objects.{o.name}.density"] * o.volume
        assert mass == pytest.approx(expected, rel=1e-6)
    scene = ET.parse(folder / "scene.urdf").getroot()
    assert {j.get("name") for j in scene.findall("joint")} >= {"world_box", "world_table"}


def test_object_moves_and_bad_values(demo_twin: TwinSpec) -> None:
    moved = demo_twin.with_object_pose("box", (0.3, 0.1, 0.1, 0, 0, 0, 1))
    assert np.allclose(moved.object("box").pose[:3], (0.3, 0.1, 0.1))
    assert demo_twin.object("box").pose[0] == pytest.approx(0.56)
    with pytest.raises(TwinError, match="no object 'puck'"):
        demo_twin.object("puck")
    with pytest.raises(TwinError, match="objects.box.friction.*outside its bounds"):
        demo_twin.params.validate({"objects.box.friction": -1})
