"""`twin set TWIN NAME=VALUE ...`: a new twin version at hand-set values (parent: the given
twin, which is never changed); every bad request refused with exit 2, naming the parameter
and the problem, before anything is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from app.cli import main as cli
from app.workflows.twin import load_twin
from devices.trajectory import Trajectory
from resources.project import JOURNAL, Project
from twins.simulate import replay

DAMPING = "robot.joints.panda_joint1.damping"  # N*m*s/rad, [0, 5], nominal 0
BANDWIDTH = "robot.actuators.panda_joint2.bandwidth"  # 1/s, [0.5, 2000], nominal 30
FRICTION = "objects.box.friction"  # unit "1", [0, 2], nominal 0.5
ARM = [f"panda_joint{i}" for i in range(1, 8)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A project with the procedural demo twin (Panda + 3 objects), built once."""
    root = Path(tmp_path_factory.mktemp("set")) / "p"
    Project.create(root)
    assert cli(["twin", "build", "--project", str(root), "--procedural", "--quiet"]) == 0
    (twin,) = Project.open(root).artifacts("twin")
    return root, twin.id


@pytest.fixture
def project(built: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    """A fresh copy of the built project for one test."""
    root = tmp_path / "p"
    shutil.copytree(built[0], root)
    return root, built[1]


def _state(root: Path) -> tuple[bytes, list[str]]:
    return (root / JOURNAL).read_bytes(), sorted(p.name for p in (root / "twins").iterdir())


def test_set_makes_a_new_version_and_leaves_the_old_one(
    project: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root, old = project
    old_json = (root / "twins" / old / "twin.json").read_bytes()
    rc = cli(
        [
            "twin",
            "set",
            "--project",
            str(root),
            old,
            f"{DAMPING}=2.5N*m*s/rad",  # the declared unit, written on
            f"{BANDWIDTH}=12 1/s",  # ... or after a space
            f"{FRICTION}=0.8",  # a bare number
            "--name",
            "panda, damped by hand",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    proj = Project.open(root)
    twins = proj.artifacts("twin")
    assert len(twins) == 2
    new = twins[-1]
    assert new.id != old and new.id in out
    assert new.parent == old and new.inputs == proj.artifact(old).inputs
    # each change printed old -> new with its unit
    assert f"{DAMPING}" in out and "0 -> 2.5 N*m*s/rad" in out
    assert "30 -> 12 1/s" in out and "0.5 -> 0.8 1" in out
    # the artifact says what was set
    for text in (DAMPING, "2.5", BANDWIDTH, "12", FRICTION, "0.8"):
        assert text in new.summary, (text, new.summary)
    assert new.settings["edit_of"] == old
    assert new.settings["set"] == {DAMPING: 2.5, BANDWIDTH: 12.0, FRICTION: 0.8}
    # the old version is untouched; the new one holds the new values and nothing else moved
    assert (root / "twins" / old / "twin.json").read_bytes() == old_json
    _, before = load_twin(proj, old)
    _, after = load_twin(proj, new.id)
    assert after.name == "panda, damped by hand" and before.name != after.name
    assert after.params[DAMPING].nominal == 2.5
    assert after.params[BANDWIDTH].nominal == 12.0
    assert after.params[FRICTION].nominal == 0.8
    changed = {n for n in before.params if before.params[n] != after.params[n]}
    assert changed == {DAMPING, BANDWIDTH, FRICTION}
    assert after.params[DAMPING].low == 0.0 and after.params[DAMPING].high == 5.0
    # `twin info` of the new version lists the new value
    assert cli(["twin", "info", "--project", str(root), "--twin", new.id]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if DAMPING in x)
    assert line.split()[1:3] == ["2.5", "N*m*s/rad"]


def test_the_new_version_replays_with_the_set_damping(
    project: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A 0.5 rad ramp of joint 1 in 0.1 s: the damped twin lags behind the undamped one on
    the way and both settle on the command."""
    root, old = project
    assert cli(["twin", "set", "--project", str(root), old, f"{DAMPING}=5"]) == 0
    capsys.readouterr()
    proj = Project.open(root)
    new = proj.artifacts("twin")[-1].id
    _, before = load_twin(proj, old)
    _, after = load_twin(proj, new)
    assert before.robot is not None
    q0 = np.asarray(before.robot.initial_joint_pos[:7])
    t = np.arange(0.0, 0.5, 0.01)
    U = np.tile(q0, (len(t), 1))
    U[:, 0] += 0.5 * np.minimum(t / 0.1, 1.0)
    rec = Trajectory(
        t,
        {"robot/command": U, "robot/joint_pos": U.copy()},
        {"robot/command": "rad", "robot/joint_pos": "rad"},
        "real",
        {"joint_names": ARM, "command_joints": ARM},
    )
    q_old = replay(before, None, rec)["robot/joint_pos"][:, 0] - q0[0]
    q_new = replay(after, None, rec)["robot/joint_pos"][:, 0] - q0[0]
    assert q_old[10] - q_new[10] > 0.01  # at t = 0.1 s the damped joint is behind
    assert np.all(q_new[1:20] <= q_old[1:20] + 1e-9)
    assert abs(q_new[-1] - 0.5) < 0.01 and abs(q_old[-1] - 0.5) < 0.01


@pytest.mark.parametrize(
    ("assignments", "expected"),
    [
        # unknown name: the closest names suggested
        (
            ["robot.joints.panda_joint1.dampin=1"],
            ["'robot.joints.panda_joint1.dampin'", DAMPING],
        ),
        (["joint1.damping=1"], ["'joint1.damping'", DAMPING]),
        # outside the bounds: bounds and unit named
        ([f"{DAMPING}=7"], [DAMPING, "[0, 5] N*m*s/rad"]),
        ([f"{BANDWIDTH}=0.1 1/s"], [BANDWIDTH, "[0.5, 2000] 1/s"]),
        # not finite
        ([f"{DAMPING}=nan"], [DAMPING, "not finite"]),
        ([f"{DAMPING}=inf"], [DAMPING, "not finite"]),
        ([f"{DAMPING}=-inf"], [DAMPING, "not finite"]),
        # another unit than the declared one: the expected one named
        ([f"{DAMPING}=1N*m*s/deg"], [DAMPING, "'N*m*s/deg'", "'N*m*s/rad'"]),
        (["objects.box.rolling_friction=5mm"], ["objects.box.rolling_friction", "'mm'", "'m'"]),
        # not a number at all
        ([f"{DAMPING}=lots"], [DAMPING, "'lots'", "not a number"]),
        # malformed NAME=VALUE
        ([DAMPING], [f"'{DAMPING}'", "NAME=VALUE"]),
        ([f"{DAMPING}="], [DAMPING, "no value", "NAME=VALUE"]),
        (["=1"], ["'=1'", "NAME=VALUE"]),
        # a count takes whole numbers
        (["sim.substeps=2.5"], ["sim.substeps", "whole number"]),
        # one bad among good ones: nothing is set
        ([f"{FRICTION}=0.8", f"{DAMPING}=9"], [DAMPING, "[0, 5]"]),
        # the same name twice
        ([f"{DAMPING}=1", f"{DAMPING}=2"], [DAMPING, "twice"]),
        # nothing would change
        ([f"{DAMPING}=0"], [DAMPING, "already"]),
    ],
)
def test_bad_requests_are_refused_and_create_nothing(
    project: tuple[Path, str],
    capsys: pytest.CaptureFixture[str],
    assignments: list[str],
    expected: list[str],
) -> None:
    root, old = project
    state = _state(root)
    rc = cli(["twin", "set", "--project", str(root), old, *assignments])
    cap = capsys.readouterr()
    assert rc == 2
    assert cap.err.startswith("error: ")
    for text in expected:
        assert text in cap.err, (text, cap.err)
    assert _state(root) == state
    assert [a.id for a in Project.open(root).artifacts("twin")] == [old]


def test_a_missing_or_wrong_twin_id_is_refused(
    project: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root, old = project
    state = _state(root)
    assert cli(["twin", "set", "--project", str(root), "twin-nope", f"{DAMPING}=1"]) == 2
    err = capsys.readouterr().err
    assert "no twin 'twin-nope'" in err and old in err  # the twins there are listed
    scan = Project.open(root).artifacts("scan")[0].id
    assert cli(["twin", "set", "--project", str(root), scan, f"{DAMPING}=1"]) == 2
    err = capsys.readouterr().err
    assert f"'{scan}'" in err and "is a scan, not a twin" in err
    assert _state(root) == state


def test_an_edit_of_an_edit_chains_parents(
    project: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root, old = project
    assert cli(["twin", "set", "--project", str(root), old, f"{DAMPING}=1"]) == 0
    first = Project.open(root).artifacts("twin")[-1].id
    assert cli(["twin", "set", "--project", str(root), first, f"{DAMPING}=0.25N*m*s/rad"]) == 0
    out = capsys.readouterr().out
    assert "1 -> 0.25 N*m*s/rad" in out
    proj = Project.open(root)
    second = proj.artifacts("twin")[-1]
    assert second.parent == first and proj.artifact(first).parent == old
    assert load_twin(proj, first)[1].params[DAMPING].nominal == 1.0
    assert load_twin(proj, second.id)[1].params[DAMPING].nominal == 0.25
