"""`train` and `evaluate` from the command line into a project: policy artifacts with their
lineage (twin, fit), a run artifact per evaluation, posterior randomization from a fit's
samples, a training subprocess that reports progress and can be interrupted and resumed,
and bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.workflows.train import (
    TrainRequest,
    load_policy,
    train_job,
    train_subprocess_job,
)
from app.workflows.twin import build_twin
from policies.cem import CemSettings
from policies.errors import PolicyError
from policies.train import TrainSettings
from resources import atomic
from resources.jobs import Progress, run_to_end
from resources.project import Project

pytestmark = pytest.mark.slow
TINY = ["--budget", "1", "--population", "4", "--episodes", "1", "--set", "episode_s=1.0"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, str]:
    root = Path(tmp_path_factory.mktemp("proj")) / "p"
    proj = Project.create(root)
    tid = run_to_end(build_twin(proj, None, procedural=True))
    return proj, tid


def _fit_artifact(proj: Project, tid: str) -> str:
    """A finished fit of the twin with posterior samples (as twins.fit writes them)."""
    with proj.new_artifact("fit", inputs=[tid], settings={"twin": tid}) as f:
        atomic.write_json(f / "fit.json", {"status": "done", "twin": tid})
        x = np.random.default_rng(0).uniform(0.0, 0.2, (50, 1))
        np.savez(f / "samples.npz", names=np.array(["robot.joints.panda_joint2.damping"]), x=x)
    return proj.artifacts("fit")[-1].id


def test_train_and_evaluate_write_artifacts_with_lineage(
    project: tuple[Project, str], capsys: pytest.CaptureFixture[str]
) -> None:
    proj, tid = project
    root = str(proj.root)
    fid = _fit_artifact(proj, tid)
    rc = main(
        [
            "train",
            "--project",
            root,
            "--task",
            "reach",
            "--dr",
            "posterior",
            *TINY,
            "--eval-episodes",
            "4",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    proj = Project.open(proj.root)
    pol_art = proj.artifacts("policy")[-1]
    assert list(pol_art.inputs) == [tid, fid]
    assert pol_art.settings["dr"] == "posterior" and pol_art.settings["trainer"] == "cem"
    pol = load_policy(proj, pol_art.id)
    rec = pol.record
    assert rec["randomization"]["mode"] == "posterior" and rec["randomization"]["n_samples"] == 50
    assert set(rec["evaluation"]) == {"nominal", "posterior"}
    assert rec["evaluation"]["nominal"]["episodes"] == 4
    assert (proj.path_of(pol_art.id) / "curve.json").is_file()
    assert not (proj.root / ".train" / rec["run"]).exists()  # checkpoint cleaned up
    assert f"policy {pol_art.id}" in out and "twin success (posterior)" in out
    rc = main(["evaluate", "--project", root, "--policy", pol_art.id, "--episodes", "4", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    run = Project.open(proj.root).artifact(res["run"])
    assert run.kind == "run" and list(run.inputs) == [pol_art.id, tid]
    assert (
        res["episodes"] == 4 and 0 <= res["ci95"][0] <= res["success_rate"] <= res["ci95"][1] <= 1
    )


def test_bad_input_is_named(
    project: tuple[Project, str], capsys: pytest.CaptureFixture[str]
) -> None:
    proj, _ = project
    root = str(proj.root)
    assert main(["train", "--project", root, "--task", "fly"]) == 2
    assert "unknown task 'fly'" in capsys.readouterr().err
    assert main(["train", "--project", root, "--task", "reach", "--dr", "manual"]) == 2
    assert "--param NAME=DIST" in capsys.readouterr().err
    assert main(["train", "--project", root, "--task", "reach", "--set", "speed=3"]) == 2
    assert "no setting 'speed'" in capsys.readouterr().err
    assert main(["evaluate", "--project", root, "--policy", "policy-nope"]) == 2
    assert "policy-nope" in capsys.readouterr().err
    assert main(["train", "--project", root, "--task", "reach", "--resume", "train-nope"]) == 2
    assert "no training run 'train-nope'" in capsys.readouterr().err
    # a training process that fails says why, and the caller carries on
    with pytest.raises(PolicyError, match=r"exit 2.*unknown task 'fly'"):
        run_to_end(train_subprocess_job(proj.root, ["--task", "fly"]))


def test_subprocess_training_reports_progress_and_resumes_after_interrupt(
    project: tuple[Project, str],
) -> None:
    proj, tid = project
    n_before = len(Project.open(proj.root).artifacts("policy"))
    argv = [
        "--task",
        "reach",
        "--budget",
        "3",
        "--population",
        "4",
        "--episodes",
        "1",
        "--set",
        "episode_s=1.0",
        "--eval-episodes",
        "0",
    ]
    job = train_subprocess_job(proj.root, argv)
    recs: list[Progress] = []
    for rec in job:
        recs.append(rec)
        if "generation 1/3" in rec.message:
            break
    job.close()  # interrupts the child at its next checkpoint
    run = recs[0].partial["run"]
    ckpt = json.loads((proj.root / ".train" / run / "cem.json").read_text())
    assert ckpt["generation"] >= 1
    assert len(Project.open(proj.root).artifacts("policy")) == n_before  # nothing half-saved
    req = TrainRequest(
        "reach",
        tid,
        overrides={"episode_s": 1.0},
        settings=TrainSettings("cem", cem=CemSettings(population=4, generations=3, episodes=1)),
        resume=run,
        eval_episodes=0,
    )
    msgs = []
    pid = run_to_end(train_job(Project.open(proj.root), req), lambda r: msgs.append(r.message))
    gens = [m for m in msgs if "CEM generation" in m]
    assert gens and "generation 1/3" not in " ".join(gens)  # continued, not restarted
    record = load_policy(Project.open(proj.root), pid).record
    assert len(record["curve"]) == 3 and record["run"] == run


def test_retrain_from_the_refit_replays_the_failed_runs(
    project: tuple[Project, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Close the loop (issue 12 part 7): `train --retrain POLICY` trains again with the
    policy's task settings, trainer and budget, under the twin's newest fit's posterior,
    with the initial conditions of its failed real runs replayed in training; its
    successful runs are not."""
    proj, tid = project
    root = str(proj.root)
    assert main(["train", "--project", root, "--task", "reach", *TINY, "--eval-episodes", "0",
                 "--quiet"]) == 0  # fmt: skip
    proj = Project.open(proj.root)
    pid = proj.artifacts("policy")[-1].id
    old = load_policy(proj, pid).record
    fid = _fit_artifact(proj, tid)  # the refit
    q = np.linspace(-0.2, 0.2, 7)
    for ok, shift in ((False, 0.1), (True, -0.1)):  # one failed, one successful real run
        with proj.new_artifact("trajectory", inputs=[pid]):
            pass
        traj = proj.artifacts("trajectory")[-1].id
        out = {"success": ok, "start": (q + shift).tolist(), "goal": (q - shift).tolist()}
        with proj.new_artifact(
            "run", inputs=[pid, traj], settings={"kind": "real-deployment"}
        ) as f:
            atomic.write_json(f / "run.json", out)
    capsys.readouterr()
    rc = main(["train", "--project", root, "--retrain", pid, "--eval-episodes", "0", "--quiet"])
    assert rc == 0, capsys.readouterr().out
    proj = Project.open(proj.root)
    art = proj.artifacts("policy")[-1]
    assert art.id != pid and list(art.inputs) == [tid, fid]
    assert art.settings["dr"] == "posterior" and art.settings["task"] == "reach"
    rec = load_policy(proj, art.id).record
    cfg = rec["task_config"]
    assert cfg["replay_starts"] == [{"start": (q + 0.1).tolist(), "goal": (q - 0.1).tolist()}]
    assert cfg["replay_share"] == pytest.approx(0.3) and cfg["episode_s"] == 1.0
    assert rec["training"]["cem"] == old["training"]["cem"]
    assert rec["training"]["seed"] == old["training"]["seed"] + 1
    # a twin with no fit says what to do first
    fresh = run_to_end(build_twin(proj, None, procedural=True))
    assert main(["train", "--project", root, "--twin", fresh, "--task", "reach", *TINY,
                 "--eval-episodes", "0", "--quiet"]) == 0  # fmt: skip
    orphan = Project.open(proj.root).artifacts("policy")[-1].id
    capsys.readouterr()
    assert main(["train", "--project", root, "--retrain", orphan, "--quiet"]) == 2
    assert "has no fit to retrain from" in capsys.readouterr().err
