"""Policies page: train a reach policy with CEM from the page (a child process), watch the
learning curve grow, cancel and resume it, then find the policy in the list with its twin
success and Wilson 95 % interval; Evaluate adds a run; hand-set randomization draws stay
inside the typed range."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PySide6 import QtCore

from app.workflows import train as train_flow
from app.workflows import twin as twin_flow
from resources.jobs import run_to_end
from resources.project import Project

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def _wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def test_train_cancel_resume_evaluate(window, controller, qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proj = controller.new_project(tmp_path / "p")
    tid = run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    controller.notify_project_changed()
    page = window.show_step("policies")
    qtbot.waitUntil(lambda: not page.showing_empty_state(), timeout=5000)
    assert page.setup.twin_combo.currentData() == tid
    assert page.setup.task_combo.currentData() == "reach"
    # the task's settings come with units
    assert (
        page.setup.knobs["episode_s"].suffix() == " s"
        and page.setup.knobs["success_tol"].suffix() == " rad"
    )

    # hand-set randomization: the training draws stay inside the typed range
    page.setup.setCurrentIndex(1)
    page.setup.dr_combo.setCurrentIndex(page.setup.dr_combo.findData("manual"))
    rows = {
        page.setup.param_table.item(r, 0).text(): r
        for r in range(page.setup.param_table.rowCount())
    }
    name = "robot.joints.panda_joint2.damping"
    assert name in rows
    page.setup.param_table.item(rows[name], 2).setText("uniform:0.1:0.2")
    page.setup.param_table.item(rows[name], 0).setCheckState(QtCore.Qt.CheckState.Checked)
    names, draws = page.dist_view.last
    assert names == [name] and draws.shape == (400, 1)
    assert 0.1 <= draws.min() < 0.11 and 0.19 < draws.max() <= 0.2
    assert name in page.dist_view.shown
    page.setup.dr_combo.setCurrentIndex(page.setup.dr_combo.findData("none"))

    # a tiny CEM run
    page.setup.setCurrentIndex(2)
    page.setup.budget.setValue(8)
    page.setup.population.setValue(4)
    page.setup.episodes.setValue(1)
    page.setup.after_eval.setValue(4)
    page.setup.knobs["episode_s"].setValue(1.0)
    argv = page.setup.train_argv()
    assert argv[argv.index("--budget") + 1] == "8" and "episode_s=1" in argv
    page.train_btn.click()
    assert page.cancel_btn.isEnabled() and not page.train_btn.isEnabled()
    qtbot.waitUntil(lambda: page.curve_points() >= 1, timeout=90000)
    assert page.curve_x[0] == 4.0  # 4 candidates x 1 episode in the first generation
    assert 0.0 <= page.curve_y[0] <= 1.0
    page.cancel_btn.click()
    qtbot.waitUntil(lambda: page.train_btn.isEnabled(), timeout=60000)
    assert "cancelled" in page.status.text()
    assert page.resume_btn.isEnabled()
    n_cancel = page.curve_points()
    assert 1 <= n_cancel < 8
    run = page._run
    assert run and (proj.root / ".train" / run / "cem.json").is_file()
    assert Project.open(proj.root).artifacts("policy") == []
    # the run's settings are kept with its checkpoint, so a later session can resume it too
    assert train_flow.interrupted_runs(controller.project) == {run: page._argv}
    from widgets.policies_page import PoliciesPage

    later = PoliciesPage(controller)  # e.g. the app opened again
    qtbot.addWidget(later)
    assert later.resume_btn.isEnabled() and f"Run {run} was interrupted" in later.status.text()
    later.detach()

    page.resume_btn.click()
    qtbot.waitUntil(lambda: page.table.rowCount() == 1, timeout=120000)
    assert page.train_btn.isEnabled()
    assert page.curve_points() > n_cancel  # the curve carried on growing
    xs = page.curve_x
    assert all(b > a for a, b in zip(xs, xs[1:], strict=False))
    proj = controller.project
    pol = proj.artifacts("policy")[-1]
    assert list(pol.inputs) == [tid] and pol.settings["run"] == run
    curve = json.loads((proj.path_of(pol.id) / "curve.json").read_text())
    assert [r["generation"] for r in curve] == list(range(1, 9))
    assert set(xs) <= {float(r["episodes"]) for r in curve}
    assert not (proj.root / ".train" / run).exists()
    ev = json.loads((proj.path_of(pol.id) / "policy.json").read_text())["record"]["evaluation"]
    k, n = ev["nominal"]["successes"], ev["nominal"]["episodes"]
    assert n == 4
    lo, hi = _wilson(k, n)
    assert ev["nominal"]["ci95"] == pytest.approx([lo, hi], abs=1e-6)
    cell = page.table.rows[pol.id][page.table.NOMINAL]
    assert cell == f"{100 * k / n:.0f} % ({100 * lo:.0f}–{100 * hi:.0f} %, n=4)"
    assert page.table.selected() == pol.id
    assert f"twin {tid}" in page.lineage.text()

    # Evaluate: a run artifact; the list shows the new interval (more episodes)
    page.eval_episodes.setValue(6)
    page.eval_btn.click()
    qtbot.waitUntil(lambda: "n=6" in page.table.rows[pol.id][page.table.NOMINAL], timeout=60000)
    runs = controller.project.artifacts("run")
    assert len(runs) == 1 and list(runs[0].inputs) == [pol.id, tid]
    res = json.loads((controller.project.path_of(runs[0].id) / "eval.json").read_text())
    assert res["ci95"] == pytest.approx(list(_wilson(res["successes"], 6)), abs=1e-6)


def test_posterior_randomization_shows_the_fit_next_to_training(
    window, controller, qtbot, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    from resources import atomic

    proj = controller.new_project(tmp_path / "p")
    tid = run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    name = "robot.joints.panda_joint2.damping"
    samples = np.random.default_rng(0).uniform(0.05, 0.15, (50, 1))
    with proj.new_artifact("fit", inputs=[tid], settings={"twin": tid}) as f:
        atomic.write_json(f / "fit.json", {"status": "done", "twin": tid, "estimate": {name: 0.1}})
        np.savez(f / "samples.npz", names=np.array([name]), x=samples)
    fid = proj.artifacts("fit")[-1].id
    controller.notify_project_changed()
    page = window.show_step("policies")
    qtbot.waitUntil(lambda: page.setup.fit_combo.currentData() == fid, timeout=5000)
    page.setup.setCurrentIndex(1)
    page.setup.dr_combo.setCurrentIndex(page.setup.dr_combo.findData("posterior"))
    names, draws = page.dist_view.last
    assert names == [name] and name in page.dist_view.shown
    # every episode takes one posterior row: the training draws are the fit's samples
    assert np.isin(draws[:, 0], samples[:, 0]).all()
    assert len(np.unique(draws)) > 30
    argv = page.setup.train_argv()
    assert argv[argv.index("--dr") + 1] == "posterior" and argv[argv.index("--fit") + 1] == fid
    # no fit chosen for a posterior: Train says what to do instead of starting
    page.setup.fit_combo.clear()
    page.train_btn.click()
    assert "fit it on the Calibrate page" in page.status.text() and page.train_btn.isEnabled()
    # a training process that fails leaves the page usable and says why
    page.setup.dr_combo.setCurrentIndex(page.setup.dr_combo.findData("manual"))
    page.setup.param_table.item(0, 2).setText("uniform:2:1")
    page.setup.param_table.item(0, 0).setCheckState(QtCore.Qt.CheckState.Checked)
    assert "high is below low" in page.dist_view.message
    page.train_btn.click()
    qtbot.waitUntil(lambda: page.train_btn.isEnabled(), timeout=60000)
    assert (
        page.status.text().startswith("Training failed")
        and "high is below low" in page.status.text()
    )
    assert controller.project.artifacts("policy") == []


def test_training_distribution_is_redrawn_when_its_page_is_shown(
    window, controller, qtbot, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A change made while another page is shown (a fit or refit lands, a range is edited)
    redraws the distribution when the Policies page is next shown, not on the window's
    thread in the middle of the other page's work."""
    proj = controller.new_project(tmp_path / "p")
    run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    controller.notify_project_changed()
    page = window.show_step("policies")
    qtbot.waitUntil(lambda: not page.showing_empty_state(), timeout=5000)
    page.setup.setCurrentIndex(1)
    page.setup.dr_combo.setCurrentIndex(page.setup.dr_combo.findData("manual"))
    rows = {
        page.setup.param_table.item(r, 0).text(): r
        for r in range(page.setup.param_table.rowCount())
    }
    row = rows["robot.joints.panda_joint2.damping"]
    page.setup.param_table.item(row, 2).setText("uniform:0.1:0.2")
    page.setup.param_table.item(row, 0).setCheckState(QtCore.Qt.CheckState.Checked)
    assert page.dist_view.last[1].max() <= 0.2

    window.show_step("twin")
    qtbot.waitUntil(lambda: not page.isVisible(), timeout=5000)
    page.setup.param_table.item(row, 2).setText("uniform:0.5:0.6")
    qtbot.wait(50)
    assert page.dist_view.last[1].max() <= 0.2  # hidden: not redrawn yet
    window.show_step("policies")
    qtbot.waitUntil(lambda: page.dist_view.last[1].min() >= 0.5, timeout=5000)
    assert page.dist_view.last[1].max() <= 0.6
