"""The one job runner of the GUI: runs jobs (resources/jobs.py) on a QThreadPool worker.

```
runner = JobRunner()
task = runner.start("Fit twin", fit_job(...))      # the worker starts from the event loop
task.sig_progress.connect(...); task.sig_finished.connect(...); task.sig_failed.connect(...)
task.cancel()          # takes effect at the job's next yield (gen.close() on the worker)
```
Progress is forwarded through queued signals (rate-limited, the newest record always wins), so
the GUI thread only draws. Errors come back as one message: a TwinbenchError's message as is,
anything else as "Type: message", logged with its traceback.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

from PySide6 import QtCore, QtWidgets

from app.controller import JobRequest
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 0.03  # forward at most ~33 progress records per second per job


def error_message(exc: BaseException) -> str:
    """What the user sees for a failed job."""
    if isinstance(exc, TwinbenchError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class JobTask(QtCore.QObject):
    """One running job. Lives in the GUI thread; its `_Worker` runs the generator."""

    sig_progress = QtCore.Signal(object)  # Progress
    sig_finished = QtCore.Signal(object)  # the job's return value
    sig_failed = QtCore.Signal(str)  # a message for people
    sig_cancelled = QtCore.Signal()
    sig_done = QtCore.Signal()  # after any of finished/failed/cancelled

    def __init__(self, title: str, job: Job[Any], job_id: int) -> None:
        super().__init__()
        self.title = title
        self.job_id = job_id
        self.job = job
        self.last: Progress | None = None
        self.state = "queued"  # running | finished | failed | cancelled
        self._cancel = threading.Event()
        self.sig_progress.connect(self._remember)

    def cancel(self) -> None:
        """Ask the job to stop; the generator is closed at its next yield."""
        if self.state in ("queued", "running"):
            self._cancel.set()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self.state in ("finished", "failed", "cancelled")

    def _remember(self, p: Progress) -> None:
        self.last = p


class _Worker(QtCore.QRunnable):
    """Runs on a pool thread: drives the generator, emits the task's signals (queued)."""

    def __init__(self, task: JobTask) -> None:
        super().__init__()
        self.task = task
        self.setAutoDelete(True)

    def run(self) -> None:
        task, job = self.task, self.task.job
        task.state = "running"
        last_emit = 0.0
        pending: Progress | None = None
        try:
            while True:
                if task.cancel_requested:
                    job.close()
                    task.state = "cancelled"
                    task.sig_cancelled.emit()
                    return
                rec = next(job)
                pending = rec
                now = time.monotonic()
                if now - last_emit >= PROGRESS_INTERVAL_S:
                    task.sig_progress.emit(rec)
                    last_emit, pending = now, None
        except StopIteration as stop:
            if pending is not None:
                task.sig_progress.emit(pending)
            task.state = "finished"
            task.sig_finished.emit(stop.value)
        except BaseException as exc:  # the worker must report every failure, never die silently
            msg = error_message(exc)
            if isinstance(exc, TwinbenchError):
                log.error("%s failed: %s", task.title, msg)
            else:
                log.error("%s failed: %s", task.title, msg, exc_info=exc)
            task.state = "failed"
            task.sig_failed.emit(msg)
        finally:
            task.sig_done.emit()


class JobRunner(QtCore.QObject):
    """Starts jobs on its own QThreadPool and tracks the running ones."""

    sig_job_started = QtCore.Signal(object)  # JobTask
    sig_job_done = QtCore.Signal(object)  # JobTask

    def __init__(self, parent: QtCore.QObject | None = None, max_threads: int = 4) -> None:
        super().__init__(parent)
        self.pool = QtCore.QThreadPool(self)
        self.pool.setMaxThreadCount(max_threads)
        self._tasks: dict[int, JobTask] = {}
        self._pending: list[JobTask] = []
        self._ids = itertools.count(1)

    def start(self, title: str, job: Job[Any]) -> JobTask:
        """Start `job` on a worker thread; connect to the returned task's signals.

        The worker is started from the event loop, right after the caller returns, so
        connections made just after `start()` never miss a fast job's signals.
        """
        task = JobTask(title, job, next(self._ids))
        self._tasks[task.job_id] = task
        task.sig_done.connect(lambda t=task: self._finish(t))
        self._pending.append(task)
        QtCore.QTimer.singleShot(0, self, self._flush)
        self.sig_job_started.emit(task)
        return task

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for task in pending:
            self.pool.start(_Worker(task))

    def run_request(self, req: JobRequest) -> JobTask:
        """Adapter for `AppController.job_executor`: run a request, call its callbacks."""
        task = self.start(req.title, req.job)
        if req.on_done is not None:
            task.sig_finished.connect(req.on_done)
        if req.on_failed is not None:
            task.sig_failed.connect(req.on_failed)
        return task

    def _finish(self, task: JobTask) -> None:
        self._tasks.pop(task.job_id, None)
        self.sig_job_done.emit(task)

    def running(self) -> list[JobTask]:
        return list(self._tasks.values())

    def cancel_all(self) -> None:
        for t in self.running():
            t.cancel()

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """Cancel every job and wait for the pool; True when all threads have finished."""
        self.cancel_all()
        self._flush()  # cancelled before starting: their workers only close the generator
        ok = bool(self.pool.waitForDone(timeout_ms))
        QtCore.QCoreApplication.sendPostedEvents()
        return ok


class Throttled(QtCore.QObject):
    """`fn(*args)` at most every `interval_ms` on the GUI thread: the first call at once,
    later ones folded into one at the end of the interval (the newest arguments win).
    For what only shows progress: a deploy run reports 20 times a second, and with a 3D
    view in the window every label change repaints it through the software renderer
    (15-25 ms each, several times that on a loaded machine: the window stalled 150-225 ms)."""

    def __init__(
        self, fn: Any, interval_ms: int = 250, parent: QtCore.QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._fn, self._interval = fn, interval_ms / 1000.0
        self._args: tuple[Any, ...] | None = None
        self._last = -1e9
        self._timer = QtCore.QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._fire)

    def __call__(self, *args: Any) -> None:
        self._args = args
        if self._timer.isActive():
            return
        wait = self._last + self._interval - time.monotonic()
        if wait <= 0:
            self._fire()
        else:
            self._timer.start(int(wait * 1000) + 1)

    def cancel(self) -> None:
        """Drop what is pending (the job ended: its last progress must not come after)."""
        self._timer.stop()
        self._args = None

    def _fire(self) -> None:
        args, self._args = self._args, None
        if args is None:
            return
        self._last = time.monotonic()
        self._fn(*args)


class JobProgressWidget(QtWidgets.QWidget):
    """Status-bar widget: title + message, progress bar, Cancel button of the newest job.
    A finished job's outcome ("Fit twin: done at 14:02") stays for `OUTCOME_SHOWN_MS`,
    then the label clears: an old "done" beside a page's new state reads as its outcome."""

    OUTCOME_SHOWN_MS = 15000

    def __init__(self, runner: JobRunner, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.task: JobTask | None = None
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.label = QtWidgets.QLabel("")
        self.bar = QtWidgets.QProgressBar()
        self.bar.setFixedWidth(160)
        self.bar.setTextVisible(True)
        self.cancel_button = QtWidgets.QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the running job at its next step")
        self.cancel_button.clicked.connect(self._cancel)
        for w in (self.label, self.bar, self.cancel_button):
            lay.addWidget(w)
        self._clear = QtCore.QTimer(self)
        self._clear.setSingleShot(True)
        self._clear.timeout.connect(self._clear_outcome)
        self._progress = Throttled(self._apply_progress, parent=self)
        runner.sig_job_started.connect(self._track)
        runner.sig_job_done.connect(self._untrack)
        self._show(False)

    def _show(self, on: bool) -> None:
        self.bar.setVisible(on)
        self.cancel_button.setVisible(on)
        self.label.setVisible(on or bool(self.label.text()))

    def _track(self, task: JobTask) -> None:
        self.task = task
        self._clear.stop()
        task.sig_progress.connect(self._on_progress)
        self.label.setText(f"{task.title}: starting…")
        self.bar.setRange(0, 0)
        self.cancel_button.setEnabled(True)
        self._show(True)

    def _on_progress(self, p: Progress) -> None:
        if self.sender() is self.task:
            self._progress(self.task, p)

    def _apply_progress(self, task: JobTask, p: Progress) -> None:
        if task is not self.task:
            return
        more = len(self.runner.running()) - 1
        extra = f"  (+{more} more)" if more > 0 else ""
        assert self.task is not None
        self.label.setText(f"{self.task.title}: {p.message}{extra}")
        if p.fraction is None:
            self.bar.setRange(0, 0)
        else:
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(round(min(max(p.fraction, 0.0), 1.0) * 1000)))
            self.bar.setFormat(f"{p.fraction * 100:.0f}%")

    def _cancel(self) -> None:
        if self.task is not None:
            self._progress.cancel()
            self.task.cancel()
            self.cancel_button.setEnabled(False)
            self.label.setText(f"{self.task.title}: cancelling…")

    def _untrack(self, task: JobTask) -> None:
        if task is not self.task:
            return
        self._progress.cancel()
        outcome = {"finished": "done", "failed": "failed", "cancelled": "cancelled"}
        when = time.strftime("%H:%M")
        self.label.setText(f"{task.title}: {outcome.get(task.state, task.state)} at {when}")
        others = self.runner.running()
        self.task = None
        if others:
            self._track(others[-1])
        else:
            self._show(False)
            self._clear.start(self.OUTCOME_SHOWN_MS)

    def _clear_outcome(self) -> None:
        if self.task is None:
            self.label.setText("")
            self._show(False)


if __name__ == "__main__":  # preview: a job with progress, cancel, and a failing one
    import sys

    from app.controller import idle_job

    def _failing() -> Job[None]:
        yield Progress(0.5, "about to fail")
        time.sleep(0.5)
        raise TwinbenchError("demo.db3: recording ends after 3 frames (need at least 10)")

    qapp = QtWidgets.QApplication(sys.argv)
    win = QtWidgets.QWidget()
    lay = QtWidgets.QVBoxLayout(win)
    runner = JobRunner(win)
    lay.addWidget(JobProgressWidget(runner))
    out = QtWidgets.QLabel("")
    lay.addWidget(out)
    for text, make in (
        ("Start 5 s job", lambda: idle_job(5.0, 50)),
        ("Start failing job", _failing),
    ):
        b = QtWidgets.QPushButton(text)
        lay.addWidget(b)

        def _go(_: bool = False, make: Any = make, text: str = text) -> None:
            t = runner.start(text, make())
            t.sig_finished.connect(lambda r: out.setText(f"result: {r}"))
            t.sig_failed.connect(out.setText)

        b.clicked.connect(_go)
    win.resize(480, 200)
    win.show()
    from widgets.pages import exec_preview

    code = exec_preview(qapp, win)
    runner.shutdown()
    sys.exit(code)
