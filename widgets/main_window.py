"""The main window: workflow steps in a sidebar, one page each; devices and log docks; File
menu; status bar with the running job.
"""

from __future__ import annotations

import gc
import html
import logging
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

import resources
from app import demo, workflows
from app.controller import AppController, JobRequest
from app.jobs import preload_step_libraries
from resources.errors import TwinbenchError
from resources.project import Project
from widgets.calibrate_page import CalibratePage
from widgets.deploy_page import DeployPage
from widgets.devices_panel import DevicesPanel
from widgets.jobs import JobProgressWidget, JobRunner
from widgets.log_panel import LogPanel
from widgets.policies_page import PoliciesPage
from widgets.scan_page import ScanPage
from widgets.twin_page import TwinPage

log = logging.getLogger(__name__)

SIDEBAR_W = 150
DEVICES_W = 330

PAGE_CLASSES: dict[str, Callable[..., QtWidgets.QWidget]] = {
    "scan": ScanPage,
    "twin": TwinPage,
    "calibrate": CalibratePage,
    "policies": PoliciesPage,
    "deploy": DeployPage,
}


def settle_heap() -> None:
    """Move every object alive now out of the garbage collector's reach (`gc.freeze`): they
    are still freed when no longer referenced, but full collections stop walking them. The
    window's heap (Qt, Open3D, PyBullet, torch and their modules: ~180k objects at start)
    took 330-380 ms per full collection with the GIL held on a loaded machine, a freeze of
    the window and of every thread that wanted the GIL (the robot link's heartbeats among
    them). Called once the window is built and after each job, which may have imported
    more; what cyclic garbage is alive at that moment is kept for good (a job's worth)."""
    gc.freeze()


class MainWindow(QtWidgets.QMainWindow):
    """Twinbench's window. Acts only through `controller`; runs jobs on `runner`."""

    sig_project_changed = QtCore.Signal(object)  # Project | None, on the GUI thread

    def __init__(self, controller: AppController, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.runner = JobRunner(self)
        controller.job_executor = self._run_request
        self.setWindowTitle("Twinbench")
        icon = resources.path("icons", "twinbench.svg")
        if icon.is_file():
            self.setWindowIcon(QtGui.QIcon(str(icon)))
        self._fit_to_screen()
        self.last_error: tuple[str, str] | None = None
        self.error_box: QtWidgets.QMessageBox | None = None
        self._reporting = False

        # sidebar + pages
        self.steps = QtWidgets.QListWidget()
        self.steps.setObjectName("steps")
        self.steps.setFixedWidth(SIDEBAR_W)
        self.steps.setStyleSheet(
            "QListWidget#steps { font-size: 14px; border: none; background: palette(window); }"
            "QListWidget#steps::item { padding: 10px 8px; border-radius: 6px; }"
            "QListWidget#steps::item:selected { background: palette(highlight);"
            " color: palette(highlighted-text); }"
        )
        self.pages: dict[str, QtWidgets.QWidget] = {}
        self.stack = QtWidgets.QStackedWidget()
        for i, st in enumerate(workflows.STEPS, start=1):
            item = QtWidgets.QListWidgetItem(f"{i}  {st.title}")
            item.setToolTip(st.does)
            item.setData(QtCore.Qt.ItemDataRole.UserRole, st.key)
            self.steps.addItem(item)
            page = PAGE_CLASSES[st.key](controller, runner=self.runner)
            self.pages[st.key] = page
            self.stack.addWidget(self._scrolling(page))
        self.steps.currentRowChanged.connect(self._on_step)
        central = QtWidgets.QWidget()
        cl = QtWidgets.QHBoxLayout(central)
        cl.setContentsMargins(4, 4, 4, 4)
        side = QtWidgets.QVBoxLayout()
        caption = QtWidgets.QLabel("Workflow")
        caption.setStyleSheet("font-weight: 600; color: #6b6b6b; padding: 4px 8px;")
        side.addWidget(caption)
        side.addWidget(self.steps)
        self.project_label = QtWidgets.QLabel("")
        self.project_label.setWordWrap(True)
        self.project_label.setStyleSheet("padding: 6px 8px; color: #6b6b6b;")
        self.project_label.setFixedWidth(SIDEBAR_W)
        side.addWidget(self.project_label)
        cl.addLayout(side)
        cl.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        # docks
        self.devices_panel = DevicesPanel(controller, runner=self.runner)
        self.devices_dock = self._dock(
            "Devices", self.devices_panel, QtCore.Qt.DockWidgetArea.RightDockWidgetArea
        )
        self.log_panel = LogPanel(controller)
        self.log_dock = self._dock(
            "Log", self.log_panel, QtCore.Qt.DockWidgetArea.BottomDockWidgetArea
        )
        self.resizeDocks([self.devices_dock], [DEVICES_W], QtCore.Qt.Orientation.Horizontal)
        self.resizeDocks([self.log_dock], [110], QtCore.Qt.Orientation.Vertical)

        # status bar
        self.job_widget = JobProgressWidget(self.runner)
        self.statusBar().addPermanentWidget(self.job_widget)

        self._build_menus()
        self.sig_project_changed.connect(
            self._on_project, QtCore.Qt.ConnectionType.QueuedConnection
        )
        controller.project_changed.connect(self._project_from_model)
        controller.recent_changed.connect(self._recent_from_model)
        self._on_project(controller.project)
        self.steps.setCurrentRow(0)
        preload_step_libraries()
        self.runner.sig_job_done.connect(lambda _task: settle_heap())
        settle_heap()

    # -- construction --------------------------------------------------------------------
    def _fit_to_screen(self) -> None:
        """Open at 1400x860 or the screen's available size, whichever is smaller (a
        1366x768 laptop gets a window that fits, docks included)."""
        w, h = 1400, 860
        screen = QtGui.QGuiApplication.primaryScreen()
        if screen is not None:
            avail = screen.availableGeometry()
            w, h = min(w, avail.width()), min(h, avail.height())
        self.resize(w, h)

    @staticmethod
    def _scrolling(page: QtWidgets.QWidget) -> QtWidgets.QScrollArea:
        """A page in a scroll area: a page that needs more room than the window has scrolls
        instead of pushing the window (and its docks) off the screen."""
        area = QtWidgets.QScrollArea()
        area.setWidgetResizable(True)
        area.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        area.setWidget(page)
        return area

    def _dock(
        self, title: str, w: QtWidgets.QWidget, area: QtCore.Qt.DockWidgetArea
    ) -> QtWidgets.QDockWidget:
        d = QtWidgets.QDockWidget(title, self)
        d.setObjectName(f"dock_{title.lower()}")
        d.setWidget(w)
        d.setFeatures(
            QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetClosable
            | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetFloatable
        )
        self.addDockWidget(area, d)
        return d

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        self.act_new = m.addAction("&New project…", self.new_project_dialog)
        self.act_new.setShortcut(QtGui.QKeySequence.StandardKey.New)
        self.act_open = m.addAction("&Open project…", self.open_project_dialog)
        self.act_open.setShortcut(QtGui.QKeySequence.StandardKey.Open)
        self.recent_menu = m.addMenu("Open &recent")
        self.act_save = m.addAction("&Save", self.save_project)
        self.act_save.setShortcut(QtGui.QKeySequence.StandardKey.Save)
        m.addSeparator()
        self.act_quit = m.addAction("&Quit", self.close)
        self.act_quit.setShortcut(QtGui.QKeySequence.StandardKey.Quit)
        d = self.menuBar().addMenu("&Devices")
        self.act_start_lab = d.addAction("Start &virtual lab", self.start_lab)
        self.act_start_lab.setToolTip(
            "Start the MuJoCo virtual lab as a robot + cameras and "
            "connect to it (what `python main.py demo` does)"
        )
        self.act_disconnect = d.addAction("&Disconnect robot", self.controller.detach_robot)
        v = self.menuBar().addMenu("&View")
        v.addAction(self.devices_dock.toggleViewAction())
        v.addAction(self.log_dock.toggleViewAction())
        h = self.menuBar().addMenu("&Help")
        h.addAction("&About Twinbench", self._about)
        self._fill_recent()

    def _recent_from_model(self, _: Any) -> None:
        try:
            QtCore.QTimer.singleShot(0, self, self._fill_recent)
        except RuntimeError:  # window already destroyed
            self.controller.recent_changed.disconnect(self._recent_from_model)

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        recent = self.controller.recent_projects()
        for p in recent:
            a = self.recent_menu.addAction(str(p))
            a.triggered.connect(lambda _=False, p=p: self._open_recent(p))
        if not recent:
            a = self.recent_menu.addAction("(no recent projects)")
            a.setEnabled(False)

    # -- pages ---------------------------------------------------------------------------
    def _on_step(self, row: int) -> None:
        if row < 0:
            return
        self.stack.setCurrentIndex(row)
        page = list(self.pages.values())[row]
        refresh = getattr(page, "refresh", None)
        if callable(refresh):
            refresh()

    def show_step(self, key: str) -> QtWidgets.QWidget:
        """Switch to the page of step `key` and return it."""
        self.steps.setCurrentRow(list(self.pages).index(key))
        return self.pages[key]

    def current_step(self) -> str:
        return list(self.pages)[self.stack.currentIndex()]

    # -- project -------------------------------------------------------------------------
    def _project_from_model(self, proj: Project | None) -> None:
        try:
            self.sig_project_changed.emit(proj)
        except RuntimeError:  # window already destroyed
            self.controller.project_changed.disconnect(self._project_from_model)

    def _on_project(self, proj: Project | None) -> None:
        if proj is None:
            self.setWindowTitle("Twinbench — no project")
            self.project_label.setText("No project open.\nFile ▸ New project… or Open project…")
        else:
            self.setWindowTitle(f"Twinbench — {proj.name}")
            n = len(proj.artifacts())
            # one line each, shortened in the middle to the sidebar's width (a long folder
            # name was cut off at its edge); the whole path is the tooltip
            fm, room = self.project_label.fontMetrics(), SIDEBAR_W - 20
            bold = QtGui.QFont(self.project_label.font())
            bold.setBold(True)
            mid = QtCore.Qt.TextElideMode.ElideMiddle
            name = QtGui.QFontMetrics(bold).elidedText(
                proj.name, mid, room - fm.horizontalAdvance("Project: ")
            )
            small = QtGui.QFont(self.project_label.font())  # rich text's <small>: 1/1.2
            if small.pointSizeF() > 0:
                small.setPointSizeF(small.pointSizeF() / 1.2)
            sm = QtGui.QFontMetrics(small)
            folder = sm.elidedText(str(proj.root.parent), mid, room - sm.horizontalAdvance("in "))
            self.project_label.setText(
                f"Project: <b>{html.escape(name)}</b><br><small>in {html.escape(folder)}"
                f"<br>{n} artifact{'s' if n != 1 else ''}</small>"
            )
            self.project_label.setToolTip(str(proj.root))
        self.act_save.setEnabled(proj is not None)

    def new_project_dialog(self) -> None:
        start = str(Path.home())
        path, _ = QtWidgets.QFileDialog.getSaveFileName(
            self,
            "New project: choose a name for the new project folder",
            start,
            "",
            options=QtWidgets.QFileDialog.Option.DontConfirmOverwrite,
        )
        if path:
            self.new_project(Path(path))

    def open_project_dialog(self) -> None:
        recent = self.controller.recent_projects()
        start = str(recent[0].parent) if recent else str(Path.home())
        path = QtWidgets.QFileDialog.getExistingDirectory(self, "Open project folder", start)
        if path:
            self.open_project(Path(path))

    def new_project(self, path: Path) -> Project | None:
        try:
            return self.controller.new_project(path)
        except TwinbenchError as exc:
            self.show_error("Cannot create project", str(exc))
            return None

    def open_project(self, path: Path) -> Project | None:
        try:
            return self.controller.open_project(path)
        except TwinbenchError as exc:
            self.show_error("Cannot open project", str(exc))
            return None

    def _open_recent(self, path: Path) -> None:
        if self.open_project(path) is None and not path.exists():
            self.controller.forget_recent(path)  # gone for good: drop it from the list

    def start_lab(self) -> None:
        """Start the virtual lab and connect to it (Devices ▸ Start virtual lab)."""
        if self.controller.robot_link is not None:
            self.show_error(
                "Robot already connected",
                "Disconnect the current robot first (Devices ▸ Disconnect robot).",
            )
            return
        demo.start_lab(self.controller)

    def save_project(self) -> None:
        try:
            self.controller.save_project()
            self.statusBar().showMessage("Project saved", 3000)
        except TwinbenchError as exc:
            self.show_error("Cannot save project", str(exc))

    # -- errors, jobs ----------------------------------------------------------------------
    def show_error(self, title: str, message: str, logged: bool = False) -> None:
        """Show the error in a (non-blocking) message box and the status bar, and log it
        unless it is `logged` already (a failed job: the job runner logged it, once)."""
        if not logged:
            log.error("%s: %s", title, message)
        self.last_error = (title, message)
        self.statusBar().showMessage(f"{title}: {message}", 10000)
        box = QtWidgets.QMessageBox(
            QtWidgets.QMessageBox.Icon.Critical,
            title,
            message,
            QtWidgets.QMessageBox.StandardButton.Ok,
            self,
        )
        box.setAttribute(QtCore.Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.error_box = box

    def report_unexpected(
        self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        """An exception no slot handled (installed as `sys.excepthook` by the app): log it
        with its traceback and show it; the window keeps running."""
        log.error("unexpected error: %s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))
        if self._reporting:  # an error while showing an error: the log has it
            return
        self._reporting = True
        try:
            self.show_error(
                "Unexpected error",
                f"{exc_type.__name__}: {exc}\n\nThe app keeps running; the full traceback "
                "is in the Log panel. Please report it.",
                logged=True,
            )
        finally:
            self._reporting = False

    def _run_request(self, req: JobRequest) -> None:
        on_failed = req.on_failed

        def failed(msg: str) -> None:
            if not req.meta.get("quiet"):  # the runner has logged it: not twice
                self.show_error(f"{req.title} failed", msg, logged=True)
            if on_failed is not None:
                on_failed(msg)

        self.runner.run_request(JobRequest(req.title, req.job, req.on_done, failed, req.meta))

    def _about(self) -> None:
        QtWidgets.QMessageBox.about(
            self,
            "About Twinbench",
            "Twinbench closes the Real → Sim → Real loop for one robot workspace: scan it, "
            "build a digital twin, calibrate it against recorded motion, train a policy in "
            "the twin and deploy it to the robot.",
        )

    # -- shutdown --------------------------------------------------------------------------
    def unsaved_work(self) -> list[str]:
        """What closing now would lose: each page's own account (`unsaved()`)."""
        out: list[str] = []
        for page in self.pages.values():
            unsaved = getattr(page, "unsaved", None)
            if callable(unsaved):
                out += unsaved()
        return out

    def closeEvent(self, event: QtGui.QCloseEvent) -> None:  # noqa: N802 (Qt name)
        lost = [] if getattr(self, "_shut", False) else self.unsaved_work()
        if lost:
            answer = QtWidgets.QMessageBox.question(
                self,
                "Quit Twinbench?",
                "Not saved yet:\n• " + "\n• ".join(lost) + "\n\nQuit anyway and lose it?",
                QtWidgets.QMessageBox.StandardButton.Discard
                | QtWidgets.QMessageBox.StandardButton.Cancel,
                QtWidgets.QMessageBox.StandardButton.Cancel,
            )
            if answer != QtWidgets.QMessageBox.StandardButton.Discard:
                event.ignore()
                return
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Cancel jobs, stop timers and observers, disconnect devices. Safe to call twice."""
        if getattr(self, "_shut", False):
            return
        self._shut = True
        if not self.runner.shutdown(10000):
            log.warning("some jobs did not stop within 10 s")
        self.devices_panel.detach()
        self.log_panel.detach()
        for page in self.pages.values():
            detach: Any = getattr(page, "detach", None)
            if callable(detach):
                detach()
        self.controller.project_changed.disconnect(self._project_from_model)
        self.controller.recent_changed.disconnect(self._recent_from_model)
        if self.controller.job_executor == self._run_request:
            self.controller.job_executor = None
        self.controller.shutdown()
