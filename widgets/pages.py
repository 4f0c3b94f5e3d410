"""Workflow pages: the contract every page of the main window follows, and the shared
empty state.

Page contract (scan_page.ScanPage, twin_page.TwinPage, calibrate_page.CalibratePage,
policies_page.PoliciesPage, deploy_page.DeployPage):

- A `QWidget` subclass (usually of `WorkflowPage`) with a class attribute `step` naming its
  entry in `app.workflows.STEPS`, constructed as `Page(controller: AppController, parent=None)`.
- It acts only through `controller` (open project, devices, `controller.submit_job(title, job,
  on_done, on_failed)` for anything long — the main window runs it on its worker pool with
  progress and Cancel in the status bar) and through `app.workflows`; it reads core value types
  (Trajectory, meshes…) to draw them. It never blocks the GUI thread.
- It observes `controller.project_changed` / `devices_changed` and redraws; `refresh()` is
  also called by the main window when the page is shown; `detach()` (called when the window
  closes) disconnects those observers and stops any timers the page owns.
- With nothing to work on it shows `EmptyState`: what the page does and what it needs first,
  with a tick for each need already met (from `app.workflows.needs_met`).
- Every page module ends with `if __name__ == "__main__": preview(PageClass)` so
  `python -m widgets.<page>` opens it alone (with the last project, if any).
- Signals follow `sig_<thing>_<event>` / `sig_<verb>_requested`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from app import workflows
from app.controller import AppController, DeviceStatus
from resources.project import Project
from widgets.jobs import JobRunner
from widgets.scene_view import grab_widget, share_gl_contexts

_STYLE = """
QFrame#emptyState { background: palette(base); border: 1px solid palette(mid); border-radius: 8px; }
QLabel#emptyTitle { font-size: 20px; font-weight: 600; }
QLabel#emptyDoes { font-size: 13px; }
QLabel#emptyNeeds { font-size: 13px; }
QLabel#emptyCli { color: #6b6b6b; font-family: monospace; }
"""


class EmptyState(QtWidgets.QFrame):
    """A centred card: step title, what it does, what it needs (ticked when met), CLI line."""

    def __init__(self, step: workflows.Step, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.step = step
        self.setObjectName("emptyState")
        self.setStyleSheet(_STYLE)
        self.setMaximumWidth(640)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(28, 24, 28, 24)
        lay.setSpacing(12)
        num = [s.key for s in workflows.STEPS].index(step.key) + 1
        self.title = QtWidgets.QLabel(f"Step {num} · {step.title}")
        self.title.setObjectName("emptyTitle")
        self.does = QtWidgets.QLabel(step.does)
        self.does.setObjectName("emptyDoes")
        self.does.setWordWrap(True)
        self.needs = QtWidgets.QLabel("")
        self.needs.setObjectName("emptyNeeds")
        self.needs.setWordWrap(True)
        self.needs.setTextFormat(QtCore.Qt.TextFormat.RichText)
        self.hint = QtWidgets.QLabel("")
        self.hint.setWordWrap(True)
        self.cli = QtWidgets.QLabel(
            f"Command line: {step.cli}" if step.cli else "No command line for this step yet."
        )
        self.cli.setObjectName("emptyCli")
        self.cli.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        for w in (self.title, self.does, self.needs, self.hint, self.cli):
            lay.addWidget(w)

    def update_needs(self, project: Project | None, connected: frozenset[str]) -> None:
        rows = []
        for need, ok in workflows.needs_met(self.step, project, connected):
            mark = (
                "<span style='color:#2e7d32'>✔</span>"
                if ok
                else "<span style='color:#c62828'>✘</span>"
            )
            rows.append(f"{mark}&nbsp; {need.label}")
        self.needs.setText("<b>Needs first:</b><br>" + "<br>".join(rows))
        if not self.step.built:
            self.hint.setText(f"<b>Not built yet.</b> {self.step.coming}")
        elif project is None:
            self.hint.setText("No project is open: use File ▸ New project… or Open project….")
        else:
            missing = [
                n.label for n, ok in workflows.needs_met(self.step, project, connected) if not ok
            ]
            if not missing:
                self.hint.setText("Everything this step needs is here.")
            else:  # with one need the list above already says it
                self.hint.setText(f"Start with: {missing[0]}." if len(self.step.needs) > 1 else "")

    def text(self) -> str:
        """All visible text (for tests and accessibility)."""
        return "\n".join(w.text() for w in (self.title, self.does, self.needs, self.hint, self.cli))


class StatusLine(QtWidgets.QLabel):
    """One line of status text that never pushes the page wider or taller: too long for the
    room it has, it ends in "…" and the whole text is its tooltip (and in the log)."""

    def __init__(self, text: str = "", parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setSizePolicy(
            QtWidgets.QSizePolicy.Policy.Ignored, QtWidgets.QSizePolicy.Policy.Preferred
        )
        self.setToolTip(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt name)
        super().setText(text)
        self.setToolTip(text)

    def minimumSizeHint(self) -> QtCore.QSize:  # noqa: N802 (Qt name)
        return QtCore.QSize(0, super().minimumSizeHint().height())

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:  # noqa: N802 (Qt name)
        painter = QtGui.QPainter(self)
        text = self.fontMetrics().elidedText(
            self.text(), QtCore.Qt.TextElideMode.ElideRight, self.contentsRect().width()
        )
        painter.drawText(self.contentsRect(), int(self.alignment()), text)


class WorkflowPage(QtWidgets.QWidget):
    """Base page: an `EmptyState` on top of a body that subclasses fill in.

    Subclasses set `step`, build their body in `build_body(layout)` and decide in
    `has_content()` whether the empty state or the body is shown.
    """

    step: str = ""

    def __init__(
        self,
        controller: AppController,
        parent: QtWidgets.QWidget | None = None,
        runner: JobRunner | None = None,
    ) -> None:
        super().__init__(parent)
        self.controller = controller
        self._runner = runner
        self.step_info = workflows.step(self.step)
        outer = QtWidgets.QVBoxLayout(self)
        self.stack = QtWidgets.QStackedWidget()
        outer.addWidget(self.stack)
        empty_holder = QtWidgets.QWidget()
        el = QtWidgets.QVBoxLayout(empty_holder)
        el.addStretch(1)
        row = QtWidgets.QHBoxLayout()
        row.addStretch(1)
        self.empty = EmptyState(self.step_info)
        row.addWidget(self.empty, 4)
        row.addStretch(1)
        el.addLayout(row)
        el.addStretch(2)
        self.stack.addWidget(empty_holder)
        self.body = QtWidgets.QWidget()
        self.build_body(QtWidgets.QVBoxLayout(self.body))
        self.stack.addWidget(self.body)
        controller.project_changed.connect(self._on_model_changed)
        controller.devices_changed.connect(self._on_model_changed)
        self.refresh()

    @property
    def runner(self) -> JobRunner:
        """The window's job runner, the one the controller's jobs run on too (one pool, one
        job list, the status bar's progress and Cancel, stopped when the window closes); a
        page shown on its own (tests, previews) starts one of its own."""
        if self._runner is None:
            self._runner = JobRunner(self)
        return self._runner

    def _on_model_changed(self, _: Any) -> None:
        # Model callbacks may come from another thread; redraw on ours.
        try:
            QtCore.QTimer.singleShot(0, self, self.refresh)
        except RuntimeError:  # the C++ widget is gone: stop observing
            self.detach()

    def build_body(self, layout: QtWidgets.QVBoxLayout) -> None:
        """Fill the page body (shown when `has_content()`); the base page has none."""

    def has_content(self) -> bool:
        return False

    def connected(self) -> frozenset[str]:
        devs: dict[str, DeviceStatus] = self.controller.devices()
        return frozenset(n for n, d in devs.items() if d.state == "connected")

    def refresh(self) -> None:
        """Redraw from the controller: empty state or body."""
        self.empty.update_needs(self.controller.project, self.connected())
        self.stack.setCurrentIndex(1 if self.has_content() else 0)

    def showing_empty_state(self) -> bool:
        return self.stack.currentIndex() == 0

    def detach(self) -> None:
        """Stop observing the controller (the main window calls this when it closes)."""
        self.controller.project_changed.disconnect(self._on_model_changed)
        self.controller.devices_changed.disconnect(self._on_model_changed)

    def closeEvent(self, event: Any) -> None:  # noqa: N802 (Qt name)
        self.detach()
        super().closeEvent(event)


PREVIEW_SHOT_ENV = "TWINBENCH_PREVIEW_SHOT"
PREVIEW_SETTLE_MS = 1500


def exec_preview(qapp: QtWidgets.QApplication, widget: QtWidgets.QWidget) -> int:
    """Run a preview's event loop. With $TWINBENCH_PREVIEW_SHOT set to a PNG path, save what
    the widget drew once it has been idle for a moment (no pool job running), then quit —
    so tests can check that each preview really draws."""
    shot = os.environ.get(PREVIEW_SHOT_ENV)
    if shot:
        pool = QtCore.QThreadPool.globalInstance()
        state = {"idle_ms": 0}

        def poll() -> None:
            busy = pool.activeThreadCount() > 0
            state["idle_ms"] = 0 if busy else state["idle_ms"] + 100
            if state["idle_ms"] >= PREVIEW_SETTLE_MS:
                timer.stop()
                ok = grab_widget(widget).save(shot)  # 3D views in windows too
                qapp.exit(0 if ok else 3)

        timer = QtCore.QTimer(widget)
        timer.timeout.connect(poll)
        timer.start(100)
    return int(qapp.exec())


def preview(
    page_cls: Callable[[AppController], QtWidgets.QWidget], argv: list[str] | None = None
) -> int:
    """Open one page alone (`python -m widgets.<page> [PROJECT]`), with the last project."""
    argv = list(sys.argv if argv is None else argv)
    share_gl_contexts()
    qapp = QtWidgets.QApplication.instance() or QtWidgets.QApplication(argv[:1])
    controller = AppController()
    controller.install_log_handler()
    if len(argv) > 1:
        controller.open_project(Path(argv[1]))
    else:
        controller.open_last()
    page = page_cls(controller)
    page.setWindowTitle(f"Twinbench preview — {type(page).__name__}")
    page.resize(900, 600)
    page.show()
    try:
        return exec_preview(qapp, page)  # type: ignore[arg-type]
    finally:
        detach = getattr(page, "detach", None)
        if callable(detach):
            detach()
        controller.shutdown()


def spin_box(
    lo: float, hi: float, value: float, step: float, tip: str, suffix: str = ""
) -> QtWidgets.QDoubleSpinBox:
    """A number field with its range, step, unit suffix and tooltip (3 decimals for steps
    under 0.1)."""
    s = QtWidgets.QDoubleSpinBox()
    s.setRange(lo, hi)
    s.setDecimals(3 if step < 0.1 else 2)
    s.setSingleStep(step)
    s.setValue(value)
    s.setSuffix(suffix)
    s.setToolTip(tip)
    return s
