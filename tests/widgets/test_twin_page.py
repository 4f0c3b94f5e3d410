"""Twin page: opens the latest twin, edits a parameter through the generated panel, steps,
moves an object and saves a new twin artifact whose parent is the edited twin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.jobs import run_to_end
from app.session import AppController
from app.workflows import twin as twin_flow

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_twin_page_edit_play_save(qtbot, controller: AppController, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from widgets.twin_page import TwinPage

    proj = controller.new_project(tmp_path / "p")
    page = TwinPage(controller)
    qtbot.addWidget(page)
    assert page.showing_empty_state()  # no scan, no twin yet
    tid = run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    controller.notify_project_changed()
    qtbot.waitUntil(lambda: page.session is not None, timeout=20000)
    assert not page.showing_empty_state()
    s = page.session
    assert s is not None and s.twin_id == tid
    # the panel is generated from the ParamSet: one spin box per parameter, bounds applied
    assert set(page.tree.spins) == set(s.spec.params)
    spin = page.tree.spins["objects.box.friction"]
    assert (spin.minimum(), spin.maximum()) == (0.0, 2.0)
    spin.setValue(1.3)
    qtbot.waitUntil(lambda: s.values["objects.box.friction"] == pytest.approx(1.3), timeout=3000)
    assert "edited" in page.status.text()
    # the scene holds the robot meshes and the objects; hulls appear on the toggle
    names = set(page.view.items())
    assert any(n.startswith("robot/panda_link3") for n in names) and "u_block/visual" in names
    assert not any("hull" in n for n in names)
    page.hull_box.setChecked(True)
    assert sum("u_block/hull" in n for n in page.view.items()) >= 2
    # play: time advances and the arm holds still under its servos
    q_before = s.world.joint_state()[0]
    page.step_once()
    page.step_once()
    assert s.time == pytest.approx(2 * 8 / 240, abs=1e-9)
    assert np.allclose(s.world.joint_state()[0][:7], q_before[:7], atol=0.02)
    # move the box to a new start pose numerically
    page.obj_combo.setCurrentText("box")
    page.pose_spins[0].setValue(0.40)
    page.pose_spins[3].setValue(45.0)
    page.move_object()
    assert s.spec.object("box").pose[0] == pytest.approx(0.40)
    # save: a new twin artifact, parent = the opened twin, same scan input
    with qtbot.waitSignal(page.sig_twin_saved, timeout=10000) as sig:
        page.save_btn.click()
    new_id = sig.args[0]
    art = proj.artifact(new_id)
    assert art.parent == tid and art.inputs == proj.artifact(tid).inputs
    _, saved = twin_flow.load_twin(proj, new_id)
    assert saved.params["objects.box.friction"].nominal == pytest.approx(1.3)
    assert saved.object("box").pose[0] == pytest.approx(0.40)
    assert (proj.path_of(new_id) / "urdf" / "scene.urdf").is_file()
    page.detach()
    assert page.session is None
