"""Scan page (workflow step: scan): live colour + depth preview, the reconstruction growing
in the 3D view, start / pause / stop, the object list (rename, colour, drop), calibration
residuals, and Accept -> a ScanResult artifact in the project.

It acts only through `app.workflows.scan` (jobs run on the controller's worker pool). The job
is wrapped so that the page can pause it (the worker waits between frames) and read the newest
partial result; a 10 Hz timer draws that result on the GUI thread.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from app.workflows import scan as wf
from app.workflows.scan_robot import scan_lab
from resources.errors import TwinbenchError
from resources.text import count
from widgets.artifact_combo import ArtifactCombo
from widgets.pages import StatusLine, WorkflowPage, preview
from widgets.scan_live import Live, depth_colormap, qimage
from widgets.scan_tables import fill_calibration, fill_objects
from widgets.scene_view import SceneView

log = logging.getLogger(__name__)
IDLE_PREVIEW = "no {} frames yet\n(press Start scan)"  # "{}": colour / depth
PREVIEW_MIN_W = 192  # colour/depth previews shrink to this on a 1366x768 laptop
SOURCES = (
    ("Virtual lab (calibrate + wrist scan)", "lab"),  # fits the box at 1366x768
    ("Virtual lab, quick", "lab-quick"),
    ("RealSense camera (handheld)", "realsense"),
    ("Recording (.db3 / .bag)…", "file"),
)


DEPTH_RANGES: tuple[tuple[str, tuple[float, float] | str], ...] = (
    ("from the data", "auto"),
    ("tabletop 0.3–1.4 m", (0.3, 1.4)),
    ("room 0.5–3.0 m", (0.5, 3.0)),
)


class ScanPage(WorkflowPage):
    """Workflow page for the 'scan' step; constructed as `ScanPage(controller, parent=None)`."""

    step = "scan"
    sig_scan_accepted = QtCore.Signal(str)  # artifact id

    def build_body(self, layout: QtWidgets.QVBoxLayout) -> None:
        self.result: Any = None
        self._live: Live | None = None
        # The artifact the shown result was saved as or opened from: an edit of it is saved as
        # a new scan whose parent it is (artifacts are immutable).
        self._saved_id: str | None = None
        self._edited = False
        self._build_controls(layout)
        self._build_scan_options(layout)
        layout.addWidget(self.status)  # its own row, full width
        split = QtWidgets.QSplitter()
        left = self._build_previews()
        self.scene = SceneView(native_window=True)
        right = self._build_tables()
        panes: tuple[QtWidgets.QWidget, ...] = (left, self.scene, right)
        for pane in panes:
            split.addWidget(pane)
        split.setStretchFactor(1, 3)
        split.setSizes([240, 520, 320])
        split.setChildrenCollapsible(False)
        right.setMinimumWidth(260)
        layout.addWidget(split, 1)
        self.start_btn.clicked.connect(self.start_scan)
        self.pause_btn.toggled.connect(self._pause)
        self.stop_btn.clicked.connect(self._stop)
        self.accept_btn.clicked.connect(self.accept_scan)
        self.color_btn.clicked.connect(self._recolor)
        self.drop_btn.clicked.connect(self._drop)
        self.timer = QtCore.QTimer(self)
        self.timer.setInterval(100)  # 10 Hz: the 3D view and previews redraw at this rate
        self.timer.timeout.connect(self._tick)
        self._set_running(False)

    def _build_controls(self, layout: QtWidgets.QVBoxLayout) -> None:
        """The top bar: the camera source, Start / Pause / Stop & reconstruct and, at the
        right, Accept; the status line is made here and gets its own row below the options."""
        bar = QtWidgets.QHBoxLayout()
        self.source = QtWidgets.QComboBox()
        self.source.setSizeAdjustPolicy(
            QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.source.setMinimumContentsLength(26)  # its longest text, whole, at 1366x768
        for label, key in SOURCES:
            self.source.addItem(label, key)
        self.start_btn = QtWidgets.QPushButton("Start scan")
        self.pause_btn = QtWidgets.QPushButton("Pause")
        self.pause_btn.setCheckable(True)
        self.stop_btn = QtWidgets.QPushButton("Stop && reconstruct")
        self.accept_btn = QtWidgets.QPushButton("Accept → save scan to project")
        self.status = StatusLine("Choose a camera source and press Start.")
        for w in (
            QtWidgets.QLabel("Source:"),
            self.source,
            self.start_btn,
            self.pause_btn,
            self.stop_btn,
        ):
            bar.addWidget(w)
        bar.addStretch(1)
        bar.addWidget(self.accept_btn)
        layout.addLayout(bar)

    def _build_scan_options(self, layout: QtWidgets.QVBoxLayout) -> None:
        """The second row: a saved scan to open, and how a hand-held camera is tracked (depth
        range, loop closure)."""
        saved_row = QtWidgets.QHBoxLayout()
        saved_row.addWidget(QtWidgets.QLabel("Saved scans:"))
        self.saved = ArtifactCombo(
            min_chars=30, what="Open a scan saved in this project to review or edit it"
        )
        self.saved.activated.connect(lambda _i: self.open_saved(self.saved.currentData()))
        saved_row.addWidget(self.saved, 1)
        saved_row.addWidget(QtWidgets.QLabel("Hand-held depth range:"))
        self.depth_range = QtWidgets.QComboBox()
        for label, rng in DEPTH_RANGES:
            self.depth_range.addItem(label, rng)
        self.depth_range.setToolTip(
            "Depth used to track and fuse a hand-held camera (RealSense or a recording without "
            "camera poses). 'From the data' reaches past most of what the first frame sees — "
            "good in a room; on a tabletop the noisy far walls pull the tracker, choose 0.3–1.4 m."
        )
        saved_row.addWidget(self.depth_range)
        self.loop_closure = QtWidgets.QCheckBox("Loop closure")
        self.loop_closure.setToolTip(
            "Hand-held: register keyframes to older ones nearby and correct the whole path at "
            "the end (pose graph). For long recordings that come back to where they started; "
            "slower. A correction that makes the keyframes agree less is not applied."
        )
        saved_row.addWidget(self.loop_closure)
        layout.addLayout(saved_row)

    def _build_previews(self) -> QtWidgets.QWidget:
        """The left pane: the colour and depth previews, dark until frames arrive."""
        left = QtWidgets.QWidget()
        ll = QtWidgets.QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        self.color_view, self.depth_view = QtWidgets.QLabel(), QtWidgets.QLabel()
        for cap, lab in (("Colour", self.color_view), ("Depth", self.depth_view)):
            ll.addWidget(QtWidgets.QLabel(f"<b>{cap}</b>"))
            lab.setMinimumSize(PREVIEW_MIN_W, PREVIEW_MIN_W * 3 // 4)
            lab.setMaximumSize(320, 240)
            lab.setSizePolicy(
                QtWidgets.QSizePolicy.Policy.Expanding, QtWidgets.QSizePolicy.Policy.Expanding
            )
            lab.setStyleSheet("background: #202225; color: #9aa0a6;")
            lab.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)
            ll.addWidget(lab)
        self._placeholders(IDLE_PREVIEW)
        ll.addStretch(1)
        return left

    def _build_tables(self) -> QtWidgets.QWidget:
        """The right pane: the object list (rename, colour, drop), the calibration residuals per
        board view with their summary, and the warnings."""
        right = QtWidgets.QWidget()
        rl = QtWidgets.QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(QtWidgets.QLabel("<b>Objects</b> (double-click a name to rename)"))
        self.objects = QtWidgets.QTableWidget(0, 4)
        self.objects.setHorizontalHeaderLabels(["name", "size (cm)", "watertight", ""])
        self.objects.horizontalHeader().setSectionResizeMode(
            QtWidgets.QHeaderView.ResizeMode.Stretch
        )
        self.objects.itemChanged.connect(self._renamed)
        rl.addWidget(self.objects, 2)
        row = QtWidgets.QHBoxLayout()
        self.color_btn = QtWidgets.QPushButton("Colour…")
        self.drop_btn = QtWidgets.QPushButton("Drop object")
        row.addWidget(self.color_btn)
        row.addWidget(self.drop_btn)
        rl.addLayout(row)
        rl.addWidget(QtWidgets.QLabel("<b>Calibration residuals</b> (per board view)"))
        self.calib = QtWidgets.QTableWidget(0, 4)
        self.calib.setHorizontalHeaderLabels(["view", "mm", "deg", "reproj px"])
        self.calib.horizontalHeader().setSectionResizeMode(QtWidgets.QHeaderView.ResizeMode.Stretch)
        rl.addWidget(self.calib, 2)
        self.calib_summary = QtWidgets.QLabel("")
        self.calib_summary.setWordWrap(True)
        rl.addWidget(self.calib_summary)
        self.warn = QtWidgets.QLabel("")
        self.warn.setWordWrap(True)
        self.warn.setStyleSheet("color: #b26a00;")
        rl.addWidget(self.warn)
        return right

    def has_content(self) -> bool:
        return self.controller.project is not None

    # --- scanning ---------------------------------------------------------------------------
    ROBOT_SOURCE = ("Connected robot (guided wrist scan)", "robot")

    def refresh(self) -> None:
        super().refresh()
        self._fill_saved()
        i = self.source.findData(self.ROBOT_SOURCE[1])
        can = self.controller.can_scan_robot
        if can and i < 0:
            self.source.insertItem(0, *self.ROBOT_SOURCE)
        elif not can and i >= 0:
            self.source.removeItem(i)

    def _fill_saved(self) -> None:
        proj = self.controller.project
        arts = proj.artifacts("scan") if proj is not None else []
        self.saved.set_artifacts(
            arts, placeholder=f"{count(len(arts), 'saved scan')} — choose one to open"
        )
        if self._saved_id is not None:  # the saved scan shown
            self.saved.select(self._saved_id)

    def open_saved(self, scan_id: str | None) -> None:
        """Show a scan saved in the project (read on a worker thread)."""
        proj = self.controller.project
        if proj is None or scan_id is None:
            return

        def done(result: Any) -> None:
            QtCore.QTimer.singleShot(0, self, lambda: self._show_saved(scan_id, result))

        self.controller.submit_job(
            f"Open scan {scan_id}", wf.load_scan_job(proj, scan_id), done, self._failed
        )

    def _show_saved(self, scan_id: str, result: Any) -> None:
        self.show_result(result)
        self._placeholders("no live {} frames\n(a saved scan is shown)")
        self._saved_id, self._edited = scan_id, False
        self.accept_btn.setEnabled(False)  # already in the project; an edit enables it
        self.status.setText(f"{scan_id}: saved scan — rename, recolour or drop objects to edit")

    def _edit(self, result: Any) -> None:
        """An edited result: show it; Accept saves it as a new scan (parent: the saved one)."""
        self._edited = True
        self.show_result(result)

    def start_scan(self, source: str | None = None, path: Path | None = None) -> bool:
        key = source or self.source.currentData()
        opt = wf.ScanOptions(
            depth_range=self.depth_range.currentData(),
            loop_closure=self.loop_closure.isChecked(),
        )
        live = Live()
        opt.stop = live.stop
        import tempfile

        self._rec = Path(tempfile.mkdtemp(prefix="twinbench-scan-")) / "recording.db3"
        if key in ("lab", "lab-quick"):
            job = scan_lab(opt, record=self._rec, quick=key == "lab-quick")
        elif key == "robot":
            try:
                job = self.controller.robot_scan_job(opt, record=self._rec)
            except TwinbenchError as exc:
                self.status.setText(str(exc))
                return False
        elif key == "realsense":
            job = wf.scan_realsense(opt, record=self._rec)
        else:
            if path is None:
                name, _ = QtWidgets.QFileDialog.getOpenFileName(
                    self, "Open a RealSense recording", "", "Recordings (*.db3 *.bag)"
                )
                if not name:
                    return False
                path = Path(name)
            self._rec = path
            job = wf.scan_recording(path, opt)
        self._live, self.result = live, None
        self._saved_id, self._edited = None, False
        self.saved.select(None)  # a new scan: no saved one is shown
        self._placeholders("waiting for the first\n{} frame…")
        self.scene.clear()
        self._set_running(True)
        self.status.setText("starting…")
        self.timer.start()
        self.controller.submit_job(f"Scan ({key})", live.wrap(job), self._done, self._failed)
        return True

    def _pause(self, on: bool) -> None:
        if self._live is not None:
            (self._live.resume.clear if on else self._live.resume.set)()
            self.pause_btn.setText("Resume" if on else "Pause")

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop.set()
            self._live.resume.set()
            self.status.setText("stopping: reconstructing what was scanned…")

    def _tick(self) -> None:
        if self._live is None:
            return
        partial, msg, frac = self._live.take()
        pct = "" if frac is None else f"{frac * 100:.0f}% "
        if msg:
            self.status.setText(pct + msg)
        f = partial.get("frame")
        if f is not None:
            for view, img in (
                (self.color_view, qimage(f.color)),
                (self.depth_view, qimage(depth_colormap(f.depth_m))),
            ):
                view.setPixmap(
                    QtGui.QPixmap.fromImage(img).scaled(
                        view.size(), QtCore.Qt.AspectRatioMode.KeepAspectRatio
                    )
                )
            self._framed = True
        c = partial.get("cloud")
        if c is not None:
            if c.points is not None and len(c.points):
                self.scene.set_points("scan/cloud", c.points, c.colors / 255.0, size_px=2.0)
            if c.live is not None and len(c.live):
                self.scene.set_points("scan/live", c.live, (0.3, 0.8, 1.0, 0.6), size_px=1.5)
            if c.camera is not None:
                self.scene.set_frame("scan/camera", c.camera, size=0.05)
            self._live.updates += 1

    def _placeholders(self, text: str) -> None:
        """Both previews show `text` ("{}": colour / depth) instead of a frame."""
        for cap, lab in (("colour", self.color_view), ("depth", self.depth_view)):
            lab.setText(text.format(cap))  # also drops the previous scan's picture
        self._framed = False

    def _done(self, result: Any) -> None:
        self.timer.stop()
        self._tick()
        self._set_running(False)
        if not self._framed:
            self._placeholders("no {} preview\nfrom this scan")
        log.info(
            "scan finished: %s, %s (not saved yet: review, then Accept)",
            count(len(result.objects), "object"),
            count(len(result.scene_mesh.faces), "triangle"),
        )
        self.show_result(result)

    def _failed(self, message: str) -> None:
        self.timer.stop()
        self._set_running(False)
        if not self._framed:
            self._placeholders(IDLE_PREVIEW)
        self.status.setText(f"failed: {message}")

    def _set_running(self, on: bool) -> None:
        self.start_btn.setEnabled(not on)
        self.source.setEnabled(not on)
        self.pause_btn.setEnabled(on)
        self.stop_btn.setEnabled(on)
        self.accept_btn.setEnabled(not on and self.result is not None)
        if not on:
            self.pause_btn.setChecked(False)

    # --- result -----------------------------------------------------------------------------
    def show_result(self, result: Any) -> None:
        self.result = result
        self.scene.remove("scan/cloud")
        self.scene.remove("scan/live")
        m = result.scene_mesh
        d = result.display_mesh if result.display_mesh is not None else m  # drawn: <= 30k faces
        if len(d.faces):
            self.scene.set_mesh("scan/scene", d.vertices, d.faces, color=(0.62, 0.6, 0.56, 0.35))
        for name in [n for n in self.scene.items() if n.startswith("scan/object/")]:
            self.scene.remove(name)
        for o in result.objects:
            rgba = (*(np.asarray(o.color) / 255.0), 1.0)
            self.scene.set_mesh(
                f"scan/object/{o.name}",
                o.mesh.vertices,
                o.mesh.faces,
                color=rgba,
                transform=o.T_base_object,
            )
        if result.T_base_camera is not None:
            self.scene.set_frame("scan/fixed_camera", result.T_base_camera, size=0.08)
        if result.objects and self.scene.gl_view is not None:  # frame the objects
            c = np.mean([o.T_base_object[:3, 3] for o in result.objects], axis=0)
            self.scene.gl_view.opts["center"] = QtGui.QVector3D(*map(float, c))
            self.scene.gl_view.setCameraPosition(distance=1.1, elevation=35, azimuth=-140)
        self._fill_objects()
        self._fill_calibration()
        self.warn.setText("\n".join(result.warnings[:6]))
        self.status.setText(
            f"{count(len(result.objects), 'object')}, {count(len(m.faces), 'triangle')}"
            " — review, then Accept"
        )
        self.accept_btn.setEnabled(True)

    def _fill_objects(self) -> None:
        fill_objects(self.objects, self.result.objects)

    def _fill_calibration(self) -> None:
        fill_calibration(self.calib, self.calib_summary, self.result.calibration)

    def _selected(self) -> str | None:
        rows = self.objects.selectionModel().selectedRows() if self.objects.selectionModel() else []
        r = rows[0].row() if rows else self.objects.currentRow()
        item = self.objects.item(r, 0) if r >= 0 else None
        return None if item is None else str(item.data(QtCore.Qt.ItemDataRole.UserRole))

    def _renamed(self, item: QtWidgets.QTableWidgetItem) -> None:
        if self.result is None or item.column() != 0:
            return
        old, new = item.data(QtCore.Qt.ItemDataRole.UserRole), item.text().strip()
        # Rebuild the table after the editor has committed and closed: rebuilding it inside
        # itemChanged makes Qt warn "commitData called with an editor that does not belong
        # to this view".
        QtCore.QTimer.singleShot(0, self, lambda: self._apply_rename(old, new))

    def _apply_rename(self, old: str, new: str) -> None:
        if self.result is None or old == new:
            return
        try:
            self._edit(wf.rename_object(self.result, old, new))
        except TwinbenchError as exc:  # shown to the user, the name is reverted
            self.show_result(self.result)
            self.warn.setText(str(exc))

    def _recolor(self) -> None:
        name = self._selected()
        if self.result is None or name is None:
            return
        c = QtWidgets.QColorDialog.getColor(QtGui.QColor(*self.result.object(name).color), self)
        if c.isValid():
            self._edit(wf.recolor_object(self.result, name, (c.red(), c.green(), c.blue())))

    def _drop(self) -> None:
        name = self._selected()
        if self.result is not None and name is not None:
            self.scene.remove(f"scan/object/{name}")
            self._edit(wf.drop_object(self.result, name))

    def accept_scan(self) -> None:
        """Save the shown result as a scan artifact (on a worker thread); an edit of a saved
        scan names that scan as its parent. `sig_scan_accepted` carries the new id."""
        project = self.controller.project
        if self.result is None or project is None:
            return
        parent = self._saved_id if self._edited else None
        rec = getattr(self, "_rec", None) if parent is None else None
        settings = {"source": self.source.currentData()} if parent is None else {"edit_of": parent}
        self.accept_btn.setEnabled(False)

        def done(aid: str) -> None:
            QtCore.QTimer.singleShot(0, self, lambda: self._accepted(aid))

        def failed(msg: str) -> None:
            QtCore.QTimer.singleShot(0, self, lambda: self._failed(msg))

        self.controller.submit_job(
            "Save scan",
            wf.save_scan_job(
                project,
                self.result,
                rec if rec is not None and rec.is_file() else None,
                settings=settings,
                parent=parent,
            ),
            done,
            failed,
        )

    def _accepted(self, aid: str) -> None:
        self._saved_id, self._edited = aid, False
        self.controller.notify_project_changed()
        self.status.setText(f"saved as {aid}")
        self.sig_scan_accepted.emit(aid)

    def unsaved(self) -> list[str]:
        """A scan result not accepted into the project yet (for the quit dialog)."""
        if self.result is not None and (self._saved_id is None or self._edited):
            return ["a scan not accepted into the project (Scan page ▸ Accept)"]
        return []

    def detach(self) -> None:
        self.timer.stop()
        if self._live is not None:
            self._live.stop.set()
            self._live.resume.set()
        super().detach()


if __name__ == "__main__":
    raise SystemExit(preview(ScanPage))
