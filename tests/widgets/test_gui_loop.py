"""The whole loop in the GUI, on the virtual lab, with small budgets (issue 12 part 8):
scan (Scan page, virtual lab quick guided scan, accept) -> twin (Twin page, from the scan) ->
record (Record panel, a chirp on the connected lab robot) -> fit (Fit window) -> train
(Policies page, CEM under the fit's posterior) -> deploy (Deploy page: predict, run) ->
refit (Send to Real2Sim) -> retrain (from the refit). Every step goes through the widgets a
user clicks; at the end the artifacts and their lineage make one chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.demo import LabLink
from app.workflows.twin import load_twin
from devices.robots.client import RobotClient
from devices.robots.launch import start_lab_process

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.realtime]
DAMPING = "robot.joints.panda_joint2.damping"
# Issue 24's target for the longest event-loop stall of a step is 200 ms, a benchmark figure
# (`bench loop`); this test holds a regression bound the old code broke in every run.
STALL_BOUND_MS = 600.0


def _shot(window: Any, qtbot: Any, name: str) -> None:
    """With $TWINBENCH_LOOP_SHOTS set to a folder, save the window as NAME.png (run under
    Xvfb with QT_QPA_PLATFORM=xcb for the README's walkthrough pictures)."""
    import os

    folder = os.environ.get("TWINBENCH_LOOP_SHOTS")
    if not folder:
        return
    from widgets.scene_view import grab_widget

    qtbot.wait(800)  # let plots and the 3D view draw
    Path(folder).mkdir(parents=True, exist_ok=True)
    assert grab_widget(window).save(str(Path(folder) / f"{name}.png"))


def _latest(proj: Any, kind: str, probe: Any = None) -> Any:
    """The newest artifact of `kind`; with `probe`, the test's own read is not a stall."""
    if probe is not None:
        with probe.excluded():
            return _latest(proj, kind)
    proj.refresh()
    arts = proj.artifacts(kind)
    return arts[-1] if arts else None


@pytest.mark.timeout(1200)
def test_demo_scan_twin_record_fit_train_deploy_refit(
    window, controller, qtbot, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from widgets.fit_panel import FitDialog
    from widgets.record_panel import RecordPanel
    from widgets.soak import StallProbe

    proj = controller.new_project(tmp_path / "loop")
    # the event-loop monitor of `bench gui`: the longest stall of each step
    probe = StallProbe(window)
    probe.start()

    # 1. scan: the Scan page's quick guided scan of the virtual lab (calibration, then the
    # workspace; its own lab processes), accepted into the project
    probe.section("scan")
    scan_page = window.show_step("scan")
    assert scan_page.start_scan("lab-quick")
    qtbot.waitUntil(lambda: scan_page.result is not None, timeout=600000)
    assert len(scan_page.result.objects) == 3, scan_page.status.text()
    with qtbot.waitSignal(scan_page.sig_scan_accepted, timeout=60000) as sig:
        scan_page.accept_scan()
    scan_id = sig.args[0]
    probe.pause()
    _shot(window, qtbot, "loop-1-scan")

    # 2. twin: built from that scan on the Twin page
    probe.section("twin")
    twin_page = window.show_step("twin")
    twin_page.build_twin(procedural=False)
    qtbot.waitUntil(lambda: _latest(proj, "twin", probe) is not None, timeout=600000)
    with probe.excluded():
        twin = _latest(proj, "twin")
        assert scan_id in twin.inputs
        _, spec = load_twin(proj, twin.id)
        assert {o.name for o in spec.objects} and DAMPING in spec.params
    qtbot.waitUntil(
        lambda: twin_page.twin_id == twin.id and not twin_page._loading_id, timeout=300000
    )
    qtbot.waitUntil(lambda: not window.runner.running(), timeout=60000)
    probe.pause()
    _shot(window, qtbot, "loop-2-twin")

    # the robot: the virtual lab as its own process, connected like any robot
    lab = start_lab_process("panda_table", extra_args=["--no-cameras"])
    client = RobotClient(lab.host, lab.port, lab.token, name="gui-loop")
    client.connect()
    client.latest_state(timeout_s=5.0)
    controller.attach_robot(LabLink(lab, client, "panda_table"), detail="lab")
    try:
        # 3. record: a chirp of joints 2 and 4 from the Record panel
        probe.section("record")
        panel = RecordPanel(controller)
        qtbot.addWidget(panel)
        panel.motion_box.setCurrentText("chirp")
        panel.duration.setValue(3.0)
        panel.joints.setText("panda_joint2,panda_joint4")
        panel.preview_button.click()
        qtbot.waitUntil(lambda: panel.record_button.isEnabled(), timeout=30000)
        with qtbot.waitSignal(panel.sig_recorded, timeout=60000) as sig:
            panel.record_button.click()
        rec_id = sig.args[0]
        qtbot.waitUntil(lambda: not panel.runner.running(), timeout=10000)
        probe.pause()
        _shot(panel, qtbot, "loop-3-record")

        # 4. fit: the Fit window on that recording, one parameter, a small budget
        probe.section("fit")
        dlg = FitDialog(controller, twin.id, [rec_id], spec.params, [DAMPING])
        qtbot.addWidget(dlg)
        dlg.budget.setValue(8)
        dlg.start()
        qtbot.waitUntil(lambda: dlg.fit_id is not None, timeout=300000)
        with probe.excluded():
            fit = proj.artifact(dlg.fit_id)
            assert list(fit.inputs) == [twin.id, rec_id]
        qtbot.waitUntil(lambda: not window.runner.running(), timeout=30000)
        qtbot.wait(300)  # what the finished fit draws
        assert dlg.pair.shown == [DAMPING]
        probe.pause()
        _shot(dlg, qtbot, "loop-4-fit")

        # 5. train: the Policies page, CEM reach under the fit's posterior, tiny budget
        probe.section("train")
        controller.notify_project_changed()
        pol_page = window.show_step("policies")
        setup = pol_page.setup
        qtbot.waitUntil(lambda: setup.twin_combo.findData(twin.id) >= 0, timeout=10000)
        setup.twin_combo.setCurrentIndex(setup.twin_combo.findData(twin.id))
        setup.dr_combo.setCurrentIndex(setup.dr_combo.findData("posterior"))
        qtbot.waitUntil(lambda: setup.fit_combo.findData(fit.id) >= 0, timeout=10000)
        setup.fit_combo.setCurrentIndex(setup.fit_combo.findData(fit.id))
        setup.budget.setValue(2)
        setup.population.setValue(4)
        setup.episodes.setValue(1)
        setup.after_eval.setValue(4)
        pol_page.train_btn.click()
        qtbot.waitUntil(lambda: _latest(proj, "policy", probe) is not None, timeout=300000)
        qtbot.waitUntil(lambda: pol_page.train_btn.isEnabled(), timeout=60000)
        qtbot.wait(300)  # what the finished training draws
        with probe.excluded():
            policy = _latest(proj, "policy")
            assert list(policy.inputs) == [twin.id, fit.id]
        probe.pause()
        _shot(window, qtbot, "loop-5-policies")

        # 6. deploy: predict in the twin, then run on the lab
        probe.section("deploy")
        controller.notify_project_changed()
        dep = window.show_step("deploy")
        dep.refresh()
        dep.policy_box.setCurrentIndex(dep.policy_box.findData(policy.id))
        dep.predict_button.click()
        qtbot.waitUntil(lambda: dep.run_button.isEnabled(), timeout=60000)
        with qtbot.waitSignal(dep.sig_run_saved, timeout=120000) as sig:
            dep.run_button.click()
        res = sig.args[0]
        assert res.outcome["ended"] == "duration", res.outcome
        assert np.isfinite(res.outcome["final_error"])
        qtbot.waitUntil(lambda: not dep.runner.running(), timeout=30000)
        qtbot.wait(300)  # what the saved run draws
        q_v = controller.robot_state().joint_vel
        assert float(np.max(np.abs(q_v))) < 0.05  # left stopped
        probe.pause()
        _shot(window, qtbot, "loop-6-deploy")

        # 7. refit with the real run, then retrain from the refit
        probe.section("refit")
        with qtbot.waitSignal(dep.sig_refit_done, timeout=600000) as sig:
            dep.refit_button.click()
        with probe.excluded():
            refit = proj.artifact(sig.args[0]) if sig.args[0] in _ids(proj, "fit") else None
            assert refit is not None and res.trajectory_id in refit.inputs
            assert rec_id in refit.inputs  # the fit's recordings plus the new one
        qtbot.waitUntil(lambda: not dep.runner.running(), timeout=30000)
        qtbot.wait(300)
        probe.section("retrain")
        with qtbot.waitSignal(dep.sig_retrained, timeout=600000) as sig:
            dep.retrain_button.click()
        with probe.excluded():
            proj.refresh()
            policy2 = proj.artifact(sig.args[0])
            assert list(policy2.inputs) == [twin.id, refit.id]
        qtbot.waitUntil(lambda: not dep.runner.running(), timeout=30000)
        qtbot.wait(300)
        probe.pause()
        _shot(window, qtbot, "loop-7-retrained")
    finally:
        probe.stop()
        controller.detach_robot()

    worst = probe.worst()
    (tmp_path / "stalls.json").write_text(json.dumps(worst, indent=1))
    print("worst event-loop stall per step (ms):", json.dumps(worst))
    # The GUI thread only draws (issue 24 part 4). Before, the Calibrate page closed its
    # replay world on the GUI thread and opened and drew the twin while out of view: deploy
    # 0.9-1.2 s, refit 0.9-1.6 s, train 0.36-0.86 s; after, on 2 cores: record 45-152,
    # train 15-39, deploy 107-204, refit 184-198, retrain 6-87 ms. Not fixed yet: scan ~300,
    # twin 75-396 (the Twin page's first 3D draw), fit 167-232 ms (the Fit window's plots).
    fixed = ("record", "train", "deploy", "refit", "retrain")
    assert all(worst[k] <= STALL_BOUND_MS for k in fixed), worst

    # the chain: scan -> twin -> recordings -> fit -> policy -> run -> refit -> policy
    run = proj.artifact(res.run_id)
    assert list(run.inputs) == [policy.id, res.trajectory_id]
    chain = [scan_id, twin.id, rec_id, fit.id, policy.id, res.run_id, refit.id, policy2.id]
    assert len(set(chain)) == len(chain)


def _ids(proj: Any, kind: str) -> set[str]:
    proj.refresh()
    return {a.id for a in proj.artifacts(kind)}
