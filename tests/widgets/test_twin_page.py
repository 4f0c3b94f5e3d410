"""Twin page: opens the latest twin, edits a parameter through the generated panel, steps,
moves an object and saves a new twin artifact whose parent is the edited twin — with every
physics step, rebuild and save on the twin's worker thread, never on the GUI thread."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.controller import AppController
from app.workflows import twin as twin_flow
from resources.jobs import run_to_end

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_twin_page_edit_play_save(qtbot, controller: AppController, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from widgets.twin_page import TICK_S, TwinPage

    proj = controller.new_project(tmp_path / "p")
    page = TwinPage(controller)
    qtbot.addWidget(page)
    assert page.showing_empty_state()  # no scan, no twin yet
    tid = run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    controller.notify_project_changed()
    qtbot.waitUntil(lambda: page.live is not None and page.twin_id == tid, timeout=20000)
    assert not page.showing_empty_state()
    live = page.live
    assert live is not None
    session = live.session
    # every call into the world happens on the worker thread
    gui_thread = threading.get_ident()
    world_threads: set[int] = set()
    for name in ("step", "set_values", "move_object", "save", "reset"):
        fn = getattr(session, name)

        def spy(*a, _fn=fn, **k):  # type: ignore[no-untyped-def]
            world_threads.add(threading.get_ident())
            return _fn(*a, **k)

        setattr(session, name, spy)
    # the panel is generated from the ParamSet: one spin box per parameter, bounds applied
    assert set(page.tree.spins) == set(session.spec.params)
    spin = page.tree.spins["objects.box.friction"]
    assert (spin.minimum(), spin.maximum()) == (0.0, 2.0)
    spin.setValue(1.3)
    qtbot.waitUntil(
        lambda: (
            page._last_frame is not None
            and page._last_frame.values["objects.box.friction"] == pytest.approx(1.3)
        ),
        timeout=5000,
    )
    assert "edited" in page.status.text()
    # the scene holds the robot meshes and the objects; hulls appear on the toggle
    names = set(page.view.items())
    assert any(n.startswith("robot/panda_link3") for n in names) and "u_block/visual" in names
    assert not any("hull" in n for n in names)
    page.hull_box.setChecked(True)
    assert sum("u_block/hull" in n for n in page.view.items()) >= 2
    # step twice: time advances by two ticks and the arm holds still under its servos
    link3_before = page._last_frame.poses["robot/panda_link3"].copy()
    t0 = page._last_frame.time_s
    page.step_once()
    page.step_once()
    dt = session.world.dt
    qtbot.waitUntil(
        lambda: page._last_frame.time_s == pytest.approx(t0 + 2 * round(TICK_S / dt) * dt),
        timeout=5000,
    )
    assert np.allclose(page._last_frame.poses["robot/panda_link3"], link3_before, atol=0.01)
    # play: the worker steps in real time and the page draws its frames, until paused
    drawn = page.frames_drawn
    page.play_btn.setChecked(True)
    qtbot.waitUntil(lambda: page.frames_drawn > drawn + 5, timeout=10000)
    page.play_btn.setChecked(False)
    qtbot.waitUntil(lambda: not page._last_frame.playing, timeout=5000)
    # move the box to a new start pose numerically
    page.obj_combo.setCurrentText("box")
    page.pose_spins[0].setValue(0.40)
    page.pose_spins[3].setValue(45.0)
    page.move_object()
    qtbot.waitUntil(
        lambda: page._last_frame.object_poses["box"][0] == pytest.approx(0.40), timeout=5000
    )
    # save: a new twin artifact, parent = the opened twin, same scan input
    with qtbot.waitSignal(page.sig_twin_saved, timeout=20000) as sig:
        page.save_btn.click()
    new_id = sig.args[0]
    art = proj.artifact(new_id)
    assert art.parent == tid and art.inputs == proj.artifact(tid).inputs
    _, saved = twin_flow.load_twin(proj, new_id)
    assert saved.params["objects.box.friction"].nominal == pytest.approx(1.3)
    assert saved.object("box").pose[0] == pytest.approx(0.40)
    assert (proj.path_of(new_id) / "urdf" / "scene.urdf").is_file()
    # the selector follows the saved twin
    qtbot.waitUntil(lambda: page.twin_combo.currentData() == new_id, timeout=5000)
    assert world_threads and gui_thread not in world_threads
    page.detach()
    assert page.live is None and not live.alive


def test_bad_value_is_reported_and_old_world_kept(
    qtbot, controller: AppController, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from widgets.twin_page import TwinPage

    proj = controller.new_project(tmp_path / "p")
    run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    page = TwinPage(controller)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page._last_frame is not None, timeout=20000)
    before = dict(page._last_frame.values)
    page.live.set_values({"objects.box.density": -1.0})
    qtbot.waitUntil(lambda: "objects.box.density" in page.status.text(), timeout=5000)
    assert "failed" in page.status.text()
    assert page._last_frame.values["objects.box.density"] == before["objects.box.density"]
    page.detach()
