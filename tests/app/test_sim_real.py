"""The sim-vs-real table over a project's runs: real success per policy and twin version
with its Wilson interval, the twin's word (its newest evaluation, else the shadow runs'),
and across policies the Pearson correlation and mean gap, checked against numbers worked
out here by hand; runs being written or damaged are left out, never a crash."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.cli import main
from app.workflows.sim_real import sim_real_table
from policies.evaluate import wilson
from resources.project import Project

# name -> (real successes of 4 runs, shadow-predicted successes, twin evaluation rate | None)
POLICIES = {"good": (4, 4, 0.95), "fair": (2, 3, 0.6), "poor": (0, 1, 0.1), "blind": (1, 2, None)}


def _made(p: Project, kind: str, inputs: Sequence[str] = (), files: dict[str, Any] | None = None,
          settings: dict[str, Any] | None = None) -> str:  # fmt: skip
    with p.new_artifact(kind, inputs=list(inputs), settings=settings) as folder:
        for name, body in (files or {}).items():
            (folder / name).write_text(body if isinstance(body, str) else json.dumps(body))
    return p.artifacts(kind)[-1].id


def _project(tmp_path: Path) -> tuple[Project, dict[str, str], dict[str, str]]:
    p = Project.create(tmp_path / "p", "sim-real")
    tw = {"tw1": _made(p, "twin"), "tw2": _made(p, "twin")}
    pid = {name: _made(p, "policy", [tw["tw1"]]) for name in POLICIES}
    for name, (k_real, k_pred, ev) in POLICIES.items():
        if ev is not None:  # an older evaluation, then the newest (which counts)
            for rate in (0.0, ev):
                body = {"success_rate": rate, "episodes": 50}
                _made(p, "run", [pid[name], tw["tw1"]], {"eval.json": body},
                      {"kind": "twin-evaluation"})  # fmt: skip
        for i in range(4):
            traj = _made(p, "trajectory", [pid[name]])
            out = {
                "success": i < k_real,
                "predicted_success": i < k_pred,
                "error_gap": 0.01 * (i + 1) * (-1) ** i,
                "twin": tw["tw1"],
                "task": "reach",
                "robot": "lab",
                "unit": "rad",
            }
            _made(p, "run", [pid[name], traj], {"run.json": out}, {"kind": "real-deployment"})
    # another twin version predicted one run of 'good'; a damaged run of 'fair'
    traj = _made(p, "trajectory", [pid["good"]])
    _made(p, "run", [pid["good"], traj], {"run.json": {"success": False, "twin": tw["tw2"]}},
          {"kind": "real-deployment"})  # fmt: skip
    _made(p, "run", [pid["fair"], traj], {"run.json": "{not json"}, {"kind": "real-deployment"})
    return p, pid, tw


def test_table_matches_the_runs(tmp_path: Path) -> None:
    p, pid, tw = _project(tmp_path)
    table = sim_real_table(p)
    rows = {(r.policy, r.twin): r for r in table.rows}
    assert set(rows) == {(pid[k], tw["tw1"]) for k in POLICIES} | {(pid["good"], tw["tw2"])}
    for name, (k_real, k_pred, ev) in POLICIES.items():
        r = rows[(pid[name], tw["tw1"])]
        assert r.runs == 4 and r.real_success == k_real / 4
        assert r.real_ci95 == pytest.approx(wilson(k_real, 4))
        assert r.predicted_success == k_pred / 4
        assert r.twin_success == (k_pred / 4 if ev is None else ev)
        assert r.mean_error_gap == pytest.approx(0.025)  # mean of 0.01, 0.02, 0.03, 0.04
    other = rows[(pid["good"], tw["tw2"])]
    assert other.runs == 1 and other.real_success == 0.0
    said = [r.twin_success for r in table.rows]
    did = [r.real_success for r in table.rows]
    assert table.pearson == pytest.approx(float(np.corrcoef(said, did)[0, 1]))
    assert table.abs_gap == pytest.approx(float(np.mean(np.abs(np.subtract(said, did)))))


def test_cli_prints_the_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p, pid, _ = _project(tmp_path)
    capsys.readouterr()
    assert main(["evaluate", "--project", str(p.root), "--sim-vs-real", "--json"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(d["rows"]) == 5
    assert d["sim_real_pearson"] == pytest.approx(sim_real_table(p).pearson)
    assert main(["evaluate", "--project", str(p.root), "--sim-vs-real"]) == 0
    out = capsys.readouterr().out
    assert pid["good"] in out and "Pearson" in out and "(shadow)" in out  # 'blind': no eval
    empty = Project.create(tmp_path / "e", "empty")
    assert main(["evaluate", "--project", str(empty.root), "--sim-vs-real"]) == 0
    assert "no real deployments yet" in capsys.readouterr().out
    assert main(["evaluate", "--project", str(empty.root)]) != 0  # neither --policy nor table
