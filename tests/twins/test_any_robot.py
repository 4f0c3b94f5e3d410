"""Any robot: two pybullet_data arms and the real pendulum; bad robot descriptions."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pybullet_data
import pytest

from devices.trajectory import Trajectory
from twins.builder import TwinWorld
from twins.errors import TwinError
from twins.from_scan import robot_into
from twins.make import assemble
from twins.simulate import replay_in
from twins.urdf import loadable_urdf, read_urdf

DATA = Path(pybullet_data.getDataPath())
PEND = Path(__file__).resolve().parents[3] / "shared" / "data" / "real" / "simple_pendulum"


@pytest.mark.parametrize(
    "ref, n",
    [
        ("pybullet_data:franka_panda/panda.urdf", 9),
        ("pybullet_data:kuka_iiwa/model.urdf", 7),
        ("pybullet_data:xarm/xarm6_robot.urdf", 6),
    ],
)
def test_bundled_robots_build_and_follow_commands(ref: str, n: int, tmp_path: Path) -> None:
    robot, params, _ = robot_into(tmp_path, ref)
    spec = assemble("r", (robot, params), ground=False)
    assert len(spec.robot.joints) == n  # type: ignore[union-attr]
    t = np.arange(0, 1.0001, 0.01)
    cmd = 0.2 * np.sin(np.pi * t)[:, None] * np.ones(n)
    with TwinWorld(spec) as w:
        sim = replay_in(w, Trajectory(t, {"robot/command": cmd}, {"robot/command": "rad"}))
    assert np.all(np.isfinite(sim["robot/joint_pos"]))
    # shoulder joint follows within the servo's lag (and gravity sag)
    assert np.abs(sim["robot/joint_pos"][:, 0] - cmd[:, 0]).max() < 0.1


def test_user_urdf_with_missing_meshes_is_copied_and_repaired(tmp_path: Path) -> None:
    src = PEND / "data_urdf_dfki_simple_pendulum.urdf"
    if not src.is_file():
        pytest.skip("shared real data not present")
    robot, params, notes = robot_into(tmp_path, str(src), actuator="torque")
    assert robot.urdf.startswith("robot/") and (tmp_path / robot.urdf).is_file()
    assert any("not found" in n for n in notes)
    spec = assemble("p", (robot, params), ground=False, base_dir=tmp_path)
    with TwinWorld(spec) as w:
        assert w.joint_index == {"Joint_1": 0}


def _urdf(tmp_path: Path, body: str, name: str = "bad.urdf") -> Path:
    p = tmp_path / name
    p.write_text(f'<?xml version="1.0"?><robot name="r">{body}</robot>')
    return p


LINK = (
    '<link name="{n}"><inertial><mass value="{m}"/><inertia ixx="1e-3" ixy="0" ixz="0" '
    'iyy="1e-3" iyz="0" izz="1e-3"/></inertial>{extra}</link>'
)
JOINT = (
    '<joint name="j1" type="revolute"><parent link="a"/><child link="b"/>'
    '<axis xyz="0 0 1"/><limit lower="-1" upper="1" effort="1" velocity="1"/></joint>'
)


def test_bad_robot_descriptions_name_the_element(tmp_path: Path) -> None:
    p = tmp_path / "broken.urdf"
    p.write_text("<robot name='r'><link name='a'></robot>")
    with pytest.raises(TwinError, match="broken.urdf: malformed URDF XML"):
        read_urdf(p)
    neg = _urdf(
        tmp_path, LINK.format(n="a", m=1, extra="") + LINK.format(n="b", m=-2, extra="") + JOINT
    )
    with pytest.raises(TwinError, match="link 'b' has negative mass"):
        read_urdf(neg)
    zero = _urdf(
        tmp_path, LINK.format(n="a", m=1, extra="") + LINK.format(n="b", m=0, extra="") + JOINT
    )
    with pytest.raises(TwinError, match="link 'b' moved by joint 'j1' has mass 0.0 kg"):
        read_urdf(zero)
    orphan = _urdf(tmp_path, LINK.format(n="a", m=1, extra="") + JOINT)
    with pytest.raises(TwinError, match="joint 'j1': refers to unknown link 'b'"):
        read_urdf(orphan)
    with pytest.raises(TwinError, match="nothere.urdf: URDF file not found"):
        read_urdf(tmp_path / "nothere.urdf")


def test_missing_mesh_falls_back_without_touching_the_original(tmp_path: Path) -> None:
    vis = (
        '<visual><geometry><mesh filename="meshes/gone.stl"/></geometry></visual>'
        '<collision><geometry><mesh filename="meshes/gone.stl"/></geometry></collision>'
    )
    src = _urdf(
        tmp_path,
        LINK.format(n="a", m=1, extra="") + LINK.format(n="b", m=1, extra=vis) + JOINT,
        "arm.urdf",
    )
    before = src.read_bytes()
    out, notes = loadable_urdf(src, tmp_path / "fixed")
    assert src.read_bytes() == before and out != src
    assert any("link 'b': visual mesh 'meshes/gone.stl' not found; drawn as" in n for n in notes)
    assert any("no collision shape" in n for n in notes)
    # a found mesh is kept
    (tmp_path / "meshes").mkdir()
    shutil.copyfile(DATA / "cube.obj", tmp_path / "meshes" / "gone.stl.obj")
    assert read_urdf(out).name == "r"


def test_an_effort_of_zero_is_no_limit_given_and_the_build_says_so(tmp_path: Path) -> None:
    """URDF makers write effort="0" where they give no limit (CAD exporters on every joint,
    fixed and passive joints too). It used to become a silent 100 N*m; now the twin's
    build notes name the joint and the value assumed (the default a missing effort gets),
    an actuated joint with a real effort keeps it and says nothing, and a fixed joint's
    effort="0" is not mentioned (nothing drives it)."""
    body = (
        LINK.format(n="a", m=1, extra="")
        + LINK.format(n="b", m=1, extra="")
        + LINK.format(n="c", m=1, extra="")
        + LINK.format(n="d", m=1, extra="")
        + '<joint name="j1" type="revolute"><parent link="a"/><child link="b"/>'
        '<axis xyz="0 0 1"/><limit lower="-1" upper="1" effort="0" velocity="0"/></joint>'
        '<joint name="j2" type="revolute"><parent link="b"/><child link="c"/>'
        '<axis xyz="0 0 1"/><limit lower="-1" upper="1" effort="7" velocity="1"/></joint>'
        '<joint name="tool" type="fixed"><parent link="c"/><child link="d"/>'
        '<limit effort="0" velocity="0"/></joint>'
    )
    robot, params, notes = robot_into(tmp_path, str(_urdf(tmp_path, body, "cad.urdf")))
    by_name = {p.name: p for p in params}
    assert by_name["robot.actuators.j1.effort_limit"].nominal == 100.0
    assert by_name["robot.actuators.j2.effort_limit"].nominal == 7.0
    said = [n for n in notes if n.startswith("joint ")]
    assert len(said) == 1, notes
    assert said[0].startswith("joint 'j1': no effort limit in the URDF (effort missing or 0)")
    assert "robot.actuators.j1.effort_limit" in said[0] and "100 N*m" in said[0]
    assert said[0] in robot.notes  # kept with the twin, shown with its build notes
    spec = assemble("cad", (robot, params), ground=False, base_dir=tmp_path)
    with TwinWorld(spec) as w:
        assert said[0] in w.notes


ARM = (
    '<link name="base"><inertial><mass value="2"/><inertia ixx="1e-2" ixy="0" ixz="0" '
    'iyy="1e-2" iyz="0" izz="1e-2"/></inertial></link>'
    '<link name="upper"><inertial><origin xyz="0 0 0.1"/><mass value="1"/><inertia ixx="1e-3" '
    'ixy="0" ixz="0" iyy="1e-3" iyz="0" izz="1e-3"/></inertial></link>'
    '<joint name="shoulder" type="revolute"><parent link="base"/><child link="upper"/>'
    '<origin xyz="0 0 0.05"/><axis xyz="0 1 0"/>'
    '<limit lower="-2" upper="2" effort="20" velocity="2"/></joint>'
)
WORLD = (
    '<link name="world"/><joint name="world_to_base" type="fixed"><parent link="world"/>'
    '<child link="base"/></joint>'
)


def test_a_urdf_rooted_at_world_is_the_same_robot_fixed_to_it(tmp_path: Path) -> None:
    """A URDF whose root link is `world` (ROS / Gazebo descriptions: the fixed world frame,
    the robot's base welded to it) is accepted and makes the same twin as the robot alone:
    the same joints and parameters (the base welded to the world does not move, so it gets
    no mass parameter, like a fixed base), the same motion under the same commands, and
    link poses in the base frame."""
    specs = {}
    for name, body in (("plain", ARM), ("rooted", WORLD + ARM)):
        folder = tmp_path / name
        folder.mkdir()
        robot, params, _ = robot_into(folder, str(_urdf(tmp_path, body, f"{name}.urdf")))
        specs[name] = assemble(name, (robot, params), ground=False, base_dir=folder)
    plain, rooted = specs["plain"], specs["rooted"]
    assert rooted.robot is not None and plain.robot is not None
    assert [j.name for j in rooted.robot.joints] == ["shoulder"]
    assert sorted(rooted.params) == sorted(plain.params)
    assert not any(n.startswith(("robot.links.base.", "robot.links.world.")) for n in rooted.params)
    t = np.arange(0, 1.0001, 0.01)
    cmd = Trajectory(
        t, {"robot/command": 0.5 * np.sin(np.pi * t)[:, None]}, {"robot/command": "rad"}
    )
    q = {}
    for name, spec in specs.items():
        with TwinWorld(spec) as w:
            q[name] = replay_in(w, cmd)["robot/joint_pos"]
    np.testing.assert_allclose(q["rooted"], q["plain"], atol=1e-9)
    assert np.abs(q["rooted"][:, 0] - cmd["robot/command"][:, 0]).max() < 0.1
    from twins.kinematics import RobotKinematics

    with RobotKinematics(rooted.resolve(rooted.robot.urdf), ["shoulder"]) as kin:
        np.testing.assert_allclose(kin.link_pose("upper", [0.0])[:3, 3], [0, 0, 0.05], atol=1e-9)
