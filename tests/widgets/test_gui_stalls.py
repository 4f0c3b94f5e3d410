"""The GUI thread only draws (issue 24 part 4): what a page does when a job's result or a
project change arrives stays under STALL_MS of event-loop stall, measured with the monitor
`bench gui` uses (benches.soak.StallProbe)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6 import QtCore

from app.controller import AppController
from tests.app.test_calibrate_live import DAMPING
from tests.widgets.test_calibrate_page import _qube_project

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.realtime]
STALL_MS = 200.0


def test_calibrate_page_closes_its_world_without_waiting(
    qtbot, controller: AppController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Reopening (a new recording, another twin) first closes the calibration world: its
    worker stops its replay processes on its own thread, the GUI thread does not wait
    (it waited 0.5-1 s here before)."""
    import widgets.calibrate_page as cp
    from benches.soak import StallProbe

    monkeypatch.setattr(cp, "REPLAY_PROCESSES", 2)
    page = cp.CalibratePage(controller)
    qtbot.addWidget(page)
    _qube_project(controller, tmp_path / "p")
    controller.notify_project_changed()
    qtbot.waitUntil(lambda: page._last is not None and page._last.full_ghost, timeout=60000)
    live = page.live
    assert live is not None and live.workers == 2
    probe = StallProbe(page)
    probe.start()
    qtbot.wait(50)
    probe.section("close")
    with probe.excluded():  # the world busy replaying an edit when it is closed
        live.set_values({DAMPING: 3e-4})
        qtbot.waitUntil(lambda: live._pending_requests == 0, timeout=5000)
    QtCore.QTimer.singleShot(0, page, page._close_live)
    qtbot.waitUntil(lambda: page.live is None, timeout=5000)
    qtbot.wait(100)
    probe.stop()
    assert probe.max_ms("close") <= STALL_MS, probe.worst()
    qtbot.waitUntil(lambda: not live.alive, timeout=20000)  # it did stop, on its own
    assert live.workers == 0


def test_calibrate_page_out_of_view_waits_until_shown(
    window, controller: AppController, qtbot, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """With another page shown, a project change neither opens the twin for calibration
    nor draws its curves (before, the hidden page did both on the GUI thread: 0.4-0.8 s
    per new recording in the GUI loop); showing the page catches up."""
    from benches.soak import StallProbe
    from widgets.calibrate_page import CalibratePage

    window.show_step("twin")
    page = window.pages["calibrate"]
    assert isinstance(page, CalibratePage)
    probe = StallProbe(window)
    probe.start()
    probe.section("hidden")
    with probe.excluded():
        _qube_project(controller, tmp_path / "p")
    controller.notify_project_changed()
    qtbot.wait(1500)
    assert page.live is None and page.frames_drawn == 0
    probe.pause()
    window.show_step("calibrate")
    qtbot.waitUntil(lambda: page._last is not None and page._last.full_ghost, timeout=60000)
    assert page.frames_drawn > 0
    probe.stop()
    assert probe.max_ms("hidden") <= STALL_MS, probe.worst()


def test_stall_probe_measures_per_section_and_skips_excluded_time(qtbot) -> None:  # type: ignore[no-untyped-def]
    """The monitor: a blocked event loop is a stall of its section; time a test spends in
    `excluded()` is not; a paused probe records nothing."""
    import time

    from benches.soak import StallProbe

    probe = StallProbe()
    probe.start()
    probe.section("blocked")
    qtbot.wait(50)
    time.sleep(0.3)  # the GUI thread busy: no event is handled
    qtbot.wait(50)
    probe.section("excluded")
    qtbot.wait(50)
    with probe.excluded():
        time.sleep(0.3)
    qtbot.wait(50)
    probe.pause()
    time.sleep(0.3)
    qtbot.wait(50)
    probe.stop()
    assert probe.max_ms("blocked") >= 250
    assert probe.max_ms("excluded") < 150
    assert set(probe.worst()) == {"blocked", "excluded"}
