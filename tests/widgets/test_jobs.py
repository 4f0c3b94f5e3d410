"""The GUI job runner: progress, result, cancel at the next yield, error messages, no leaked
threads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from devices.errors import DeviceError
from resources.jobs import Job, Progress

pytestmark = pytest.mark.gui


@pytest.fixture
def runner(qtbot) -> Iterator:  # type: ignore[no-untyped-def]
    from widgets.jobs import JobRunner

    r = JobRunner()
    yield r
    assert r.shutdown(5000)
    assert r.pool.activeThreadCount() == 0


def steps_job(n: int, dt: float, log: list[str]) -> Job[int]:
    try:
        for i in range(n):
            time.sleep(dt)
            log.append(f"step {i}")
            yield Progress((i + 1) / n, f"step {i + 1}/{n}", partial=i)
        return n * 10
    finally:
        log.append("cleanup")


def test_progress_forwarded_and_result_returned(runner, qtbot) -> None:
    log: list[str] = []
    seen: list[Progress] = []
    threads: list[str] = []
    task = runner.start("count", steps_job(5, 0.04, log))
    task.sig_progress.connect(
        lambda p: (seen.append(p), threads.append(threading.current_thread().name))
    )
    with qtbot.waitSignal(task.sig_finished, timeout=5000) as blocker:
        pass
    assert blocker.args == [50]
    qtbot.waitUntil(lambda: task.done and not runner.running())
    assert task.state == "finished"
    assert seen and seen[-1].fraction == pytest.approx(1.0) and seen[-1].partial == 4
    assert set(threads) == {threading.main_thread().name}  # delivered on the GUI thread
    assert log[-1] == "cleanup"


def test_progress_is_rate_limited_but_last_record_arrives(runner, qtbot) -> None:
    def flood() -> Job[str]:
        for i in range(20000):
            yield Progress((i + 1) / 20000, f"{i}")
        return "ok"

    seen: list[Progress] = []
    task = runner.start("flood", flood())
    task.sig_progress.connect(seen.append)
    with qtbot.waitSignal(task.sig_finished, timeout=10000):
        pass
    qtbot.waitUntil(lambda: bool(seen) and seen[-1].fraction == 1.0)
    assert len(seen) < 2000


def test_cancel_closes_generator_at_next_yield(runner, qtbot) -> None:
    log: list[str] = []
    task = runner.start("long", steps_job(1000, 0.01, log))
    qtbot.waitUntil(lambda: len(log) >= 3, timeout=5000)
    with qtbot.waitSignal(task.sig_cancelled, timeout=5000):
        task.cancel()
    qtbot.waitUntil(lambda: not runner.running())
    assert task.state == "cancelled"
    assert log[-1] == "cleanup"
    steps_done = len(log) - 1
    time.sleep(0.1)
    assert len(log) - 1 == steps_done  # nothing ran after the close
    assert steps_done < 1000


def test_cancel_button_in_progress_widget(runner, qtbot) -> None:
    from PySide6 import QtCore

    from widgets.jobs import JobProgressWidget

    w = JobProgressWidget(runner)
    qtbot.addWidget(w)
    w.show()
    log: list[str] = []
    task = runner.start("Fit twin", steps_job(1000, 0.01, log))
    qtbot.waitUntil(lambda: "Fit twin: step" in w.label.text(), timeout=5000)
    assert w.bar.isVisible() and w.cancel_button.isVisible()
    assert 0 < w.bar.value() <= 1000
    with qtbot.waitSignal(task.sig_cancelled, timeout=5000):
        qtbot.mouseClick(w.cancel_button, QtCore.Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.label.text().startswith("Fit twin: cancelled at "))
    assert not w.bar.isVisible()


def test_a_finished_jobs_outcome_clears_and_a_new_job_replaces_it(runner, qtbot) -> None:
    """'Train policy: done' stayed in the status bar for good, beside pages that had moved
    on: the outcome (with its time) clears after OUTCOME_SHOWN_MS."""
    from widgets.jobs import JobProgressWidget

    w = JobProgressWidget(runner)
    w.OUTCOME_SHOWN_MS = 300
    qtbot.addWidget(w)
    w.show()
    task = runner.start("Train policy", steps_job(3, 0.01, []))
    qtbot.waitUntil(lambda: task.done, timeout=5000)
    qtbot.waitUntil(lambda: w.label.text().startswith("Train policy: done at "), timeout=2000)
    assert w.label.isVisible() and not w.bar.isVisible()
    qtbot.waitUntil(lambda: w.label.text() == "" and not w.label.isVisible(), timeout=2000)
    # a job started while an outcome shows takes the label; its timer does not clear it
    runner.start("Fit twin", steps_job(3, 0.01, []))
    qtbot.waitUntil(lambda: w.label.text().startswith("Fit twin: done at "), timeout=5000)
    task = runner.start("Build twin", steps_job(200, 0.01, []))
    qtbot.wait(400)
    assert w.label.text().startswith("Build twin: "), w.label.text()
    task.cancel()


def test_twinbench_error_shown_as_is(runner, qtbot) -> None:
    def bad() -> Job[None]:
        yield Progress(0.1, "opening")
        raise DeviceError("robot 'panda' at 127.0.0.1:7001 stopped answering")

    task = runner.start("record", bad())
    with qtbot.waitSignal(task.sig_failed, timeout=5000) as blocker:
        pass
    assert blocker.args == ["robot 'panda' at 127.0.0.1:7001 stopped answering"]
    qtbot.waitUntil(lambda: not runner.running())
    assert task.state == "failed"


def test_other_exceptions_named_and_logged_with_traceback(runner, qtbot, caplog) -> None:
    def bug() -> Job[None]:
        yield Progress(None, "working")
        {}["missing"]

    caplog.set_level(logging.ERROR, logger="widgets.jobs")
    task = runner.start("buggy", bug())
    with qtbot.waitSignal(task.sig_failed, timeout=5000) as blocker:
        pass
    assert blocker.args == ["KeyError: 'missing'"]
    rec = [r for r in caplog.records if "buggy failed" in r.getMessage()][0]
    assert rec.exc_info is not None and rec.exc_info[0] is KeyError


def test_controller_jobs_run_through_window_runner(window, controller, qtbot) -> None:
    from app.controller import idle_job

    results: list[tuple[object, str]] = []
    controller.submit_job(
        "wait",
        idle_job(0.1, 4),
        on_done=lambda r: results.append((r, threading.current_thread().name)),
    )
    qtbot.waitUntil(lambda: bool(results), timeout=5000)
    assert results == [(0.1, threading.main_thread().name)]

    def failing() -> Job[None]:
        yield Progress(0.0, "x")
        raise DeviceError("camera 'D435 #123' not found")

    controller.submit_job("Scan", failing())
    qtbot.waitUntil(lambda: window.last_error is not None, timeout=5000)
    assert window.last_error == ("Scan failed", "camera 'D435 #123' not found")
    window.error_box.close()


def test_window_close_cancels_running_job(window, controller, qtbot) -> None:
    log: list[str] = []
    controller.submit_job("endless", steps_job(100000, 0.01, log))
    qtbot.waitUntil(lambda: len(log) >= 2, timeout=5000)
    assert "endless" in window.job_widget.label.text()
    window.close()
    assert log[-1] == "cleanup"
    assert window.runner.pool.activeThreadCount() == 0


def test_pages_and_the_record_dialog_start_jobs_in_one_runner(window, qtbot) -> None:  # type: ignore[no-untyped-def]
    """One GUI job start (issue 25): a job the Deploy page or the record dialog starts is the
    window's job like any other: the status bar shows it with Cancel, and closing the window
    cancels it (its cleanup runs: the deploy run's `finally` holds the robot)."""
    window.devices_panel._record_motion()
    dialog_runner = window.devices_panel.record_dialog.panel.runner
    log: list[str] = []
    deploy_task = window.pages["deploy"].runner.start("deploy-ish", steps_job(100000, 0.01, log))
    qtbot.waitUntil(lambda: "deploy-ish" in window.job_widget.label.text(), timeout=5000)
    rec_log: list[str] = []
    dialog_runner.start("record-ish", steps_job(100000, 0.01, rec_log))
    qtbot.waitUntil(lambda: "record-ish" in window.job_widget.label.text(), timeout=5000)
    qtbot.waitUntil(lambda: len(log) >= 2 and len(rec_log) >= 2, timeout=5000)
    assert {t.title for t in window.runner.running()} == {"deploy-ish", "record-ish"}
    window.devices_panel.record_dialog.close()  # the dialog closing leaves the deploy job be
    assert deploy_task.state == "running"
    window.close()
    assert log[-1] == "cleanup" and rec_log[-1] == "cleanup"
    assert window.runner.pool.activeThreadCount() == 0


def test_throttled_shows_the_first_at_once_and_the_newest_after_the_interval(qtbot) -> None:
    """20 progress reports in a burst repaint twice, not 20 times: the first at once, the
    newest at the end of the interval; a cancelled one never comes after the outcome."""
    from widgets.jobs import Throttled

    shown: list[int] = []
    th = Throttled(shown.append, interval_ms=200)
    for i in range(20):
        th(i)
    assert shown == [0]
    qtbot.waitUntil(lambda: len(shown) == 2, timeout=2000)
    assert shown == [0, 19]
    qtbot.wait(300)
    assert shown == [0, 19]  # nothing more pending
    th(20)  # the interval has passed: at once
    th(21)
    th.cancel()
    qtbot.wait(300)
    assert shown == [0, 19, 20]
