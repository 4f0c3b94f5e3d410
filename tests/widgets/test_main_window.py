"""Main window: pages and empty states, page switching, File menu with real project folders,
errors for bad projects (nothing on disk changes), log panel colours."""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
from pathlib import Path

import pytest
from PySide6 import QtWidgets

from app import workflows
from app.controller import JobRequest
from resources.project import MANIFEST, Project

pytestmark = pytest.mark.gui


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under root with its content hash and mtime (ns)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = (
                hashlib.sha256(p.read_bytes()).hexdigest(),
                p.stat().st_mtime_ns,
            )
    return out


def test_window_has_all_pages_with_empty_states(window) -> None:
    titles = [window.steps.item(i).text() for i in range(window.steps.count())]
    assert titles == ["1  Scan", "2  Twin", "3  Calibrate", "4  Policies", "5  Deploy"]
    assert list(window.pages) == [s.key for s in workflows.STEPS]
    for key, page in window.pages.items():
        window.show_step(key)
        assert window.stack.currentWidget().widget() is page  # pages sit in scroll areas
        assert page.showing_empty_state()
        assert page.empty.isVisible()
        text = page.empty.text()
        st = workflows.step(key)
        assert st.does in text and "Needs first" in text
        for need in st.needs:
            assert need.label in text
    assert "Compare simulated and real trajectories" in window.pages["calibrate"].empty.text()
    # pages promise only commands that exist; steps not built yet say so plainly
    from app.cli import COMMANDS

    for st in workflows.STEPS:
        text = window.pages[st.key].empty.text()
        if st.cli:
            assert st.cli.split()[2] in COMMANDS, st.cli
        else:
            assert "python main.py" not in text and "No command line" in text
        if not st.built:
            assert "Not built yet" in text and "Everything this step needs" not in text
    assert "No project is open" in window.pages["twin"].empty.text()


def test_switching_pages_by_clicking_sidebar(window, qtbot) -> None:
    from PySide6 import QtCore

    for row in (3, 1, 4, 0):
        item = window.steps.item(row)
        rect = window.steps.visualItemRect(item)
        qtbot.mouseClick(
            window.steps.viewport(), QtCore.Qt.MouseButton.LeftButton, pos=rect.center()
        )
        assert window.stack.currentIndex() == row
        assert window.current_step() == workflows.STEPS[row].key


def test_needs_are_ticked_from_the_open_project(window, controller, tmp_path, qtbot) -> None:
    proj = Project.create(tmp_path / "p")
    with proj.new_artifact("scan") as f:
        (f / "scan.json").write_text("{}")
    with proj.new_artifact("twin", inputs=[proj.latest("scan").id]) as f:
        (f / "twin.json").write_text("{}")
    controller.open_project(proj.root)
    page = window.pages["calibrate"]
    qtbot.waitUntil(lambda: "✔" in page.empty.needs.text())
    html = page.empty.needs.text()
    twin_line = [ln for ln in html.split("<br>") if "a twin" in ln][0]
    traj_line = [ln for ln in html.split("<br>") if "trajectory" in ln][0]
    assert "✔" in twin_line and "✘" in traj_line
    qtbot.waitUntil(lambda: "Twinbench — p" == window.windowTitle())
    assert "2 artifacts" in window.project_label.text()


def test_file_new_open_recent_save(window, controller, tmp_path, monkeypatch, qtbot) -> None:
    p1 = tmp_path / "first"
    monkeypatch.setattr(
        QtWidgets.QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(p1), ""))
    )
    window.act_new.trigger()
    assert controller.project is not None and controller.project.root == p1.resolve()
    assert (p1 / MANIFEST).is_file()
    qtbot.waitUntil(lambda: window.windowTitle() == "Twinbench — first")

    p2 = tmp_path / "second"
    Project.create(p2)
    monkeypatch.setattr(
        QtWidgets.QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(p2))
    )
    window.act_open.trigger()
    assert controller.project.root == p2.resolve()
    assert controller.recent_projects() == [p2.resolve(), p1.resolve()]
    qtbot.waitUntil(
        lambda: (
            [a.text() for a in window.recent_menu.actions()]
            == [str(p2.resolve()), str(p1.resolve())]
        )
    )

    window.recent_menu.actions()[1].trigger()  # Open recent ▸ first
    assert controller.project.root == p1.resolve()

    # a recent project that was deleted: error naming it, then it leaves the list
    shutil.rmtree(p2)
    qtbot.waitUntil(
        lambda: (
            [a.text() for a in window.recent_menu.actions()]
            == [str(p1.resolve()), str(p2.resolve())]
        )
    )
    window.recent_menu.actions()[1].trigger()
    assert window.last_error is not None and str(p2.resolve()) in window.last_error[1]
    window.error_box.close()
    window.last_error = None
    assert controller.recent_projects() == [p1.resolve()]
    assert controller.project.root == p1.resolve()

    # Save writes what is only in memory: a setting changed since opening is on disk after
    controller.project.settings["note"] = "saved from the File menu"
    assert "note" not in Project.open(p1).settings
    window.act_save.trigger()
    assert Project.open(p1).settings["note"] == "saved from the File menu"
    assert Project.open(p1).name == "first"
    assert window.last_error is None


@pytest.mark.parametrize("problem", ["corrupt", "newer", "not_project"])
def test_bad_project_shows_error_naming_path_and_changes_nothing(
    window, controller, tmp_path, monkeypatch, qtbot, problem
) -> None:
    good = tmp_path / "good"
    controller.new_project(good)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "notes.txt").write_text("keep me")
    if problem == "corrupt":
        (bad / MANIFEST).write_text('{"format": "twinbench-project", "format_ver')
    elif problem == "newer":
        (bad / MANIFEST).write_text('{"format": "twinbench-project", "format_version": 99}')
    before = snapshot(tmp_path)
    recent_before = controller.recent_projects()
    monkeypatch.setattr(
        QtWidgets.QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(bad))
    )
    window.act_open.trigger()

    assert window.error_box is not None and window.error_box.isVisible()
    text = window.error_box.text()
    assert str(bad) in text
    assert {
        "corrupt": "corrupt manifest",
        "newer": "newer",
        "not_project": "not a Twinbench project",
    }[problem] in text
    assert controller.project is not None and controller.project.root == good.resolve()
    assert controller.recent_projects() == recent_before
    assert snapshot(tmp_path) == before  # nothing written, not even the recent list
    qtbot.waitUntil(
        lambda: any(str(bad) in t and c.name() == "#c62828" for t, c in window.log_panel.rows())
    )
    window.error_box.close()


def test_log_panel_shows_records_from_threads_errors_red(window, qtbot) -> None:
    lg = logging.getLogger("tests.widgets")
    th = threading.Thread(target=lambda: lg.error("camera %s dropped", "D435"))
    th.start()
    th.join()
    lg.warning("latency high")
    qtbot.waitUntil(lambda: any("latency high" in t for t, _ in window.log_panel.rows()))
    rows = dict(window.log_panel.rows())
    err = [t for t in rows if "camera D435 dropped" in t][0]
    assert rows[err].name() == "#c62828"
    window.log_panel.level.setCurrentIndex(2)  # errors only
    texts = [t for t, _ in window.log_panel.rows()]
    assert any("D435" in t for t in texts) and not any("latency" in t for t in texts)


def test_devices_panel_shows_disconnected_state(window, controller, qtbot) -> None:
    panel = window.devices_panel
    assert "disconnected" in panel.rows["robot"].label.text()
    assert panel.no_robot.isVisible() and not panel.table.isVisible()
    controller.set_device_status("camera", "unavailable", "lab not available: test")
    qtbot.waitUntil(lambda: "lab not available: test" in panel.rows["camera"].label.text())


def _save_traj(controller, scale: float, summary: str) -> str:  # type: ignore[no-untyped-def]
    import numpy as np

    from devices.trajectory import Trajectory

    t = np.linspace(0, 1, 101)
    q = np.stack([scale * np.sin(t), scale * np.cos(t)], 1)
    t = t + 32.0  # a robot clock that started long before the recording
    return controller.save_trajectory(
        Trajectory(
            t, {"robot/joint_pos": q}, {"robot/joint_pos": "rad"}, "real", {"robot": "arm2"}
        ),
        summary=summary,
    )


def test_calibrate_page_plots_project_trajectories(window, controller, tmp_path, qtbot) -> None:
    controller.new_project(tmp_path / "cal")
    page = window.show_step("calibrate")
    assert page.showing_empty_state()
    first = _save_traj(controller, 1.0, "first run")
    qtbot.waitUntil(lambda: not page.showing_empty_state())
    assert page.traj_list.count() == 1
    assert page.banner.isVisible() and "a twin (Twin page)" in page.banner.text()
    assert not page.fit_btn.isEnabled()  # nothing to simulate or fit without a twin
    assert sorted(page.plot.series()) == ["real/joint_pos/joint1", "real/joint_pos/joint2"]
    second = _save_traj(controller, 0.5, "second run")
    qtbot.waitUntil(lambda: page.traj_list.count() == 2)
    assert [page.traj_list.item(i).text() for i in range(2)] == ["first run", "second run"]
    # the newest is plotted; tick the first too: both recordings, told apart by a label
    page.traj_list.item(0).setCheckState(
        __import__("PySide6.QtCore", fromlist=["Qt"]).Qt.CheckState.Checked
    )
    names = sorted(page.plot.series())
    assert len(names) == 4 and any("@" in n for n in names)
    s = page.plot.series()
    vals = sorted(float(v.y[0]) for k, v in s.items() if k.endswith("joint_pos/joint2"))
    assert vals == pytest.approx([0.5, 1.0])
    assert all(v.t[0] == 0.0 and v.t[-1] == pytest.approx(1.0) for v in s.values())  # from 0 s
    assert {first, second} == {a.id for a in controller.project.artifacts("trajectory")}


def test_unexpected_exception_is_shown_and_logged_and_app_lives_on(window, qtbot) -> None:
    """What `sys.excepthook` (installed by the app) does with an exception no slot handled."""
    try:
        raise KeyError("objects.puck.friction")
    except KeyError as exc:
        window.report_unexpected(type(exc), exc, exc.__traceback__)
    assert window.error_box is not None and window.error_box.isVisible()
    assert "KeyError" in window.error_box.text() and "keeps running" in window.error_box.text()
    qtbot.waitUntil(
        lambda: any("objects.puck.friction" in t for t, _ in window.log_panel.rows()), timeout=3000
    )
    entries = [e for e in window.controller.log_entries() if "unexpected error" in e.message]
    assert entries and "Traceback" in entries[-1].traceback
    window.error_box.close()
    window.show_step("twin")  # still responsive
    assert window.current_step() == "twin"


def test_quit_asks_before_losing_an_edited_twin(
    window, controller, qtbot, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from app.workflows import twin as twin_flow
    from resources.jobs import run_to_end

    proj = controller.new_project(tmp_path / "q")
    run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    controller.notify_project_changed()
    page = window.show_step("twin")
    qtbot.waitUntil(lambda: page._last_frame is not None, timeout=30000)
    assert window.unsaved_work() == []
    page.live.set_values({"objects.box.friction": 1.1})
    qtbot.waitUntil(lambda: page._last_frame.edited, timeout=5000)
    asked: list[str] = []

    def answer(button):  # type: ignore[no-untyped-def]
        def question(_parent, _title, text, *_a):  # type: ignore[no-untyped-def]
            asked.append(text)
            return button

        return staticmethod(question)

    monkeypatch.setattr(
        QtWidgets.QMessageBox, "question", answer(QtWidgets.QMessageBox.StandardButton.Cancel)
    )
    window.close()
    assert asked and "edited twin" in asked[0]
    assert window.isVisible() and page.live is not None  # cancelled: nothing closed
    monkeypatch.setattr(
        QtWidgets.QMessageBox, "question", answer(QtWidgets.QMessageBox.StandardButton.Discard)
    )
    window.close()
    assert not window.isVisible() and page.live is None


def test_the_heap_is_out_of_the_collectors_reach_after_startup_and_after_each_job(
    window, qtbot
) -> None:
    """A full collection walks every tracked object with the GIL held (330-380 ms for the
    window's heap on a loaded machine): what the window and a job leave alive is frozen, so
    the collector's own heap stays a small fraction of it."""
    import gc

    assert gc.get_freeze_count() > 50_000  # Qt, numpy, the pages and their modules
    assert len(gc.get_objects()) < 0.2 * gc.get_freeze_count()

    def job():  # type: ignore[no-untyped-def]
        keep = [{"i": i, "tag": [i]} for i in range(100_000)]  # 200k new tracked objects
        yield from ()
        return keep

    kept = []
    with qtbot.waitSignal(window.runner.sig_job_done, timeout=10_000):
        window.runner.run_request(JobRequest("make objects", job(), on_done=kept.append))
    assert len(kept[0]) == 100_000
    assert len(gc.get_objects()) < 0.2 * gc.get_freeze_count()  # frozen after the job too
