"""The window side of `bench calibrate` (run as `python -m benches.calibrate_window`).

Opens the main window at 1366x768 on a new project (the Panda twin + a 5 s recording with 3
objects), shows the Calibrate page and moves its sliders: for each move, the time from the
slider's new value to the moment both the plots and the 3D view (ghost) have painted the
re-simulated result; meanwhile a 5 ms GUI-thread timer measures stalls. Writes a JSON
report (and optionally a screenshot).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from app.controller import AppController
from app.workflows.calibrate_preview import make_project
from widgets.main_window import MainWindow
from widgets.scene_view import grab_widget, share_gl_contexts

TICK_MS = 5
MOVE_TIMEOUT_S = 3.0
# parameters a person tunes by eye, with the slider positions (0..1000) to visit
MOVES = (
    "robot.joints.panda_joint1.damping",
    "objects.box.friction",
    "robot.joints.panda_joint2.damping",
    "objects.cylinder.restitution",
    "robot.actuators.panda_joint4.bandwidth",
    "objects.cylinder.friction",
)


class PaintWatch(QtCore.QObject):
    """When each watched widget finished painting (a zero timer started from its paint
    event runs once that event has been handled; a 3D view drawn in a window of its own:
    when it swapped that frame onto the window)."""

    def __init__(self, widgets: list[QtCore.QObject]) -> None:
        super().__init__()
        self.widgets = widgets
        self.done: dict[int, list[float]] = {id(w): [] for w in widgets}
        self.widgets_needed = len(widgets)  # the first n widgets must have painted
        for w in widgets:
            if isinstance(w, QtGui.QWindow) and hasattr(w, "frameSwapped"):
                # a 3D view in its own window: done when its frame reached the window
                times = self.done[id(w)]
                w.frameSwapped.connect(lambda times=times: times.append(time.perf_counter()))
            else:
                w.installEventFilter(self)

    def eventFilter(self, obj: QtCore.QObject, ev: QtCore.QEvent) -> bool:  # noqa: N802
        if ev.type() == QtCore.QEvent.Type.Paint and id(obj) in self.done:
            times = self.done[id(obj)]
            QtCore.QTimer.singleShot(0, lambda: times.append(time.perf_counter()))
        return False

    def finished(self, after: float) -> float | None:
        """When every widget had painted after `after` (None: not yet)."""
        ends = []
        for w in self.widgets[: self.widgets_needed]:
            times = self.done[id(w)]
            later = [t for t in times if t >= after]
            if not later:
                return None
            ends.append(min(later))
        return max(ends)


class EventWait:
    """Waiting is the application's own event loop blocking for the next event (as in
    exec()), not polling: a polling loop would take CPU time from the replays it measures."""

    def __init__(self, qapp: QtCore.QCoreApplication) -> None:
        self.qapp = qapp
        self.keepalive = QtCore.QTimer()
        self.keepalive.setInterval(20)  # wakes the loop to check the time-out
        self.keepalive.start()
        self.flags = (
            QtCore.QEventLoop.ProcessEventsFlag.AllEvents
            | QtCore.QEventLoop.ProcessEventsFlag.WaitForMoreEvents
        )

    def __call__(self, cond: Any, timeout_s: float) -> bool:
        """Run the event loop until `cond()` holds (True) or `timeout_s` passed (False)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            self.qapp.processEvents(self.flags)
            if cond():
                return True
        return False


@dataclass
class MoveLog:
    """What the slider moves measured (perf_counter / CPU times as the report needs them)."""

    latencies: list[float] = field(default_factory=list)  # slider to painted, ms
    timeouts: int = 0
    sim_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    gui_cpu: list[float] = field(default_factory=list)  # GUI-thread CPU, a move to its redraw
    rebuilt: int = 0
    trace: list[tuple[float, float | None]] = field(default_factory=list)  # (move, redraw)
    ticks: list[float] = field(default_factory=list)  # the GUI-thread timer's ticks
    proc_cpu: float = 0.0  # this process: GUI thread, calibration thread, GL drivers
    replay_cpu: float = 0.0  # the replay processes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--project", type=Path, required=True)
    p.add_argument("--moves", type=int, default=60)
    p.add_argument("--screenshot", type=Path, default=None)
    p.add_argument(
        "--trace", type=Path, default=None, help="write the GUI ticks and move times (JSON)"
    )
    args = p.parse_args(argv)

    share_gl_contexts()
    qapp = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    proj, tid, rid = make_project(args.project, "calibrate bench")
    controller = AppController()
    controller.install_log_handler()
    win = MainWindow(controller)
    controller.open_project(proj.root)
    win.resize(1366, 768)
    win.show()
    page: Any = win.show_step("calibrate")
    report: dict[str, Any] = {"recording": rid, "twin": tid}
    wait = EventWait(qapp)
    ok = wait(lambda: page._last is not None and page._last.full_ghost, 120)
    if not ok:
        report["error"] = "the Calibrate page never showed a simulation"
        args.out.write_text(json.dumps(report))
        return 2
    report["gl_3d_view"] = page.view.gl_view is not None
    log = _move_sliders(page, wait, args.moves)
    report.update(_summary(log, page, args.moves))
    if args.trace is not None:
        args.trace.write_text(json.dumps({"ticks": log.ticks, "moves": log.trace}))
    if args.screenshot is not None:
        _screenshot(win, page, wait, args.screenshot)
    args.out.write_text(json.dumps(report))
    win.shutdown()  # first: closing asks whether to keep the tuned values (a modal box)
    win.close()
    controller.shutdown()
    return 0


def _move_sliders(page: Any, wait: EventWait, n_moves: int) -> MoveLog:
    """Move the sliders of MOVES in turn to random positions at a person's pace; each move
    is timed from the slider's new value until the plots, and the 3D view when the ghost
    moved, have painted its result, while a TICK_MS timer on the GUI thread ticks."""
    watched = [page.plot.layout_widget.viewport()]
    if page.view.gl_view is not None:
        watched.append(page.view.gl_view)
    watch = PaintWatch(watched)
    drawn: dict[int, float] = {}
    moved: dict[int, bool] = {}  # the edit's first redraw moved the ghost

    def redrawn(req: int) -> None:
        if req not in drawn:
            drawn[req], moved[req] = time.perf_counter(), page.scene_moved

    page.sig_redrawn.connect(redrawn)
    log = MoveLog()
    tick = QtCore.QTimer()
    tick.setInterval(TICK_MS)
    tick.timeout.connect(lambda: log.ticks.append(time.perf_counter()))
    rng = np.random.default_rng(0)
    page.plot.set_time(2.5)  # mid-window, mid-motion: parameter changes move the ghost
    wait(lambda: False, 1.0)  # settle (first paints, full ghost)
    tick.start()
    proc0 = time.process_time()  # this process: GUI thread, calibration thread, GL drivers
    replay0 = page.live.replay_cpu_s if page.live is not None else 0.0
    for i in range(n_moves):
        name = MOVES[i % len(MOVES)]
        row = page.sliders.rows[name]
        pos = int(rng.integers(50, 950))
        if pos == row.slider.value():
            pos += 7
        t0 = time.perf_counter()
        c0 = time.thread_time()
        row.slider.setValue(pos)  # what a drag delivers: valueChanged on the GUI thread
        req = page.live.latest_request if page.live is not None else 0
        got = wait(lambda r=req: r in drawn, MOVE_TIMEOUT_S)
        # the plots always repaint (new curves); the 3D view when the ghost moved
        watch.widgets_needed = 2 if moved.get(req) and page.view.gl_view is not None else 1
        if got:
            got = wait(lambda r=req: watch.finished(drawn[r]) is not None, MOVE_TIMEOUT_S)
        if not got:
            log.timeouts += 1
            log.latencies.append(1000 * MOVE_TIMEOUT_S)
            continue
        log.latencies.append(1000 * ((watch.finished(drawn[req]) or t0) - t0))
        log.trace.append((t0, drawn.get(req)))
        log.gui_cpu.append(1000 * (time.thread_time() - c0))
        f = page._last
        if f is not None:
            log.sim_ms.append(f.sim_ms)
            log.cpu_ms.append(f.sim_cpu_ms)
            log.rebuilt += int(f.rebuilt)
        wait(lambda: False, 0.25 + 0.1 * rng.random())  # a person's pace between moves
    tick.stop()
    log.proc_cpu = time.process_time() - proc0
    log.replay_cpu = (page.live.replay_cpu_s if page.live is not None else 0.0) - replay0
    return log


def _summary(log: MoveLog, page: Any, n_moves: int) -> dict[str, Any]:
    """The report's figures: slider-to-redraw latency percentiles, GUI stalls (the ticks'
    lateness), simulation and CPU time per move, rebuilds and dropped results."""
    ticks = log.ticks
    gaps = np.diff(np.asarray(ticks)) * 1000 - TICK_MS if len(ticks) > 1 else np.zeros(1)
    lat = np.asarray(log.latencies)
    sim_ms, cpu_ms, gui_cpu = log.sim_ms, log.cpu_ms, log.gui_cpu
    return {
        "moves": len(log.latencies),
        "timeouts": log.timeouts,
        "slider_to_redraw_ms_p50": round(float(np.percentile(lat, 50)), 1),
        "slider_to_redraw_ms_p95": round(float(np.percentile(lat, 95)), 1),
        "slider_to_redraw_ms_max": round(float(lat.max()), 1),
        "gui_stall_ms_max": round(float(max(gaps.max(), 0.0)), 1),
        "gui_stall_ms_p99": round(float(np.percentile(np.maximum(gaps, 0), 99)), 1),
        "sim_ms_median": round(float(np.median(sim_ms)), 1) if sim_ms else None,
        # CPU time of the busiest replay process per move: its wall time on idle cores
        "sim_cpu_ms_median": (
            round(float(np.nanmedian(cpu_ms)), 1) if cpu_ms and np.isfinite(cpu_ms).any() else None
        ),
        "gui_thread_cpu_ms_median": (round(float(np.median(gui_cpu)), 1) if gui_cpu else None),
        # all CPU time per move: what the machine must find for each (idle time excluded)
        "window_process_cpu_ms_per_move": round(1000 * log.proc_cpu / max(n_moves, 1), 1),
        "replay_processes_cpu_ms_per_move": round(1000 * log.replay_cpu / max(n_moves, 1), 1),
        "replay_processes": page.live.workers if page.live is not None else None,
        "rebuilds": log.rebuilt,
        "dropped_results": page.live.dropped if page.live is not None else None,
        "recording_s": 5.0,
        "objects": 3,
    }


def _screenshot(win: Any, page: Any, wait: EventWait, path: Path) -> None:
    """The window as a user working on the page would have it, mid-motion (recorded arm
    and ghost apart), once the full ghost is drawn."""

    win.devices_dock.hide()  # the page's room, as a user working here would have it
    page.plot.set_time(2.2)  # mid-motion: recorded arm and ghost apart
    wait(lambda: page._last is not None and page._last.full_ghost, 30)
    wait(lambda: False, 1.0)
    grab_widget(win).save(str(path))


if __name__ == "__main__":
    raise SystemExit(main())
