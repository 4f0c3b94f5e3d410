"""The window survives a working day: every live view refreshed 10,000 times with the
virtual lab connected must not lower `sys.getrefcount(None)`.

PySide6/shiboken6 6.12.0 on CPython 3.11 drops one reference to None for each Qt call that
returns None (QLabel.setText, QTableWidgetItem.setText, …); a live window frees None within
minutes and dies with "Fatal Python error: none_dealloc" (docs/TRAPS.md). This test fails on
that version (measured: None lost 11,801 references in the first 250 ticks there) and passes on the pinned one.
It stops early, before the interpreter would crash, once the drift is unmistakable.
"""

from __future__ import annotations

import gc
import logging
import sys

import numpy as np
import pytest

from app.workflows import twin as twin_flow
from devices.trajectory import Trajectory
from resources.jobs import run_to_end

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.realtime]

TICKS = 10_000
CHECK_EVERY = 250
# None's count moves with whatever else holds None at the moment (frames, dict values …);
# a few hundred either way is noise. The bad version loses tens of references per tick.
TOLERANCE = 300

log = logging.getLogger(__name__)


def _recording() -> Trajectory:
    t = np.arange(0, 5, 0.004)
    q = 0.3 * np.sin(np.outer(t, np.arange(1, 8)))
    return Trajectory(
        t=t,
        channels={"robot/joint_pos": q, "robot/command": q},
        units={"robot/joint_pos": "rad", "robot/command": "rad"},
        source="real",
        meta={"robot": "panda"},
    )


def test_live_views_keep_none_alive(window, controller, qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proj = controller.new_project(tmp_path / "soak")
    run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    controller.save_trajectory(_recording(), summary="soak recording")
    window.act_start_lab.trigger()
    qtbot.waitUntil(lambda: controller.devices()["robot"].state != "connecting", timeout=90000)
    assert controller.devices()["robot"].state == "connected", controller.devices()["robot"]
    twin_page = window.show_step("twin")
    qtbot.waitUntil(lambda: twin_page._last_frame is not None, timeout=30000)
    calib = window.show_step("calibrate")
    qtbot.waitUntil(lambda: bool(calib.plot.series()), timeout=10000)
    panel = window.devices_panel
    qtbot.waitUntil(lambda: controller.robot_state() is not None, timeout=10000)

    def tick(i: int) -> None:
        panel.refresh_state(force=True)  # joint table, labels, 3D arm and trail
        twin_page.redraw()  # 3D twin meshes
        twin_page._update_status(f"tick {i}")  # status label
        twin_page.tree.set_values({"objects.box.friction": 0.5 + (i % 7) * 0.01})
        calib.plot.set_time(float(i % 500) / 100)  # time cursor across the linked plots
        window._on_project(controller.project)  # sidebar project label, title, actions
        if i % 20 == 0:
            log.info("soak tick %d", i)  # log panel row
            window.statusBar().showMessage(f"tick {i}")

    for i in range(50):  # warm up caches (fonts, GL items) before counting
        tick(i)
    qtbot.wait(50)
    gc.collect()
    start = sys.getrefcount(None)
    drift = 0
    for i in range(TICKS):
        tick(i)
        if i % 25 == 0:
            qtbot.wait(1)  # let paints and queued signals run too
        if i % CHECK_EVERY == CHECK_EVERY - 1:
            gc.collect()
            drift = sys.getrefcount(None) - start
            assert drift > -10 * TOLERANCE, (
                f"refcount of None fell by {-drift} after {i + 1} ticks: this Qt binding "
                "leaks None references and the app would die with none_dealloc"
            )
    gc.collect()
    drift = sys.getrefcount(None) - start
    assert drift > -TOLERANCE, f"refcount of None fell by {-drift} over {TICKS} ticks"
    assert panel.refreshes >= TICKS
    assert twin_page._last_frame is not None
