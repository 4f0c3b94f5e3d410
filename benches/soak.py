"""A soak of the real window: `python -m benches.soak --minutes M --out REPORT.json`.

Opens the main window at 1366x768 on the demo project, starts the virtual lab, measures the
idle CPU with the lab connected, then plays the twin with the devices panel live for the rest
of the time, switching pages now and then, and writes a JSON report: CPU, RSS over time,
event-loop stalls and the refcount of None. `bench gui` (benches/gui.py) runs it in its
own process under Xvfb, so a crash of the window is a finding, not a crash of the bench.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PySide6 import QtCore, QtWidgets

from app import demo
from app.controller import AppController
from widgets.main_window import MainWindow
from widgets.scene_view import share_gl_contexts
from widgets.twin_page import TwinPage

log = logging.getLogger(__name__)

IDLE_MEASURE_S = 30.0
TICK_MS = 5  # probe timer: its lateness is the event loop's stall
PAGE_SWITCH_S = 20.0
RSS_SAMPLE_S = 5.0


def _cpu_s() -> float:
    """CPU time of this process, all threads (Qt's and Mesa's render threads included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


class StallProbe:
    """The event-loop monitor: a precise timer every TICK_MS whose lateness is the stall.

    Lateness is recorded per section (`section(name)`; `pause()` stops recording and forgets
    the last tick, so work outside the event loop, e.g. a test's own code, is not counted).
    `bench gui` (through `run` below) and the GUI loop test both measure with this one.
    """

    def __init__(
        self, parent: Any = None, tick_ms: int = TICK_MS, stacks_after_ms: float | None = None
    ) -> None:
        self.tick_ms = tick_ms
        self.samples: dict[str, list[float]] = {}
        self._section: str | None = None
        self._last: float | None = None
        self._excluded_ms = 0.0
        self.timer = QtCore.QTimer(parent)
        self.timer.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
        self.timer.timeout.connect(self._on_tick)
        # where the GUI thread was while it stalled: with stacks_after_ms, a sampler thread
        # takes the GUI thread's stack each time a tick is that much later (it runs whenever the GUI
        # thread lets go of the GIL, which Qt's and most native calls do)
        self.stacks_after_ms = stacks_after_ms
        self.stacks: dict[str, list[tuple[float, str]]] = {}
        self._gui_ident = threading.get_ident()
        self._tick_at = time.perf_counter()
        self._sampled_tick = -1.0
        self._sample_at = 0.0
        self._sampler: threading.Thread | None = None
        self._sampling = threading.Event()

    def start(self) -> None:
        self._last = None
        self.timer.start(self.tick_ms)
        if self.stacks_after_ms is not None and self._sampler is None:
            self._sampling.set()
            self._sampler = threading.Thread(target=self._sample, name="stall-stacks", daemon=True)
            self._sampler.start()

    def stop(self) -> None:
        self.timer.stop()
        self._last = None
        self._sampling.clear()
        if self._sampler is not None:
            self._sampler.join(1.0)
            self._sampler = None

    def _sample(self) -> None:
        assert self.stacks_after_ms is not None
        after = self.stacks_after_ms / 1000
        while self._sampling.is_set():
            time.sleep(0.01)
            tick, section = self._tick_at, self._section
            late = time.perf_counter() - tick
            if tick != self._sampled_tick:  # a new tick: its first sample at `after`
                self._sampled_tick, self._sample_at = tick, after
            if section is None or late < self._sample_at:
                continue
            frames = sys._current_frames()
            frame = frames.get(self._gui_ident)
            if frame is None:
                continue
            self._sample_at = late + after  # a long stall: another sample `after` later
            where = "".join(traceback.format_stack(frame, limit=12))
            # and where every other thread was: the one not waiting holds the GIL
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, f in frames.items():
                if ident in (self._gui_ident, threading.get_ident()):
                    continue
                inner = traceback.extract_stack(f, limit=2)
                calls = " <- ".join(
                    f"{Path(x.filename).name}:{x.lineno} {x.name}" for x in inner[::-1]
                )
                where += f"  [thread {names.get(ident, ident)}] {calls}\n"
            self.stacks.setdefault(section, []).append((round(late * 1000, 1), where))

    def section(self, name: str) -> None:
        """Record the following ticks' lateness under `name` (a new section starts afresh)."""
        self._section = name
        self._last = None
        self._excluded_ms = 0.0
        self.samples.setdefault(name, [])

    def pause(self) -> None:
        self._section = None
        self._last = None

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """Time spent in this block is not a stall (a test's own checks between events)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._excluded_ms += (time.perf_counter() - t0) * 1000

    def _on_tick(self) -> None:
        now = time.perf_counter()
        self._tick_at = now
        if self._last is not None and self._section is not None:
            late = (now - self._last) * 1000 - self.tick_ms - self._excluded_ms
            self.samples[self._section].append(late)
        self._last = now
        self._excluded_ms = 0.0

    def max_ms(self, name: str) -> float:
        """The longest stall seen in section `name` (0 when none was recorded)."""
        return max(self.samples.get(name, []), default=0.0)

    def worst(self) -> dict[str, float]:
        """{section: its longest stall in ms}, rounded to 0.1 ms."""
        return {k: round(self.max_ms(k), 1) for k in self.samples}

    def stall_stacks(self, name: str, n: int = 3) -> list[str]:
        """The GUI thread's stack in section `name`'s `n` longest sampled stalls (the lateness
        when it was taken, then the stack, innermost call last)."""
        got = sorted(self.stacks.get(name, []), key=lambda x: -x[0])[:n]
        return [f"late {ms:g} ms when sampled:\n{where}" for ms, where in got]


def run(minutes: float, out: Path, width: int = 1366, height: int = 768) -> int:
    """Run the soak; returns the process exit code (0 when the report was written)."""

    logging.basicConfig(level=logging.WARNING)
    share_gl_contexts()  # as the app does: the 3D views draw in windows of their own
    qapp = QtWidgets.QApplication.instance() or QtWidgets.QApplication([sys.argv[0]])
    controller = AppController()
    controller.install_log_handler()
    win = MainWindow(controller)
    sys.excepthook = win.report_unexpected
    controller.open_project(demo.ensure_demo_project().root)
    win.resize(width, height)
    win.show()
    demo.start_lab(controller)

    report: dict[str, Any] = {"minutes_requested": minutes, "window": [width, height]}
    probe = StallProbe(win)
    soak = _Soak(qapp, controller, win, probe, report)
    soak.soak_s = max(60.0, minutes * 60 - IDLE_MEASURE_S - 10)
    probe.start()
    clock = QtCore.QTimer(win)
    clock.timeout.connect(soak.every_second)
    clock.start(1000)
    code = int(qapp.exec())
    probe.stop()
    clock.stop()
    win.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    return code


class _Soak:
    """The soak's phases, stepped once a second on the GUI thread: connect (the lab's robot
    connected and streaming; 120 s at most), settle (5 s), idle (IDLE_MEASURE_S of the idle
    window's CPU), soak (the Twin page playing, the page switched every PAGE_SWITCH_S, RSS
    sampled every RSS_SAMPLE_S, for `soak_s`), then the report's figures and the loop's exit."""

    def __init__(
        self,
        qapp: QtCore.QCoreApplication,
        controller: AppController,
        win: MainWindow,
        probe: StallProbe,
        report: dict[str, Any],
    ) -> None:
        self.qapp, self.controller, self.win, self.probe = qapp, controller, win, probe
        self.report = report
        self.rss: list[tuple[float, float]] = []
        self.t_start = time.monotonic()
        self.state: dict[str, Any] = {"phase": "connect", "t_phase": self.t_start}
        self.soak_s = 60.0

    def every_second(self) -> None:
        controller, report, state = self.controller, self.report, self.state
        now = time.monotonic()
        phase = state["phase"]
        if phase == "connect":
            st = controller.devices()["robot"].state
            if st == "connected" and controller.robot_state() is not None:
                state.update(phase="settle", t_phase=now)
            elif st == "error" or now - self.t_start > 120:
                report["error"] = f"lab did not connect: {controller.devices()['robot']}"
                self.qapp.exit(2)
        elif phase == "settle" and now - state["t_phase"] > 5:
            state.update(phase="idle", t_phase=now, cpu0=_cpu_s())
        elif phase == "idle" and now - state["t_phase"] >= IDLE_MEASURE_S:
            self._start_soak(now)
        elif phase == "soak":
            self._soak_tick(now)

    def _start_soak(self, now: float) -> None:
        """The idle CPU measured: play the Twin page and start the soak's section."""

        state = self.state
        wall = now - state["t_phase"]
        self.report["idle_cpu_pct"] = round(100 * (_cpu_s() - state["cpu0"]) / wall, 2)
        twin = self.win.show_step("twin")
        assert isinstance(twin, TwinPage)
        twin.play_btn.setChecked(True)
        gc.collect()
        self.probe.section("soak")
        state.update(
            phase="soak",
            t_phase=now,
            cpu0=_cpu_s(),
            none0=sys.getrefcount(None),
            last_switch=now,
            last_rss=0.0,
            page=1,
        )

    def _soak_tick(self, now: float) -> None:
        """Sample RSS, switch the page when due, keep the twin playing; finish at `soak_s`."""

        state, win = self.state, self.win
        elapsed = now - state["t_phase"]
        if now - state["last_rss"] >= RSS_SAMPLE_S:
            state["last_rss"] = now
            self.rss.append((elapsed, _rss_mb()))
        if now - state["last_switch"] >= PAGE_SWITCH_S:
            state["last_switch"] = now
            state["page"] = (state["page"] + 1) % len(win.pages)
            win.show_step(list(win.pages)[state["page"]])
        twin = win.pages["twin"]
        assert isinstance(twin, TwinPage)
        if not twin.play_btn.isChecked():  # a twin error stops play: restart it
            twin.play_btn.setChecked(True)
        if elapsed >= self.soak_s:
            self._finish(elapsed)

    def _finish(self, elapsed: float) -> None:
        """The report's figures: refcount drift, CPU, RSS growth, GUI ticks, frames drawn,
        errors shown; then the event loop exits 0."""

        report, state, rss, win = self.report, self.state, self.rss, self.win
        gc.collect()
        report["none_refcount_drift"] = sys.getrefcount(None) - state["none0"]
        report["soak_cpu_pct"] = round(100 * (_cpu_s() - state["cpu0"]) / elapsed, 2)
        report["minutes"] = round((time.monotonic() - self.t_start) / 60, 2)
        first = [m for t, m in rss if t <= 60] or [m for _, m in rss[:1]]
        last = [m for t, m in rss if t >= elapsed - 60] or [m for _, m in rss[-1:]]
        report["rss_first_minute_mb"] = round(sum(first) / len(first), 1)
        report["rss_last_minute_mb"] = round(sum(last) / len(last), 1)
        report["rss_growth_mb"] = round(
            report["rss_last_minute_mb"] - report["rss_first_minute_mb"], 1
        )
        ticks = self.probe.samples.get("soak", [])
        report["gui_tick_ms_p50"] = round(_percentile(ticks, 50), 2)
        report["gui_tick_ms_p99"] = round(_percentile(ticks, 99), 2)
        report["gui_tick_ms_max"] = round(max(ticks, default=float("nan")), 1)
        report["event_loop_ticks"] = len(ticks)
        twin = win.pages["twin"]
        assert isinstance(twin, TwinPage)
        report["twin_frames_drawn"] = twin.frames_drawn
        report["devices_refreshes"] = win.devices_panel.refreshes
        report["errors_shown"] = 1 if win.last_error else 0
        report["last_error"] = " / ".join(win.last_error) if win.last_error else ""
        self.qapp.exit(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.soak", description=__doc__)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    return run(args.minutes, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
