"""`python main.py design`: in a project with the demo Panda twin and a recording that moved
only joint 1, the suggestion for pinning down both joints' servo bandwidths is a motion of
joint 4, with the `record` command that makes it; bad names are errors that say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.workflows.twin import build_twin, load_twin
from devices.robots.excitation import plan
from resources.jobs import run_to_end
from resources.project import Project
from twins.fit.design import robot_info_for, simulate_motion, start_pose

pytestmark = pytest.mark.slow
BW = ("robot.actuators.panda_joint1.bandwidth", "robot.actuators.panda_joint4.bandwidth")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, str]:
    proj = Project.create(Path(tmp_path_factory.mktemp("design")) / "p")
    run_to_end(build_twin(proj, None, procedural=True, name="demo"))
    _, spec = load_twin(proj, None)
    info = robot_info_for(spec)
    m = plan(
        "chirp", info, start_pose(spec, info), amplitude=0.1, duration=2.0, joints="panda_joint1"
    )
    rec = simulate_motion(spec, {}, m).with_channels(source="real")
    with proj.new_artifact("trajectory", summary="chirp joint 1") as folder:
        rec.save(folder)
    return proj, proj.artifacts("trajectory")[-1].id


def test_design_suggests_exciting_what_is_still_unknown(
    project: tuple[Project, str], capsys: pytest.CaptureFixture[str]
) -> None:
    proj, tid = project
    code = main(
        [
            "design",
            "--project",
            str(proj.root),
            "--params",
            *BW,
            "--trajectories",
            tid,
            "--duration",
            "2",
            "--candidates",
            "chirp:panda_joint1",
            "steps:panda_joint2",
            "chirp:panda_joint4",
            "--json",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    ranking = json.loads(out.strip().splitlines()[-1])["ranking"]
    assert [r["name"] for r in ranking][0] == "chirp:panda_joint4"
    best = ranking[0]
    assert best["std_shrink"][BW[1]] > 0.9 and best["gain_nats"] > 3
    # joint 2's steps leave both joints' commands unchanged: next to nothing to learn
    j2 = next(r for r in ranking if r["name"] == "steps:panda_joint2")
    assert j2["gain_nats"] < 0.05 * best["gain_nats"]
    assert "next: python main.py record --motion chirp" in out and "--joints panda_joint4" in out


def test_design_names_bad_parameters_and_candidates(
    project: tuple[Project, str], capsys: pytest.CaptureFixture[str]
) -> None:
    proj, tid = project
    assert main(["design", "--project", str(proj.root), "--params", "robot.wings.span"]) == 2
    assert "no parameter(s) ['robot.wings.span']" in capsys.readouterr().err
    code = main(["design", "--project", str(proj.root), "--params", BW[0], "--candidates", "dance"])
    assert code == 2 and "no candidate(s) ['dance']" in capsys.readouterr().err
