"""The GUI is honest about what it shows (issue 24, parts 5 and 6): artifact pickers choose
the newest artifact of their kind (the twin just built or fitted, not the demo's) and keep a
choice someone made, and show what each artifact is beside its id; the Deploy page's
progress bar starts from 0 for every job (a refit too) and "predicting…" never stands
beside "prediction ready"; the scan previews do not say "press Start scan" during a scan; a
failed job is logged once; the changed pages fit a 1366x768 laptop (screenshots are saved,
also to $TWINBENCH_SHOTS when set)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from app.workflows import fit as fit_flow
from app.workflows.twin import load_twin, save_twin_edit
from devices.errors import DeviceError
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress
from resources.project import Project

pytestmark = [pytest.mark.gui]

FITTED = "fitted to the pendulum release"


def _shot(widget: Any, qtbot: Any, name: str, tmp_path: Path) -> Path:
    """Save what `widget` draws as NAME.png (in $TWINBENCH_SHOTS when set) for a person."""
    from widgets.scene_view import grab_widget

    qtbot.wait(150)  # let the layout settle and the plots draw
    folder = Path(os.environ.get("TWINBENCH_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}.png"
    assert grab_widget(widget).save(str(out)) and out.stat().st_size > 0
    return out


def _twins(proj: Project) -> tuple[str, str]:
    """The demo-like rig twin, then a twin fitted from it (made in that order)."""
    demo = fit_flow.import_rig_twin(proj, "qube_servo2")
    _, spec = load_twin(proj, demo)
    return demo, save_twin_edit(proj, demo, spec, {}, summary=FITTED)


def _policy(proj: Project, twin: str, summary: str) -> str:
    """A policy artifact (its files are not read here: the pickers only list it)."""
    with proj.new_artifact(
        "policy", inputs=[twin], settings={"task": "reach"}, summary=summary
    ) as f:
        (f / "note.txt").write_text("a stand-in policy\n")
    return proj.artifacts("policy")[-1].id


def _texts(combo: Any) -> list[str]:
    return [combo.itemText(i) for i in range(combo.count())]


def _cut_off(root: Any) -> list[str]:
    """Visible one-line texts wider than their room: combo boxes (an artifact picker
    shortens its text with "…" by design) and labels that do not wrap."""
    from PySide6 import QtWidgets

    from widgets.artifact_combo import ArtifactCombo
    from widgets.pages import StatusLine

    style = QtWidgets.QStyle
    out = []
    for w in [root, *root.findChildren(QtWidgets.QWidget)]:
        if not w.isVisible() or w.width() <= 0:
            continue
        if isinstance(w, QtWidgets.QComboBox) and not isinstance(w, ArtifactCombo):
            opt = QtWidgets.QStyleOptionComboBox()
            w.initStyleOption(opt)
            room = w.style().subControlRect(
                style.ComplexControl.CC_ComboBox, opt, style.SubControl.SC_ComboBoxEditField, w
            )
            if w.fontMetrics().horizontalAdvance(w.currentText()) > room.width():
                out.append(f"combo '{w.currentText()}' in {room.width()} px")
        elif (
            isinstance(w, QtWidgets.QLabel)
            and not isinstance(w, StatusLine)
            and not w.wordWrap()
            and w.pixmap().isNull()
            and w.text()
        ):
            need = w.sizeHint().width()
            if need > w.width() + 1:
                out.append(f"label '{w.text()[:40]}' needs {need} px, has {w.width()}")
    return out


# -- 5. pickers ----------------------------------------------------------------------------
def test_pickers_choose_the_newest_keep_a_choice_and_name_it(
    qtbot: Any, controller: Any, tmp_path: Path
) -> None:
    from widgets.calibrate_page import CalibratePage
    from widgets.deploy_page import DeployPage
    from widgets.policies_page import PoliciesPage

    proj = controller.new_project(tmp_path / "p")
    demo = fit_flow.import_rig_twin(proj, "qube_servo2")
    first = _policy(proj, demo, "reach by cem on the demo twin")
    controller.notify_project_changed()
    cal, pol, dep = CalibratePage(controller), PoliciesPage(controller), DeployPage(controller)
    for page in (cal, pol, dep):
        qtbot.addWidget(page)
    twin_pickers = {"Calibrate": cal.twin_combo, "Policies": pol.setup.twin_combo}
    for combo in twin_pickers.values():
        assert combo.currentData() == demo

    # a twin fitted after the demo one, then a policy trained after the first: both chosen
    _, spec = load_twin(proj, demo)
    fitted = save_twin_edit(proj, demo, spec, {}, summary=FITTED)
    second = _policy(proj, fitted, "reach by cem on the fitted twin")
    controller.notify_project_changed()
    qtbot.waitUntil(lambda: dep.policy_box.currentData() == second, timeout=5000)
    for where, combo in twin_pickers.items():
        assert combo.currentData() == fitted, f"{where} kept the older twin"
        assert combo.currentText() == f"{FITTED} — {fitted}", where  # the name, then the id
        assert combo.itemData(0) == fitted and combo.count() == 2  # newest first
        assert _texts(combo)[1].startswith("rig qube_servo2 at its authors' values — ")
        assert fitted in combo.toolTip() and FITTED in combo.toolTip()
    assert dep.policy_box.currentText() == f"reach by cem on the fitted twin — {second}"
    assert dep.policy_box.findData(first) == 1

    # a choice made in the picker stays through refreshes while a newer artifact arrives
    cal.twin_combo.setCurrentIndex(cal.twin_combo.findData(demo))
    cal.twin_combo.activated.emit(cal.twin_combo.currentIndex())
    dep.policy_box.setCurrentIndex(dep.policy_box.findData(first))
    newest = save_twin_edit(proj, fitted, spec, {}, summary="edited by hand")
    third = _policy(proj, newest, "reach by ppo")
    controller.notify_project_changed()
    qtbot.waitUntil(lambda: pol.setup.twin_combo.currentData() == newest, timeout=5000)
    qtbot.wait(50)  # every page has refreshed
    assert cal.twin_combo.currentData() == demo  # chosen by hand: kept
    assert dep.policy_box.currentData() == first and dep.policy_box.findData(third) == 0
    assert cal.twin_combo.findData(newest) == 0


def test_artifact_texts_are_one_line_and_never_blank(qapp: Any, tmp_path: Path) -> None:
    from widgets.artifact_combo import ArtifactCombo, artifact_text

    proj = Project.create(tmp_path / "p")
    with proj.new_artifact("fit", summary="3 params,\n 40 evals\x1b[31m " + "x" * 200):
        pass
    with proj.new_artifact("fit"):
        pass
    long, bare = proj.artifacts("fit")
    text = artifact_text(long)
    assert "\n" not in text and "\x1b" not in text and text.endswith(f"… — {long.id}")
    assert artifact_text(bare) == f"fit — {bare.id}"
    combo = ArtifactCombo()
    combo.set_artifacts(proj.artifacts("fit"), placeholder="2 saved fits — choose one")
    assert combo.currentIndex() == 0 and combo.currentData() is None  # nothing chosen
    assert combo.select(long.id) and combo.currentData() == long.id
    assert combo.select(None) and combo.currentData() is None
    combo.deleteLater()


# -- 6. stale or contradictory text --------------------------------------------------------
def _fake_plan(pid: str) -> Any:
    t = np.linspace(0.0, 1.5, 16)
    q = np.zeros((16, 2))
    q[:, 1] = np.linspace(0.0, 0.5, 16)
    return SimpleNamespace(
        policy_id=pid,
        robot="lab panda",
        twin_id="twin-x",
        goal=np.array([0.0, 0.5]),
        start=np.zeros(2),
        spec=SimpleNamespace(joints=("j1", "j2")),
        config=SimpleNamespace(success_tol=0.05),
        shadow=SimpleNamespace(success=True, final_error=0.01, t=t, joint_pos=q, stopped=""),
    )


def test_deploy_progress_and_prediction_texts_are_never_stale(
    qtbot: Any, controller: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import widgets.deploy_page as deploy_page  # the page's own names are what it calls
    from app.workflows.deploy import DeployResult
    from widgets.deploy_page import DeployPage

    proj = controller.new_project(tmp_path / "p")
    demo, fitted = _twins(proj)
    first = _policy(proj, demo, "reach by cem on the demo twin")
    pid = _policy(proj, fitted, "reach by cem on the fitted twin")
    controller.notify_project_changed()
    page = DeployPage(controller)
    qtbot.addWidget(page)
    page.resize(1366, 700)
    page.show()
    monkeypatch.setattr(page, "_client", lambda: object())
    release = threading.Event()

    def plan_deploy(project: Any, client: Any, policy_id: str, **_: Any) -> Any:
        assert release.wait(10), "the test never released the prediction"
        return _fake_plan(policy_id)

    monkeypatch.setattr(deploy_page, "plan_deploy", plan_deploy)

    # a first prediction: ready, bar full
    release.set()
    page.predict()
    qtbot.waitUntil(lambda: page.plan is not None, timeout=5000)
    assert page.plan.policy_id == pid  # the newest policy, chosen by default
    assert page.status.text().startswith("prediction ready")
    assert page.progress.value() == page.progress.maximum() == 1000

    # predicting again: the old "prediction ready" and the full bar are gone at once
    release.clear()
    page.predict()
    assert "predicting" in page.prediction.text()
    assert "prediction ready" not in page.status.text() and "predicting" in page.status.text()
    assert page.progress.value() <= 0 or page.progress.maximum() == 0  # from 0, or busy
    release.set()
    qtbot.waitUntil(lambda: page.plan is not None, timeout=5000)
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)
    assert "predicting" not in page.prediction.text() and "predicts" in page.prediction.text()
    _shot(page, qtbot, "deploy-prediction-ready", tmp_path)

    # another policy chosen: the prediction shown was for the other one, and says so
    page.policy_box.setCurrentIndex(page.policy_box.findData(first))
    assert page.plan is None and not page.run_button.isEnabled()
    assert "predict again" in page.prediction.text() and "SUCCESS" not in page.prediction.text()
    assert page.curves() == {} and not page.plot.getPlotItem().listDataItems()  # nor its curves
    assert "prediction ready" not in page.status.text()

    # a refit after a run: its bar starts from 0 (not the run's 100 %) and follows the fit
    go = threading.Event()

    def refit_job(
        project: Any, trajectory_id: str, workers: int = 1, isolated: bool = False
    ) -> Job[str]:
        yield Progress(0.25, "replaying 4 windows")
        assert go.wait(10), "the test never let the refit finish"
        yield Progress(0.75, "least squares")
        raise TwinbenchError("the refit's replays failed on 9 of 12 windows")

    monkeypatch.setattr(deploy_page, "refit_job", refit_job)
    page.result = DeployResult("trajectory-run", "run-x", {})
    page.progress.setValue(1000)  # where the run's bar ended
    page.refit_button.setEnabled(True)
    page.refit_button.click()
    assert page.progress.value() == 0
    qtbot.waitUntil(lambda: page.progress.value() == 250, timeout=5000)
    assert page.status.text() == "refit: replaying 4 windows"
    with qtbot.waitSignal(page.sig_refit_failed, timeout=5000):
        go.set()
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)
    assert page.progress.value() < 1000  # a failed refit does not show a full bar
    assert "Refit failed" in page.refit_note.text()
    _shot(page, qtbot, "deploy-refit-failed-bar", tmp_path)
    page.detach()


def test_scan_previews_say_what_is_happening(
    qtbot: Any, controller: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from widgets.scan_page import ScanPage

    controller.new_project(tmp_path / "p")
    page = ScanPage(controller)
    qtbot.addWidget(page)
    page.resize(1366, 700)
    page.show()
    idle = page.color_view.text()
    assert "press Start scan" in idle and "press Start scan" in page.depth_view.text()
    jobs: list[Job[Any]] = []
    monkeypatch.setattr(controller, "submit_job", lambda title, job, *cbs: jobs.append(job))
    assert page.start_scan("file", tmp_path / "none.db3")
    for view, what in ((page.color_view, "colour"), (page.depth_view, "depth")):
        assert "press Start scan" not in view.text(), "the scan is running"
        assert view.text() == f"waiting for the first\n{what} frame…"
    _shot(page, qtbot, "scan-waiting-for-frames", tmp_path)
    page._failed("camera 'D435 #123' not found")  # the job ends before any frame
    assert page.color_view.text() == idle and page.start_btn.isEnabled()
    for job in jobs:
        job.close()
    page.detach()


def test_a_failed_job_is_logged_once(window: Any, controller: Any, qtbot: Any) -> None:
    def failing() -> Job[None]:
        yield Progress(0.0, "looking for the camera")
        raise DeviceError("camera 'D435 #123' not found")

    controller.submit_job("Scan", failing())
    qtbot.waitUntil(lambda: window.last_error is not None, timeout=5000)
    qtbot.wait(50)  # log records reach the panel through a queued signal
    rows = [t for t, _ in window.log_panel.rows() if "D435 #123" in t]
    assert len(rows) == 1, rows
    assert "Scan failed: camera 'D435 #123' not found" in rows[0]
    window.error_box.close()

    # an exception no slot handled: logged once too (with its traceback)
    try:
        raise KeyError("objects.puck.friction")
    except KeyError as exc:
        window.report_unexpected(type(exc), exc, exc.__traceback__)
    qtbot.wait(50)
    assert len([e for e in controller.log_entries() if "objects.puck.friction" in e.message]) == 1
    window.error_box.close()


@pytest.mark.slow
def test_changed_pages_fit_1366x768(
    window: Any, controller: Any, qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6 import QtGui

    import widgets.calibrate_page as cp
    from tests.app.test_calibrate_live import released_pendulum
    from tests.widgets.test_laptop_fit import H, W, _check, _controls
    from twins.rigs import qube_twin

    monkeypatch.setattr(cp, "REPLAY_PROCESSES", 0)  # replays on the page's worker thread
    proj = controller.new_project(tmp_path / "p")
    demo, fitted = _twins(proj)
    rec = released_pendulum(qube_twin(), damping=2e-4, seconds=1.0)
    with proj.new_artifact("trajectory", summary="pendulum released at 0.4 rad") as folder:
        rec.save(folder)
    _policy(proj, fitted, "reach by cem on the fitted twin, dr posterior, twin success 0.92")
    controller.notify_project_changed()
    window.resize(W, H)
    qtbot.wait(100)
    # the sidebar's project text: every line fits (a long folder is shortened, not cut off)
    label = window.project_label
    doc = QtGui.QTextDocument()
    doc.setDefaultFont(label.font())
    doc.setDocumentMargin(0)  # as a QLabel lays it out
    doc.setHtml(label.text())
    assert doc.idealWidth() <= label.contentsRect().width(), label.text()
    assert "…" in label.text() and label.toolTip() == str(proj.root)
    for key in ("calibrate", "policies", "deploy", "scan"):
        page = window.show_step(key)
        if key == "calibrate":
            qtbot.waitUntil(lambda p=page: p._last is not None, timeout=60000)
            assert page.twin_combo.currentData() == fitted
        if key == "policies":
            assert page.setup.twin_combo.currentData() == fitted
        assert not page.showing_empty_state()
        _check(window, _controls(page) + _controls(window.devices_panel), f"page {key}")
        assert not _cut_off(page), f"page {key}: text cut off: {_cut_off(page)}"
        if key == "scan":  # every source fits, the connected robot's too
            from widgets.scan_page import SOURCES

            box, shown = page.source, page.source.currentText()
            for text in [t for t, _ in SOURCES] + [page.ROBOT_SOURCE[0]]:
                box.setItemText(box.currentIndex(), text)
                assert not _cut_off(box), _cut_off(box)
            box.setItemText(box.currentIndex(), shown)
        _shot(window, qtbot, f"page-{key}-1366x768", tmp_path)
