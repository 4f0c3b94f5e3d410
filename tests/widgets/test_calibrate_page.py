"""Calibrate page: a slider move re-simulates and redraws (more pendulum damping: faster
decay, at the rate viscous damping predicts), the ghost in the 3D view follows the plots'
time cursor, and the page fits a 1366x768 laptop window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6 import QtCore

from app.controller import AppController
from app.workflows import fit as fit_flow
from tests.app.test_calibrate_live import DAMPING, released_pendulum
from twins.rigs import qube_twin

pytestmark = [pytest.mark.gui, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _in_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replays on the page's worker thread (the process pool is tested in tests/app)."""
    import widgets.calibrate_page as cp

    monkeypatch.setattr(cp, "REPLAY_PROCESSES", 0)


def shown_now(page) -> list[str]:  # type: ignore[no-untyped-def]
    return list(page.plot.visible_series())


def _decay_rate(t: np.ndarray, y: np.ndarray) -> float:
    """Exponential decay rate (1/s) of the positive peaks of an oscillation."""
    pk = [i for i in range(1, len(y) - 1) if y[i] > y[i - 1] and y[i] >= y[i + 1] and y[i] > 0]
    assert len(pk) >= 3
    return float(-np.polyfit(t[pk], np.log(y[pk]), 1)[0])


def _qube_project(controller: AppController, root: Path) -> tuple[str, str]:
    proj = controller.new_project(root)
    tid = fit_flow.import_rig_twin(proj, "qube_servo2")
    rec = released_pendulum(qube_twin(), damping=2e-4)
    with proj.new_artifact("trajectory", summary="pendulum released at 0.4 rad") as folder:
        rec.save(folder)
    return tid, proj.artifacts("trajectory")[-1].id


def test_damping_slider_changes_the_decay(qtbot, controller: AppController, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from widgets.calibrate_page import CalibratePage

    page = CalibratePage(controller)
    qtbot.addWidget(page)
    page.window_combo.setCurrentIndex(page.window_combo.findData(None))  # open loop
    _qube_project(controller, tmp_path / "p")
    controller.notify_project_changed()
    qtbot.waitUntil(lambda: page._last is not None and page._last.full_ghost, timeout=30000)
    assert not page.showing_empty_state()
    row = page.sliders.rows[DAMPING]
    assert (row.spin.minimum(), row.spin.maximum()) == (0.0, 5.0)
    assert row.slider.toolTip().endswith("N*m*s/rad") and "log" not in row.slider.toolTip()
    name = "sim/joint_pos/pendulum"
    rates = []
    for b in (2e-4, 4e-4):  # typed into the number box: the slider follows
        row.spin.setValue(b)
        req = page.live.latest_request
        qtbot.waitUntil(lambda r=req: page._last.request == r, timeout=20000)
        assert row.slider.value() == row.to_pos(b)
        s = page.plot.series()[name]
        assert s.t[0] == 0.0  # time from the recording's start
        rates.append(_decay_rate(s.t, s.y))
        if b == 2e-4:  # the twin at the recording's own value: residual ~0
            res = page.plot.series()["residual/joint_pos/pendulum"]
            assert np.abs(res.y).max() < 1e-9
    # a series not shown is computed when ticked: it then holds the newest simulation
    hidden = [n for n in page.plot.series() if n.startswith("sim/") and n not in shown_now(page)]
    assert hidden
    item = page.plot.list.findItems(hidden[0], QtCore.Qt.MatchFlag.MatchExactly)[0]
    item.setCheckState(QtCore.Qt.CheckState.Checked)
    jn = hidden[0].rsplit("/", 1)[1]
    sim = page._last.sims[next(iter(page._last.sims))]
    k = [str(j) for j in sim.meta["joint_names"]].index(jn)
    np.testing.assert_array_equal(page.plot.series()[hidden[0]].y, sim["robot/joint_pos"][:, k])
    item.setCheckState(QtCore.Qt.CheckState.Unchecked)
    # viscous damping: the decay rate grows linearly with the damping (it is b / 2I plus
    # the small loss into the arm): doubling it nearly doubles the rate
    assert rates[1] > rates[0]
    assert 1.7 < rates[1] / rates[0] < 2.3
    # shown by default: the moving joint, real and sim in one plot, the residual below
    shown = page.plot.visible_series()
    assert {"real/joint_pos/pendulum", name, "residual/joint_pos/pendulum"} <= set(shown)
    assert page.plot.plots()["joint_pos/pendulum"] is not None
    # the tuned value is kept only when saved: a new twin version, parent the open twin
    assert page.unsaved() and page.save_btn.isEnabled()
    proj = controller.project
    assert proj is not None
    tid = page.inputs.twin_id
    page.save_btn.click()  # without a main window the job runs right here
    new = proj.artifacts("twin")[-1]
    assert new.parent == tid and new.id != tid
    from app.workflows.twin import load_twin

    assert load_twin(proj, new.id)[1].params[DAMPING].nominal == pytest.approx(4e-4)
    assert page.inputs.recordings.keys() <= set(new.inputs)
    # a slider on a log-prior parameter is logarithmic
    log_rows = [r for r in page.sliders.rows.values() if r.log]
    for r in log_rows[:1]:
        p = r.param
        mid = r.to_value(500)
        assert mid == pytest.approx(np.sqrt(p.low * p.high), rel=1e-6)
    page.detach()


def test_ghost_follows_the_cursor(qtbot, controller: AppController, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from app.workflows.calibrate_preview import make_project
    from widgets.calibrate_page import CalibratePage

    proj, _, rid = make_project(tmp_path / "p")
    page = CalibratePage(controller)
    qtbot.addWidget(page)
    controller.open_project(proj.root)
    qtbot.waitUntil(lambda: page._last is not None and page._last.full_ghost, timeout=60000)
    items = page.view.items()
    link = next(n for n in items if n.startswith("ghost:robot/panda_link7/"))
    d = next(x for x in page.inputs.drawables if "ghost:" + x.name == link)
    seen = []
    for t in (1.0, 3.0):
        page.plot.set_time(t)
        f = page._last
        want_ghost = f.ghost[rid].at(t)["robot/panda_link7"] @ d.T_body_mesh
        want_real = f.recorded[rid].at(t)["robot/panda_link7"] @ d.T_body_mesh
        np.testing.assert_allclose(page.view.items()[link].data["transform"], want_ghost)
        np.testing.assert_allclose(page.view.items()["real:" + d.name].data["transform"], want_real)
        seen.append(want_ghost)
    assert np.abs(seen[0][:3, 3] - seen[1][:3, 3]).max() > 0.01  # the arm moved
    # the ghost track is the simulation's: its joint angles drive the links
    k = int(np.argmin(np.abs(f.ghost[rid].t - 3.0)))
    assert f.ghost[rid].t[k] == pytest.approx(3.0, abs=0.021)
    page.detach()


def test_calibrate_page_fits_1366x768(window, controller, qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from app.workflows.calibrate_preview import make_project
    from tests.widgets.test_laptop_fit import H, W, _check, _controls

    proj, _, _ = make_project(tmp_path / "p")
    controller.open_project(proj.root)
    window.resize(W, H)
    page = window.show_step("calibrate")
    qtbot.waitUntil(lambda: page._last is not None, timeout=60000)
    qtbot.wait(50)
    controls = _controls(page)
    assert page.fit_btn in controls and page.view in controls
    _check(window, controls + _controls(window.devices_panel), "page calibrate")


def test_fit_window_converges_shows_posterior_and_applies(
    qtbot, controller: AppController, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from app.workflows.twin import load_twin
    from widgets.fit_panel import FitDialog

    tid, rid = _qube_project(controller, tmp_path / "p")
    spec = qube_twin()
    dlg = FitDialog(controller, tid, [rid], spec.params, [DAMPING])
    qtbot.addWidget(dlg)
    assert dlg.chosen() == [DAMPING]
    dlg.budget.setValue(8)
    dlg.start()  # without a main window the controller runs the job right here
    qtbot.waitUntil(lambda: dlg.fit_id is not None, timeout=60000)
    # the convergence curve: best objective never rises with more simulations
    assert len(dlg.best) >= 2 and dlg.evals == sorted(dlg.evals)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(dlg.best, dlg.best[1:], strict=False))
    proj = controller.project
    assert proj is not None
    d = fit_flow.fit_summary(proj, dlg.fit_id)
    assert d["estimate"][DAMPING] == pytest.approx(2e-4, rel=0.1)  # the recording's truth
    assert dlg.pair.shown == [DAMPING]
    assert dlg.apply_btn.isEnabled()
    # opened again later, the window shows that fit's posterior straight away
    again = FitDialog(controller, tid, [rid], spec.params, [DAMPING])
    qtbot.addWidget(again)
    assert again.fit_id == dlg.fit_id and again.pair.shown == [DAMPING]
    with qtbot.waitSignal(dlg.sig_applied, timeout=10000) as sig:
        dlg.apply_btn.click()
    new_id = sig.args[0]
    assert proj.artifact(new_id).parent == tid
    _, new_spec = load_twin(proj, new_id)
    assert new_spec.params[DAMPING].nominal == pytest.approx(d["estimate"][DAMPING])
