"""Twin page (workflow step: twin): see, edit, play and save a digital twin.

3D view of the twin (robot meshes, objects, collision shapes on a toggle, frames), a tree of
every parameter generated from the twin's ParamSet (units, bounds; edits rebuild the world,
throttled), play / pause / step / reset, numeric object placement, and "Save as new twin"
(a new artifact whose parent is the twin it came from). Acts only through
app.workflows.twin; with no twin yet it offers to build one from the latest scan (or the
procedural demo objects).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets
from scipy.spatial.transform import Rotation

from app.controller import data_dir
from app.workflows import twin as twin_flow
from app.workflows.twin_live import LiveTwin, TwinFrame
from resources.jobs import run_to_end
from resources.project import Project
from widgets.artifact_combo import ArtifactCombo
from widgets.pages import WorkflowPage, preview
from widgets.scene_view import SceneView

log = logging.getLogger(__name__)
TICK_S = 1 / 30


def _qmat(T: np.ndarray) -> QtGui.QMatrix4x4:
    return QtGui.QMatrix4x4(*np.asarray(T, dtype=float).reshape(-1))


class ParamTree(QtWidgets.QTreeWidget):
    """The twin's parameters grouped by their dotted names, one spin box per number."""

    sig_values_edited = QtCore.Signal(dict)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setColumnCount(3)
        self.setHeaderLabels(["parameter", "value", "unit  [bounds]"])
        self.setAlternatingRowColors(True)
        self.header().setSectionResizeMode(0, QtWidgets.QHeaderView.ResizeMode.ResizeToContents)
        self.header().setStretchLastSection(True)
        self.spins: dict[str, QtWidgets.QDoubleSpinBox] = {}
        self._pending: dict[str, float] = {}
        self._timer = QtCore.QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(300)  # slider storms become one rebuild
        self._timer.timeout.connect(self._flush)

    def populate(self, params: Any, values: dict[str, float]) -> None:
        self.clear()
        self.spins.clear()
        groups: dict[str, QtWidgets.QTreeWidgetItem] = {}
        for name, p in params.items():
            parts = name.split(".")
            parent: Any = self.invisibleRootItem()
            for depth in range(1, len(parts)):
                key = ".".join(parts[:depth])
                if key not in groups:
                    groups[key] = QtWidgets.QTreeWidgetItem(parent, [parts[depth - 1]])
                parent = groups[key]
            item = QtWidgets.QTreeWidgetItem(
                parent, [parts[-1], "", f"{p.unit}  [{p.low:g}, {p.high:g}]"]
            )
            item.setToolTip(0, f"{name}\nprior: {p.prior}" + (f"\n{p.doc}" if p.doc else ""))
            spin = QtWidgets.QDoubleSpinBox()
            spin.setRange(p.low, p.high)
            span = max(abs(p.high), abs(p.low), 1e-12)
            spin.setDecimals(0 if p.integer else int(np.clip(4 - np.floor(np.log10(span)), 2, 9)))
            spin.setSingleStep((p.high - p.low) / 100 if p.high > p.low else 1.0)
            spin.setValue(values.get(name, p.nominal))
            spin.setKeyboardTracking(False)
            spin.valueChanged.connect(lambda v, n=name: self._edited(n, v))
            self.setItemWidget(item, 1, spin)
            self.spins[name] = spin
        for key, it in groups.items():
            it.setExpanded(key.count(".") < 1 or key.startswith("objects"))

    def _edited(self, name: str, value: float) -> None:
        self._pending[name] = float(value)
        self._timer.start()

    def _flush(self) -> None:
        if self._pending:
            vals, self._pending = self._pending, {}
            self.sig_values_edited.emit(vals)

    def set_values(self, values: dict[str, float]) -> None:
        for n, v in values.items():
            spin = self.spins.get(n)
            if spin is not None and spin.value() != v:
                spin.blockSignals(True)
                spin.setValue(v)
                spin.blockSignals(False)


class TwinPage(WorkflowPage):
    """Workflow page for the 'twin' step; constructed as `TwinPage(controller, parent=None)`.

    The twin's world lives on a `LiveTwin` worker (app layer): buttons and edits send it
    commands, and this page only draws the frames it publishes."""

    step = "twin"
    sig_twin_saved = QtCore.Signal(str)
    sig_frame_ready = QtCore.Signal()  # from the twin worker; drawn on the GUI thread

    def build_body(self, layout: QtWidgets.QVBoxLayout) -> None:
        self.live: LiveTwin | None = None
        self._closing: list[LiveTwin] = []  # closed, their workers still stopping
        self.spec: Any = None
        self._drawables: list[Any] = []
        self._loading_id: str | None = None
        self._last_frame: TwinFrame | None = None
        self.frames_drawn = 0  # tests and the gui bench read it
        bar1 = QtWidgets.QHBoxLayout()
        self.twin_combo = ArtifactCombo(min_chars=18)  # shows the open twin
        self.twin_combo.setMinimumWidth(160)
        self.twin_combo.activated.connect(lambda _i: self.open_twin(self.twin_combo.currentData()))
        self.build_btn = QtWidgets.QPushButton("Build from latest scan")
        self.build_btn.clicked.connect(lambda: self.build_twin(procedural=False))
        self.demo_btn = QtWidgets.QPushButton("Build from demo objects")
        self.demo_btn.clicked.connect(lambda: self.build_twin(procedural=True))
        self.save_btn = QtWidgets.QPushButton("Save as new twin")
        self.save_btn.setToolTip(
            "Write the edited values and object poses as a new twin artifact whose parent is "
            "this twin (artifacts are never changed in place)"
        )
        self.save_btn.clicked.connect(self.save_twin)
        bar1.addWidget(QtWidgets.QLabel("Twin:"))
        bar1.addWidget(self.twin_combo, 1)
        for w in (self.build_btn, self.demo_btn, self.save_btn):
            bar1.addWidget(w)
        layout.addLayout(bar1)
        bar2 = QtWidgets.QHBoxLayout()
        self.play_btn = QtWidgets.QPushButton("▶ Play")
        self.play_btn.setCheckable(True)
        self.play_btn.toggled.connect(self._play_toggled)
        self.step_btn = QtWidgets.QPushButton("Step")
        self.step_btn.setToolTip(f"Advance the simulation by {TICK_S * 1000:.0f} ms")
        self.step_btn.clicked.connect(self.step_once)
        self.reset_btn = QtWidgets.QPushButton("Reset")
        self.reset_btn.clicked.connect(self.reset_sim)
        self.hull_box = QtWidgets.QCheckBox("collision shapes")
        self.hull_box.toggled.connect(lambda _c: self.redraw(full=True))
        self.frame_box = QtWidgets.QCheckBox("frames")
        self.frame_box.toggled.connect(lambda _c: self.redraw(full=True))
        controls: tuple[QtWidgets.QWidget, ...] = (
            self.play_btn,
            self.step_btn,
            self.reset_btn,
            self.hull_box,
            self.frame_box,
        )
        for control in controls:
            bar2.addWidget(control)
        bar2.addStretch(1)
        layout.addLayout(bar2)
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        left = QtWidgets.QWidget()
        ll = QtWidgets.QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        self.tree = ParamTree()
        self.tree.sig_values_edited.connect(self.apply_values)
        ll.addWidget(self.tree, 1)
        ll.addWidget(self._pose_box())
        self.notes = QtWidgets.QLabel("")
        self.notes.setWordWrap(True)
        self.notes.setStyleSheet("color: #8a6d00;")
        self.notes.setAlignment(QtCore.Qt.AlignmentFlag.AlignTop)
        # a scan's notes (primitive fits, decompositions) run long: they scroll in their own
        # box rather than make the page taller than a laptop screen
        self.notes_area = QtWidgets.QScrollArea()
        self.notes_area.setWidgetResizable(True)
        self.notes_area.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        self.notes_area.setWidget(self.notes)
        self.notes_area.setMaximumHeight(140)
        self.notes_area.setVisible(False)
        ll.addWidget(self.notes_area)
        left.setMinimumWidth(260)
        split.addWidget(left)
        self.view = SceneView(native_window=True)
        split.addWidget(self.view)
        split.setSizes([380, 620])
        split.setChildrenCollapsible(False)
        layout.addWidget(split, 1)
        self.status = QtWidgets.QLabel("")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        self.sig_frame_ready.connect(self._on_frame, QtCore.Qt.ConnectionType.QueuedConnection)

    def _pose_box(self) -> QtWidgets.QGroupBox:
        box = QtWidgets.QGroupBox("Move object (start pose)")
        grid = QtWidgets.QGridLayout(box)
        self.obj_combo = QtWidgets.QComboBox()
        self.obj_combo.currentTextChanged.connect(self._show_pose)
        grid.addWidget(self.obj_combo, 0, 0, 1, 4)
        self.pose_spins: list[QtWidgets.QDoubleSpinBox] = []
        for i, (label, lo, hi, suffix) in enumerate(
            (("x", -2, 2, " m"), ("y", -2, 2, " m"), ("z", -1, 2, " m"), ("yaw", -180, 180, "°"))
        ):
            s = QtWidgets.QDoubleSpinBox()
            s.setRange(lo, hi)
            s.setDecimals(3 if suffix == " m" else 1)
            s.setSingleStep(0.01 if suffix == " m" else 5)
            s.setSuffix(suffix)
            grid.addWidget(QtWidgets.QLabel(label), 1 + i // 2, (i % 2) * 2)
            grid.addWidget(s, 1 + i // 2, (i % 2) * 2 + 1)
            self.pose_spins.append(s)
        self.move_btn = QtWidgets.QPushButton("Move")
        self.move_btn.clicked.connect(self.move_object)
        grid.addWidget(self.move_btn, 3, 0, 1, 4)
        return box

    # -- state -----------------------------------------------------------------------------
    @property
    def twin_id(self) -> str | None:
        f = self._last_frame
        return f.twin_id if f is not None else None

    def has_content(self) -> bool:
        proj = self.controller.project
        return (
            self.live is not None
            or (proj is not None and bool(proj.artifacts("twin")))
            or (proj is not None and bool(proj.artifacts("scan")))
        )

    def refresh(self) -> None:
        super().refresh()
        proj = self.controller.project
        if proj is None:
            self._close_live()
            return
        twins = proj.artifacts("twin")
        ids = [a.id for a in twins]
        self.twin_combo.set_artifacts(twins)
        self.build_btn.setEnabled(bool(proj.artifacts("scan")))
        shown = self._loading_id or self.twin_id
        if shown in ids:
            self.twin_combo.setCurrentIndex(self.twin_combo.findData(shown))
        elif twins and self._loading_id is None:
            self.open_twin(twins[-1].id)
        self._update_status()

    def _close_live(self, wait: bool = False) -> None:
        """Close the open twin; its worker closes the world on its own (the GUI thread
        does not wait for that unless `wait`)."""
        self.play_btn.setChecked(False)
        if self.live is not None:
            self.live.close(wait=False)
            self._closing.append(self.live)
            self.live = None
        self._closing = [c for c in self._closing if c.alive]
        if wait:
            for c in self._closing:
                c.close()
            self._closing = []
        self._last_frame = None
        self._drawables = []
        self.view.clear()

    def unsaved(self) -> list[str]:
        """Edits that exist only in the open twin (for the quit dialog)."""
        f = self._last_frame
        if f is not None and f.edited:
            return [f"edited twin {f.twin_id} (Twin page ▸ Save as new twin)"]
        return []

    def detach(self) -> None:
        self._detached = True  # a twin opened by a job still in flight is closed on arrival
        self._close_live(wait=True)
        super().detach()

    # -- actions ---------------------------------------------------------------------------
    def _fail(self, what: str) -> Any:
        def show(msg: str) -> None:
            self._loading_id = None
            self._show_error(f"{what} failed: {msg}")

        return lambda msg: QtCore.QTimer.singleShot(0, self, lambda: show(msg))

    def _show_error(self, text: str) -> None:
        self.status.setStyleSheet("color: #c62828;")
        self.status.setText(text)

    def open_twin(self, twin_id: str | None) -> None:
        proj = self.controller.project
        if proj is None or twin_id is None or twin_id in (self.twin_id, self._loading_id):
            return
        self._loading_id = twin_id
        self.twin_combo.setCurrentIndex(max(0, self.twin_combo.findData(twin_id)))
        self.controller.submit_job(
            f"Open twin {twin_id}",
            twin_flow.open_session_job(proj, twin_id),
            lambda s: QtCore.QTimer.singleShot(0, self, lambda: self._set_session(s)),
            self._fail("Opening the twin"),
        )

    def _set_session(self, session: twin_flow.TwinSession) -> None:
        if getattr(self, "_detached", False):  # the window shut down while it was opening
            session.close()
            return
        if session.twin_id != self._loading_id:  # another twin was asked for meanwhile
            session.close()
            return
        self._loading_id = None
        self._close_live()
        self.spec = session.spec
        self._drawables = session.drawables()  # built by the job, read-only from here
        self.tree.populate(session.spec.params, session.values)
        self.obj_combo.blockSignals(True)
        self.obj_combo.clear()
        self.obj_combo.addItems([o.name for o in session.spec.objects])
        self.obj_combo.blockSignals(False)
        notes = session.notes
        self.notes.setText(("Notes:\n• " + "\n• ".join(notes)) if notes else "")
        self.notes_area.setVisible(bool(notes))
        self.live = LiveTwin(session, self._frame_from_worker)
        self.view.clear()
        self.view.look_at((0.35, 0.0, 0.15), 1.8)
        self.stack.setCurrentIndex(1)
        idx = self.twin_combo.findData(session.twin_id)
        if idx >= 0:
            self.twin_combo.setCurrentIndex(idx)

    def _frame_from_worker(self) -> None:
        try:
            self.sig_frame_ready.emit()
        except RuntimeError:  # page already destroyed
            pass

    def _on_frame(self) -> None:
        live = self.live
        frame = live.take_frame() if live is not None else None
        if frame is None:
            return
        first = self._last_frame is None
        self._last_frame = frame
        self.tree.set_values(dict(frame.values))
        if first:
            self._show_pose(self.obj_combo.currentText())
        self.redraw(full=first)
        self.frames_drawn += 1
        if frame.saved_id:
            self.controller.notify_project_changed()
            self.sig_twin_saved.emit(frame.saved_id)
        if frame.error:
            self.play_btn.setChecked(frame.playing)
            self._show_error(frame.error)
        else:
            self._update_status(frame.message)

    def build_twin(self, procedural: bool) -> None:
        proj = self.controller.project
        if proj is None:
            return
        job = twin_flow.build_twin(proj, None, procedural=procedural)

        def done(tid: str) -> None:
            log.info("built twin %s", tid)
            self.controller.notify_project_changed()
            QtCore.QTimer.singleShot(0, self, lambda: self.open_twin(tid))

        self.controller.submit_job("Build twin", job, done, self._fail("Building the twin"))

    def apply_values(self, values: dict[str, float]) -> None:
        if self.live is not None:
            self.live.set_values(values)

    def _show_pose(self, name: str) -> None:
        f = self._last_frame
        if f is None or not name or name not in f.object_poses:
            return
        pose = np.asarray(f.object_poses[name])
        yaw = Rotation.from_quat(pose[3:]).as_euler("zyx", degrees=True)[0]
        for s, v in zip(self.pose_spins, (*pose[:3], yaw), strict=True):
            s.setValue(float(v))

    def move_object(self) -> None:
        f = self._last_frame
        name = self.obj_combo.currentText()
        if self.live is None or f is None or name not in f.object_poses:
            return
        x, y, z, yaw = (s.value() for s in self.pose_spins)
        old = np.asarray(f.object_poses[name])
        r, p, _ = Rotation.from_quat(old[3:]).as_euler("xyz")
        q = Rotation.from_euler("zyx", [np.radians(yaw), 0, 0]) * Rotation.from_euler("xy", [r, p])
        self.live.move_object(name, (x, y, z, *q.as_quat()))

    def step_once(self) -> None:
        if self.live is not None:
            self.live.step(TICK_S)

    def reset_sim(self) -> None:
        if self.live is not None:
            self.live.reset()

    def _play_toggled(self, on: bool) -> None:
        self.play_btn.setText("Pause" if on else "▶ Play")
        if self.live is not None:
            self.live.play(on)

    def save_twin(self) -> None:
        proj = self.controller.project
        if self.live is not None and proj is not None:
            self._update_status("saving…")
            self.live.save(proj)

    # -- drawing ---------------------------------------------------------------------------
    def redraw(self, full: bool = False) -> None:
        f = self._last_frame
        if f is None:
            return
        poses = f.poses
        show_col = self.hull_box.isChecked()
        if full:
            self.view.clear()
        items = self.view.items()
        for d in self._drawables:
            T = poses.get(d.body, np.eye(4)) @ d.T_body_mesh
            if d.collision and not show_col:
                continue
            item = items.get(d.name)
            if item is None or full:
                self.view.set_mesh(d.name, d.vertices, d.faces, d.rgba, T)
            else:
                item.data["transform"] = T
                for g in item.gl:
                    g.setTransform(_qmat(T))
        if self.frame_box.isChecked():
            for body, T in poses.items():
                if "/" not in body or body.endswith(("link0", "hand")):
                    self.view.set_frame(f"frame:{body}", T, size=0.06)

    def _update_status(self, extra: str = "") -> None:
        f = self._last_frame
        if f is None or self.spec is None:
            self.status.setText("opening the twin…" if self._loading_id else "")
            return
        self.status.setStyleSheet("")
        edited = "  (edited — save as a new twin to keep it)" if f.edited else ""
        rtf = (
            f", {f.realtime_factor:.2f}× real time"
            if f.playing and f.realtime_factor is not None
            else ""
        )
        text = (
            f"{self.spec.name}: {len(self.spec.objects)} objects, "
            f"{len(self.spec.params)} parameters, t = {f.time_s:.2f} s{rtf}{edited}"
            + (f"  — {extra}" if extra else "")
        )
        if self.status.text() != text:
            self.status.setText(text)


def demo_project() -> str:
    """The preview's project: <data dir>/twin-preview with the procedural demo twin (made
    once, reused after)."""
    root = data_dir() / "twin-preview"
    # A folder that exists but does not open is someone's data: the error says why, and
    # nothing is deleted.
    proj = Project.open(root) if root.exists() else Project.create(root, "twin preview")
    if proj.latest("twin") is None:
        run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    return str(root)


if __name__ == "__main__":
    import sys

    args = sys.argv[1:] or [demo_project()]
    raise SystemExit(preview(TwinPage, [sys.argv[0], *args]))
