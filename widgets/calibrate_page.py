"""Calibrate page (workflow step: calibrate): tune the twin by eye against recorded motion,
then fit it.

Pick a twin and tick recordings. Real and simulated channels are overlaid per joint and per
object (real solid, sim dashed) with the residual (real − sim) below, time from 0, one unit
per channel kind. The 3D view shows the recorded motion (solid) with the twin's replay as a
translucent blue ghost, both at the plots' time cursor. The parameter panel is generated from
the twin's ParamSet; every move re-simulates the visible recordings on the
`LiveCalibration` worker (newest change wins) and this page only draws what it publishes.
"Fit…" opens the fit window (live convergence, posterior pair plot, Apply).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from PySide6 import QtCore, QtWidgets

from app import workflows
from app.workflows import calibrate_open
from app.workflows.calibrate_live import CalibFrame, LiveCalibration
from app.workflows.calibrate_open import CalibrationInputs
from resources.errors import TwinbenchError
from widgets.calibrate_draw import (
    SimCurves,
    build_scene,
    channel_series,
    default_view,
    demo_project,
    joint_units,
    place_bodies,
)
from widgets.calibrate_toolbar import CalibrateToolbar

# imported with the page, not on the click: its first import (the fit's workflow and twins
# modules) took 0.44 s on a quiet machine, a frozen window when "Fit…" was pressed
from widgets.fit_panel import FitDialog
from widgets.pages import StatusLine, WorkflowPage, preview
from widgets.param_sliders import ParamSliders
from widgets.scene_view import SceneView
from widgets.trajectory_plot import Series, TrajectoryPlot

log = logging.getLogger(__name__)
# replays run in worker processes (PyBullet keeps Python's GIL while it steps), one per core:
# one more (5 windows on 2 cores: 2+2+1 shared by the OS, not 3+2) ended a move sooner only
# on idle cores and cost ~16 ms more CPU a move (every worker retunes its own world)
REPLAY_PROCESSES = max(1, min(4, os.cpu_count() or 1))


class CalibratePage(WorkflowPage):
    """Workflow page for the 'calibrate' step; `CalibratePage(controller, parent=None)`."""

    step = "calibrate"
    sig_frame_ready = QtCore.Signal()  # from the worker; drawn on the GUI thread
    sig_redrawn = QtCore.Signal(int)  # the edit number a finished redraw includes

    def build_body(self, layout: QtWidgets.QVBoxLayout) -> None:
        self.live: LiveCalibration | None = None
        self._closing: list[LiveCalibration] = []  # closed, their workers still stopping
        self._stale = False  # something changed while the page was out of view
        self._pending_open: tuple[CalibrationInputs, tuple[str, tuple[str, ...]]] | None = None
        self.inputs: CalibrationInputs | None = None
        self._loading: tuple[str, tuple[str, ...]] | None = None
        self._opened_for: tuple[str, tuple[str, ...]] | None = None
        self._last: CalibFrame | None = None
        self._real_series: dict[str, list[Series]] = {}
        self._shown_series: set[str] = set()
        self._ghost_ready = False
        self.curves = SimCurves()
        self.frames_drawn = 0
        self.scene_moved = False  # the last redraw moved something in the 3D view
        self.fit_dialog: Any = None
        self.toolbar = bar = CalibrateToolbar()  # widgets/calibrate_toolbar.py
        self.twin_combo, self.window_combo = bar.twin_combo, bar.window_combo
        self.reset_btn, self.save_btn, self.fit_btn = bar.reset_btn, bar.save_btn, bar.fit_btn
        bar.sig_twin_chosen.connect(self.reload)
        bar.sig_reset.connect(self.reset_values)
        bar.sig_fit.connect(self.open_fit)
        bar.sig_save.connect(self.save_twin)
        bar.sig_window_changed.connect(self._window_changed)
        layout.addWidget(bar)
        self.banner = QtWidgets.QLabel("")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet(
            "background: #fff3cd; color: #5c4400; padding: 6px; border-radius: 4px;"
        )
        layout.addWidget(self.banner)
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        split.setChildrenCollapsible(False)
        tabs = QtWidgets.QTabWidget()
        self.sliders = ParamSliders()
        self.sliders.sig_values_edited.connect(self.apply_values)
        tabs.addTab(self.sliders, "Parameters")
        rec_tab = QtWidgets.QWidget()
        rl = QtWidgets.QVBoxLayout(rec_tab)
        rl.setContentsMargins(2, 2, 2, 2)
        rl.addWidget(QtWidgets.QLabel("<b>Recordings</b> (tick to simulate)"))
        self.traj_list = QtWidgets.QListWidget()
        self.traj_list.itemChanged.connect(lambda _it: self._recordings_ticked())
        rl.addWidget(self.traj_list, 1)
        self.plot = TrajectoryPlot()
        side = self.plot.side_layout.parentWidget()
        assert side is not None
        rl.addWidget(side, 2)  # the plot's series list lives in this tab
        tabs.addTab(rec_tab, "Recordings && series")
        tabs.setMinimumWidth(280)
        self.tabs = tabs
        split.addWidget(tabs)
        split.addWidget(self.plot)
        right = QtWidgets.QWidget()
        vl = QtWidgets.QVBoxLayout(right)
        vl.setContentsMargins(0, 0, 0, 0)
        self.view = SceneView(native_window=True)
        self.view.setMinimumWidth(200)
        vl.addWidget(self.view, 1)
        legend = QtWidgets.QLabel(
            "solid: recorded motion · <span style='color:#2f7fe0'>translucent blue: "
            "twin replay</span> · at the plots' red time cursor"
        )
        legend.setWordWrap(True)
        vl.addWidget(legend)
        split.addWidget(right)
        split.setStretchFactor(1, 3)
        split.setStretchFactor(2, 2)
        split.setSizes([300, 400, 300])
        layout.addWidget(split, 1)
        self.status = StatusLine("")
        layout.addWidget(self.status)
        self.plot.sig_time_changed.connect(self._cursor_moved)
        # after the plot's own handler (it redraws with the data it holds)
        self.plot.list.itemChanged.connect(lambda _it: self._refresh_stale())
        self.sig_frame_ready.connect(self._on_frame, QtCore.Qt.ConnectionType.QueuedConnection)

    # -- state -----------------------------------------------------------------------------
    def has_content(self) -> bool:
        p = self.controller.project
        return p is not None and bool(p.artifacts("trajectory"))

    def refresh(self) -> None:
        super().refresh()
        if not hasattr(self, "traj_list"):
            return  # called by the base constructor before the body exists
        proj = self.controller.project
        if proj is None:
            self._close_live()
            return
        self.twin_combo.set_artifacts(proj.artifacts("twin"))  # reloaded below
        arts = proj.artifacts("trajectory")
        ids = [a.id for a in arts]
        listed = [
            self.traj_list.item(i).data(QtCore.Qt.ItemDataRole.UserRole)
            for i in range(self.traj_list.count())
        ]
        if ids != listed:
            self.traj_list.blockSignals(True)
            self.traj_list.clear()
            for a in arts:
                item = QtWidgets.QListWidgetItem(a.summary or a.id)
                item.setToolTip(f"{a.id}\n{a.summary}")
                item.setData(QtCore.Qt.ItemDataRole.UserRole, a.id)
                item.setFlags(item.flags() | QtCore.Qt.ItemFlag.ItemIsUserCheckable)
                on = a is arts[-1]  # the newest recording is shown
                item.setCheckState(
                    QtCore.Qt.CheckState.Checked if on else QtCore.Qt.CheckState.Unchecked
                )
                self.traj_list.addItem(item)
            self.traj_list.blockSignals(False)
        missing = [
            n.label
            for n, ok in workflows.needs_met(self.step_info, proj, self.connected())
            if not ok
        ]
        text = " Still missing for this step: " + "; ".join(missing) + "." if missing else ""
        self._set_banner(text.strip())
        if self.has_content():
            self.reload()

    def ticked(self) -> list[str]:
        return [
            self.traj_list.item(i).data(QtCore.Qt.ItemDataRole.UserRole)
            for i in range(self.traj_list.count())
            if self.traj_list.item(i).checkState() == QtCore.Qt.CheckState.Checked
        ]

    def _set_banner(self, text: str) -> None:
        self.banner.setVisible(bool(text))
        self.banner.setText(text)

    def _recordings_ticked(self) -> None:
        self.reload()

    def _recordings_only(self) -> None:
        """No twin yet: plot the ticked recordings as they are (nothing to simulate)."""
        self._close_live()
        self.inputs = None
        self.plot.clear()
        self.view.clear()
        self.sliders.populate({}, {})
        ids = self.ticked()
        for rid in ids:
            try:
                traj = self.controller.load_trajectory(rid)
            except TwinbenchError as exc:
                log.error("cannot plot %s: %s", rid, exc)
                continue
            lab = f"@{rid.rsplit('-', 1)[-1]}" if len(ids) > 1 else ""
            for s in channel_series(traj, f"real{lab}"):
                self.plot.set_series(s, redraw=False)
        self.plot.set_visible(self.plot.visible_series())
        self._update_buttons()

    def _out_of_view(self) -> bool:
        """The window is on screen and this page is not (another page is shown): opening
        and drawing wait until it is, so the GUI thread is not busy with a page no one
        sees (issue 24 part 4)."""
        win = self.window()
        return win is not self and win.isVisible() and not self.isVisible()

    def showEvent(self, event: Any) -> None:  # noqa: N802 (Qt name)
        super().showEvent(event)
        if self._stale:
            QtCore.QTimer.singleShot(0, self, self._catch_up)

    def _catch_up(self) -> None:
        """Shown again: open what changed meanwhile, draw the newest frame."""
        if not self._stale or self._out_of_view():
            return
        self._stale = False
        pending, self._pending_open = self._pending_open, None
        if pending is not None:
            self._opened(*pending)
        want = (str(self.twin_combo.currentData()), tuple(self.ticked()))
        if pending is None or want != self._opened_for:
            self.reload()
        self._on_frame()

    def reload(self) -> None:
        """Open the chosen twin with the ticked recordings (a job), unless already open."""
        proj = self.controller.project
        tid = self.twin_combo.currentData()
        if proj is None:
            return
        if self._out_of_view():
            self._stale = True
            return
        if tid is None:
            self._recordings_only()
            return
        want = (str(tid), tuple(self.ticked()))
        if want == self._loading:
            return
        have = self._opened_for
        if self.live is not None and have is not None and want[0] == have[0]:
            if set(want[1]) <= set(have[1]):  # already loaded: only what is shown changes
                assert self.inputs is not None
                self.live.set_visible([r for r in want[1] if r in self.inputs.recordings])
                self._visible_changed(want[1])
                return
        self._loading = want
        self.status.setText(f"opening {tid} with {len(want[1])} recording(s)…")
        self.controller.submit_job(
            f"Open {tid} for calibration",
            calibrate_open.open_job(proj, want[0], list(want[1])),
            lambda inp: QtCore.QTimer.singleShot(0, self, lambda: self._opened(inp, want)),
            lambda msg: QtCore.QTimer.singleShot(0, self, lambda: self._open_failed(msg)),
        )

    def _open_failed(self, msg: str) -> None:
        self._loading = None
        self._show_error(f"Opening the twin failed: {msg}")

    def _show_error(self, text: str) -> None:
        self.status.setStyleSheet("color: #c62828;")
        self.status.setText(text)

    def _opened(self, inputs: CalibrationInputs, want: tuple[str, tuple[str, ...]]) -> None:
        if want != self._loading:
            return  # something else was asked for meanwhile
        if self._out_of_view():  # opened when the page is shown
            self._pending_open, self._stale = (inputs, want), True
            return
        self._loading = None
        self._close_live()
        self.inputs = inputs
        self._opened_for = want
        self.sliders.populate(inputs.spec.params, inputs.spec.params.nominal())
        self.plot.clear()
        self._real_series.clear()
        labelled = len(inputs.recordings) > 1
        for rid, traj in inputs.recordings.items():
            lab = f"@{rid.rsplit('-', 1)[-1]}" if labelled else ""
            self._real_series[rid] = channel_series(traj, f"real{lab}", self._joint_units())
        self._build_scene(inputs)
        self._visible_changed(want[1])
        if inputs.refused:
            self._set_banner(
                "Not simulated: " + "; ".join(f"{r}: {why}" for r, why in inputs.refused.items())
            )
        self.live = LiveCalibration(
            inputs.spec,
            inputs.recordings,
            self._frame_from_worker,
            visible=[r for r in want[1] if r in inputs.recordings],
            window_s=self.window_combo.currentData(),
            processes=REPLAY_PROCESSES,
        )
        self.live.set_cursor(self.plot.time())
        self.stack.setCurrentIndex(1)
        self._update_buttons()

    def _visible_changed(self, ids: tuple[str, ...] | list[str]) -> None:
        """Plot the real series of the visible recordings; pick a default view (the joint
        and the object that move most, with their residuals)."""
        if self.inputs is None:
            return
        vis = [r for r in ids if r in self.inputs.recordings]
        self.curves.reset()  # the simulated series go: the next frame lists them again
        keep = [s for r in vis for s in self._real_series.get(r, [])]
        names = {s.name for s in keep}
        drop = [n for n in self.plot.series() if n not in names]
        self.plot.remove_series(*drop)
        for s in keep:
            self.plot.set_series(s, visible=False, redraw=False)
        if vis and not (set(self.plot.visible_series()) & names):
            self.plot.set_visible(default_view(self._real_series[vis[0]]))
        else:
            self.plot.set_visible(self.plot.visible_series())

    def _joint_units(self) -> dict[str, str]:
        return joint_units(self.inputs.spec if self.inputs is not None else None)

    def _close_live(self, wait: bool = False) -> None:
        """Close the calibration world. Its worker stops its replay processes on its own
        (half a second or more): the GUI thread does not wait for that unless `wait`."""
        if self.live is not None:
            self.live.close(wait=False)
            self._closing.append(self.live)
            self.live = None
        self._closing = [c for c in self._closing if c.alive]
        if wait:
            for c in self._closing:
                c.close()
            self._closing = []
        self._last = None
        self._opened_for = None
        self._ghost_ready = False
        self.curves.reset()
        self._update_buttons()

    def detach(self) -> None:
        self._close_live(wait=True)
        if self.fit_dialog is not None:
            self.fit_dialog.close()
        super().detach()

    # -- actions ---------------------------------------------------------------------------
    def apply_values(self, values: dict[str, float]) -> int:
        """Send edited values to the worker; returns the edit's number."""
        if self.live is None:
            return 0
        return self.live.set_values(values)

    def _window_changed(self, window_s: float | None) -> None:
        if self.live is not None:
            self.live.set_window(window_s)

    def reset_values(self) -> None:
        if self.inputs is None:
            return
        nominal = self.inputs.spec.params.nominal()
        self.sliders.set_values(nominal)
        self.apply_values(nominal)

    def open_fit(self) -> None:
        if self.inputs is None or not self.inputs.recordings:
            self._show_error("Tick at least one recording that fits the twin first.")
            return
        pre = (
            sorted(self.sliders.edited)
            or [n for n in self.inputs.spec.params if n.endswith(".friction") and "objects" in n][
                :2
            ]
        )
        dlg = FitDialog(
            self.controller,
            self.inputs.twin_id,
            list(self.inputs.recordings),
            self.inputs.spec.params,
            pre,
            self,
        )
        dlg.sig_applied.connect(self._fit_applied)
        self.fit_dialog = dlg
        dlg.show()

    def _fit_applied(self, new_twin: str) -> None:
        self.refresh()
        if self.twin_combo.select(new_twin):
            self.reload()

    # -- drawing ---------------------------------------------------------------------------
    def _frame_from_worker(self) -> None:
        try:
            self.sig_frame_ready.emit()
        except RuntimeError:  # page already destroyed
            pass

    def _build_scene(self, inputs: CalibrationInputs) -> None:
        build_scene(self.view, inputs.drawables)

    def _on_frame(self) -> None:
        if self._out_of_view():  # drawn when shown (the frame waits in the worker)
            self._stale = True
            return
        live = self.live
        frame = live.take_frame() if live is not None else None
        if frame is None:
            return
        new_sim = (
            self._last is None
            or frame.request != self._last.request
            or (frame.sims is not self._last.sims)
        )
        self._last = frame
        if new_sim:
            if live is not None and frame.request >= live.latest_request:
                # only once no newer edit is on its way: an older frame must not pull a
                # slider back while it is being dragged
                self.sliders.set_values(dict(frame.values))
            self._draw_curves(frame)
        self._draw_scene(self.plot.time())
        self.frames_drawn += 1
        self._update_status(frame)
        self.save_btn.setEnabled(bool(self.edited_values()))
        self.sig_redrawn.emit(frame.request)

    def _draw_curves(self, frame: CalibFrame) -> None:
        if self.inputs is None:
            return
        labelled = len(self.inputs.recordings) > 1
        visible_before = set(self.plot.visible_series())
        out = self.curves.draw(
            self.plot, frame.sims, self._real_series, labelled, self._joint_units()
        )
        new = [s.name for s in out if s.name not in visible_before]
        want = {n.split("/", 1)[1] for n in visible_before if n.startswith("real")}
        show = [n for n in new if n.split("/", 1)[1] in want]
        if show:
            self.plot.set_visible(sorted(visible_before | set(show)))

    def _refresh_stale(self) -> None:
        if self._last is not None and self.inputs is not None:
            labelled = len(self.inputs.recordings) > 1
            args = (self._last.sims, self._real_series, labelled, self._joint_units())
            self.curves.refresh(self.plot, *args)

    def _cursor_moved(self, t: float) -> None:
        if self.live is not None:
            self.live.set_cursor(t)  # a new simulation's first frame has the ghost here
        self._draw_scene(t)  # the (full) frame holds the ghost over the whole recording

    def _draw_scene(self, t: float) -> None:
        f, inputs = self._last, self.inputs
        if f is None or inputs is None:
            return
        vis = [r for r in self.ticked() if r in f.recorded]
        if not vis:
            return
        self.scene_moved = place_bodies(self.view, inputs.drawables, f, vis[0], t)

    def _update_buttons(self) -> None:
        has = self.inputs is not None and self.live is not None
        self.fit_btn.setEnabled(has)
        self.reset_btn.setEnabled(has)
        self.save_btn.setEnabled(has and bool(self.edited_values()))

    def edited_values(self) -> dict[str, float]:
        """Values shown that differ from the open twin's own."""
        if self.inputs is None or self._last is None:
            return {}
        own = self.inputs.spec.params.nominal()
        return {n: v for n, v in self._last.values.items() if own.get(n) != v}

    def unsaved(self) -> list[str]:
        """Tuned values that exist only on this page (for the quit dialog)."""
        if self.edited_values() and self.inputs is not None:
            return [f"values tuned for {self.inputs.twin_id} (Calibrate page ▸ Save as new twin)"]
        return []

    def save_twin(self) -> None:
        """Save the tuned values as a new twin version (a job: it copies the twin's files)."""
        proj, inputs, values = self.controller.project, self.inputs, self.edited_values()
        if proj is None or inputs is None or not values:
            return
        self.save_btn.setEnabled(False)
        self.controller.submit_job(
            f"Save tuned {inputs.twin_id}",
            calibrate_open.save_job(proj, inputs, values),
            lambda tid: QtCore.QTimer.singleShot(0, self, lambda: self._fit_applied(tid)),
            lambda msg: QtCore.QTimer.singleShot(0, self, lambda: self._show_error(msg)),
        )

    def _update_status(self, f: CalibFrame) -> None:
        if f.error:
            self._show_error(f.error)
            return
        self.status.setStyleSheet("")
        bad = "; ".join(f"{r}: {e}" for r, e in f.errors.items())
        how = "rebuilt" if f.rebuilt else "retuned in place"
        self.status.setText(
            f"{len(f.sims)} recording(s) re-simulated in {f.sim_ms:.0f} ms ({how})"
            + (f" — not simulated: {bad}" if bad else "")
        )


if __name__ == "__main__":
    import sys

    args = sys.argv[1:] or [demo_project()]
    raise SystemExit(preview(CalibratePage, [sys.argv[0], *args]))
