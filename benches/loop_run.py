"""The whole loop in the real window, clicked through as a user would:
`python -m benches.loop_run --project DIR --out REPORT.json [--inject] [--shots DIR]`.

scan (Scan page, the virtual lab's quick guided scan, accepted) -> twin (Twin page, from the
scan) -> record (Record panel, a chirp on the lab robot) -> fit (Fit window) -> train
(Policies page, CEM under the fit's posterior) -> deploy (Deploy page: predict, run) -> refit
(Send to Real2Sim) -> retrain (from the refit). Each step goes through the widgets; `GuiLoop`
times it and measures its longest event-loop stall with `bench gui`'s monitor
(`StallProbe`). The robot link is watched: every drop ("reconnecting") and whether it came
back. With `inject`, two failures a user meets are sent to Real2Sim before the real refit:
the deploy run as the old recorder saved it (15 samples without a command at its end) and
the run with its recording cut short on disk; each must end as a failure on the page (red
note, retrain off), never as "saved".

`bench loop` (benches/loop.py) runs it in its own process under Xvfb beside busy
processes; tests/widgets/test_gui_loop.py runs it in the test's window.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PySide6 import QtCore, QtWidgets

from app.controller import AppController
from app.robot_link import AgentLink, launched_client
from app.workflows.twin import load_twin
from benches.loop_watch import GcWatch, LinkWatch, ThreadProbe, nan_tailed_copy, truncated_copy
from benches.soak import StallProbe
from devices.robots.agent.launch import start_lab_process

# the window and the panels the loop opens, imported with this module as the app imports its
# pages: their first import (under load, 0.1-0.5 s) is not one of the steps' stalls
from widgets.fit_panel import FitDialog
from widgets.main_window import MainWindow
from widgets.record_panel import RecordPanel
from widgets.scene_view import grab_widget, share_gl_contexts

log = logging.getLogger(__name__)

DAMPING = "robot.joints.panda_joint2.damping"
STEPS = ("scan", "twin", "record", "fit", "train", "deploy", "refit", "retrain")
STACKS_AFTER_MS = 120.0  # a stall this long gets the GUI thread's stack in the report


class StepFailed(Exception):
    """A loop step did not reach its end (the message says where it stopped)."""


class GuiLoop:
    """Drives `window` (a MainWindow on `controller`) through the loop in a new project at
    `root`. `run()` returns the report; the artifact ids of each step are in `self.ids`."""

    def __init__(
        self,
        window: Any,
        controller: Any,
        root: Path,
        inject: bool = False,
        shots: Path | None = None,
    ) -> None:
        self.window, self.controller = window, controller
        self.root, self.inject, self.shots = Path(root), inject, shots
        self.probe = StallProbe(window, stacks_after_ms=STACKS_AFTER_MS)
        self.link = LinkWatch(controller)
        self.threads = ThreadProbe(self.probe)
        self.gc = GcWatch(self.probe)
        self.ids: dict[str, Any] = {}
        self.steps: dict[str, dict[str, Any]] = {}
        self.injected: list[dict[str, Any]] = []
        self._lab: Any = None

    @property
    def proj(self) -> Any:
        """The open project, as the pages see it (they write through this one)."""
        return self.controller.project

    # -- waiting, as qtbot does, without counting the loop's own checks as stalls ----------
    def wait_until(self, pred: Callable[[], Any], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with self.probe.excluded():
                if pred():
                    return
            if time.monotonic() > deadline:
                raise StepFailed(f"{what}: not within {timeout_s:g} s")
            loop = QtCore.QEventLoop()
            QtCore.QTimer.singleShot(10, loop.quit)
            loop.exec()

    def wait_signal(
        self, signal: Any, action: Callable[[], Any], timeout_s: float, what: str
    ) -> tuple[Any, ...]:
        got: list[tuple[Any, ...]] = []

        def slot(*args: Any) -> None:
            got.append(args)

        signal.connect(slot)
        try:
            action()
            self.wait_until(lambda: got, timeout_s, what)
        finally:
            signal.disconnect(slot)
        return got[0]

    def pause(self, ms: int) -> None:
        """Let what a finished step draws be drawn (counted: it is the window's work)."""
        loop = QtCore.QEventLoop()
        QtCore.QTimer.singleShot(ms, loop.quit)
        loop.exec()

    def latest(self, kind: str) -> Any:
        with self.probe.excluded():
            self.proj.refresh()
            arts = self.proj.artifacts(kind)
            return arts[-1] if arts else None

    def shot(self, widget: Any, name: str) -> None:
        if self.shots is None:
            return

        self.pause(800)  # plots and the 3D view draw
        self.shots.mkdir(parents=True, exist_ok=True)
        with self.probe.excluded():
            grab_widget(widget).save(str(self.shots / f"{name}.png"))

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self.controller.new_project(self.root)
        self.probe.start()
        self.threads.start()
        self.gc.start()
        failed: str | None = None
        try:
            for name in STEPS:
                if failed is not None:
                    self.steps[name] = {"status": "skipped", "after": failed}
                    continue
                if name == "record":
                    self._attach_lab()
                ok = self._step(name, getattr(self, f"_{name}"))
                if not ok:
                    failed = name
        finally:
            self.probe.stop()
            self.threads.stop()
            self.gc.stop()
            self.controller.detach_robot()
        done = [n for n in STEPS if self.steps[n]["status"] == "ok"]
        return {
            "steps_total": len(STEPS),
            "steps_completed": len(done),
            "steps": self.steps,
            "step_wall_s": {n: self.steps[n].get("wall_s") for n in STEPS},
            "gui_stall_ms": {n: self.steps[n].get("stall_ms") for n in STEPS},
            "thread_late_ms": {n: self.threads.worst.get(n) for n in STEPS},
            "gc_pause_ms": {n: self.gc.worst.get(n) for n in STEPS},
            "gc_full_collections": {n: self.gc.full.get(n, 0) for n in STEPS},
            "gui_stall_ms_max": max(
                (s["stall_ms"] for s in self.steps.values() if "stall_ms" in s), default=None
            ),
            "link_drops": self.link.drops,
            "link_drops_recovered": self.link.recovered,
            "link_drops_unrecovered": self.link.unrecovered() + self.link.lost,
            "link_events": self.link.events,
            "injected": self.injected,
            "failures_reported_as_success": sum(1 for i in self.injected if i["as_success"]),
            "failures_not_reported": sum(1 for i in self.injected if not i["reported"]),
            "ids": self.ids,
            "wall_s": round(time.monotonic() - t0, 1),
        }

    def _step(self, name: str, fn: Callable[[], None]) -> bool:
        t = time.monotonic()
        self.probe.section(name)
        try:
            fn()
            status: dict[str, Any] = {"status": "ok"}
        except Exception as exc:  # a step that fails is the finding: report it, go no further
            log.error("loop step %s failed: %s", name, exc)
            status = {
                "status": "failed",
                "error": f"{type(exc).__name__}: {exc}",
                "where": traceback.format_exc(limit=3)[-1200:],
            }
        self.probe.pause()
        status["wall_s"] = round(time.monotonic() - t, 1)
        status["stall_ms"] = round(self.probe.max_ms(name), 1)
        if status["stall_ms"] > STACKS_AFTER_MS:
            status["stall_stacks"] = self.probe.stall_stacks(name, 4)
        self.steps[name] = status
        return status["status"] == "ok"

    def _attach_lab(self) -> None:
        """The robot: the virtual lab as its own process, connected as the app connects it
        (a link that dials again after a drop)."""

        lab = start_lab_process("panda_table", extra_args=["--no-cameras"])
        try:
            client = launched_client(lab, name="gui-loop")
            client.connect()
            client.latest_state(timeout_s=10.0)
        except BaseException:
            lab.terminate()
            raise
        link = AgentLink(client, f"{lab.host}:{lab.port}", process=lab, is_lab=True)
        self.controller.attach_robot(link, detail="lab")

    def _scan(self) -> None:
        page = self.window.show_step("scan")
        if not page.start_scan("lab-quick"):
            raise StepFailed(f"the quick lab scan did not start: {page.status.text()}")
        self.wait_until(
            lambda: page.result is not None or _failed(page.status, "failed:"), 900, "scan"
        )
        if page.result is None:
            raise StepFailed(f"scan {page.status.text()}")
        n = len(page.result.objects)
        if n != 3:
            raise StepFailed(f"the scan found {n} objects, not the lab's 3")
        (sid,) = self.wait_signal(page.sig_scan_accepted, page.accept_scan, 120, "accept scan")
        self.ids["scan"] = sid
        self.shot(self.window, "loop-1-scan")

    def _twin(self) -> None:
        page = self.window.show_step("twin")
        page.build_twin(procedural=False)
        self.wait_until(
            lambda: self.latest("twin") is not None or _failed(page.status, "Building"),
            900,
            "twin build",
        )
        twin = self.latest("twin")
        if twin is None:
            raise StepFailed(page.status.text())
        with self.probe.excluded():
            if self.ids["scan"] not in twin.inputs:
                raise StepFailed(f"twin {twin.id} was not built from scan {self.ids['scan']}")
            _, spec = load_twin(self.proj, twin.id)
        if DAMPING not in spec.params:
            raise StepFailed(f"twin {twin.id} has no parameter {DAMPING}")
        self.ids["twin"], self.params = twin.id, spec.params
        self.wait_until(lambda: page.twin_id == twin.id and not page._loading_id, 600, "twin shown")
        self.wait_until(lambda: not self.window.runner.running(), 120, "twin jobs")
        self.shot(self.window, "loop-2-twin")

    def _record(self) -> None:
        panel = RecordPanel(self.controller, runner=self.window.runner)
        self._panel = panel  # kept: closed with the window
        panel.motion_box.setCurrentText("chirp")
        panel.duration.setValue(3.0)
        panel.joints.setText("panda_joint2,panda_joint4")
        panel.preview_button.click()
        self.wait_until(lambda: panel.record_button.isEnabled(), 60, "chirp preview")
        (rid,) = self.wait_signal(panel.sig_recorded, panel.record_button.click, 120, "record")
        self.wait_until(lambda: not panel.runner.running(), 30, "record job")
        self.ids["recording"] = rid
        self.shot(panel, "loop-3-record")

    def _fit(self) -> None:
        dlg = FitDialog(
            self.controller,
            self.ids["twin"],
            [self.ids["recording"]],
            self.params,
            [DAMPING],
        )
        self._dlg = dlg
        dlg.budget.setValue(8)
        dlg.start()
        self.wait_until(
            lambda: dlg.fit_id is not None or _failed(dlg.summary, "Fit failed"), 600, "fit"
        )
        if dlg.fit_id is None:
            raise StepFailed(dlg.summary.text())
        with self.probe.excluded():
            fit = self.proj.artifact(dlg.fit_id)
        if list(fit.inputs) != [self.ids["twin"], self.ids["recording"]]:
            raise StepFailed(f"fit {fit.id} has inputs {fit.inputs}")
        self.ids["fit"] = fit.id
        self.wait_until(lambda: not self.window.runner.running(), 60, "fit jobs")
        self.pause(300)  # what the finished fit draws
        self.shot(dlg, "loop-4-fit")

    def _train(self) -> None:
        self.controller.notify_project_changed()
        page = self.window.show_step("policies")
        setup = page.setup
        twin, fit = self.ids["twin"], self.ids["fit"]
        self.wait_until(lambda: setup.twin_combo.findData(twin) >= 0, 20, "twin offered")
        setup.twin_combo.setCurrentIndex(setup.twin_combo.findData(twin))
        setup.dr_combo.setCurrentIndex(setup.dr_combo.findData("posterior"))
        self.wait_until(lambda: setup.fit_combo.findData(fit) >= 0, 20, "fit offered")
        setup.fit_combo.setCurrentIndex(setup.fit_combo.findData(fit))
        setup.budget.setValue(2)
        setup.population.setValue(4)
        setup.episodes.setValue(1)
        setup.after_eval.setValue(4)
        before = self.latest("policy")
        page.train_btn.click()
        self.wait_until(
            lambda: (
                self.latest("policy") not in (None, before)
                or _failed(page.status, "Training failed")
            ),
            600,
            "training",
        )
        if self.latest("policy") in (None, before):
            raise StepFailed(page.status.text())
        self.wait_until(lambda: page.train_btn.isEnabled(), 120, "training finished")
        self.pause(300)  # what the finished training draws
        policy = self.latest("policy")
        if list(policy.inputs) != [twin, fit]:
            raise StepFailed(f"policy {policy.id} has inputs {policy.inputs}")
        self.ids["policy"] = policy.id
        self.shot(self.window, "loop-5-policies")

    def _deploy(self) -> None:
        self.controller.notify_project_changed()
        dep = self.window.show_step("deploy")
        self._dep = dep
        dep.refresh()
        dep.policy_box.setCurrentIndex(dep.policy_box.findData(self.ids["policy"]))
        dep.predict_button.click()
        self.wait_until(lambda: dep.run_button.isEnabled(), 120, "prediction")
        (res,) = self.wait_signal(dep.sig_run_saved, dep.run_button.click, 240, "deploy run")
        if res.outcome.get("ended") != "duration" or not np.isfinite(
            res.outcome.get("final_error", np.nan)
        ):
            raise StepFailed(f"the deploy run ended early: {res.outcome}")
        self.wait_until(lambda: not dep.runner.running(), 60, "deploy job")
        self.pause(300)  # what the saved run draws
        state = self.controller.robot_state()
        if state is not None and float(np.max(np.abs(state.joint_vel))) >= 0.05:
            raise StepFailed("the robot was not left stopped after the run")
        self.ids["run"], self.ids["run_trajectory"] = res.run_id, res.trajectory_id
        self.result = res
        self.shot(self.window, "loop-6-deploy")

    def _refit(self) -> None:
        dep = self._dep
        if self.inject:
            for label, make in (
                ("NaN-tailed deploy run", self._nan_tailed_run),
                ("recording cut short on disk", self._truncated_run),
            ):
                self._send_failing(label, make())
            dep.result = self.result
            dep.refit_button.setEnabled(True)
        (fid,) = self.wait_signal(
            dep.sig_refit_done, dep.refit_button.click, 900, "refit with the real run"
        )
        with self.probe.excluded():
            self.proj.refresh()
            refit = self.proj.artifact(fid)
        if self.ids["run_trajectory"] not in refit.inputs or (
            self.ids["recording"] not in refit.inputs
        ):
            raise StepFailed(f"refit {fid} has inputs {refit.inputs}")
        self.ids["refit"] = fid
        self.wait_until(lambda: not dep.runner.running(), 60, "refit job")
        self.pause(300)

    def _retrain(self) -> None:
        dep = self._dep
        (pid,) = self.wait_signal(dep.sig_retrained, dep.retrain_button.click, 900, "retrain")
        with self.probe.excluded():
            self.proj.refresh()
            policy2 = self.proj.artifact(pid)
        if list(policy2.inputs) != [self.ids["twin"], self.ids["refit"]]:
            raise StepFailed(f"retrained policy {pid} has inputs {policy2.inputs}")
        self.ids["policy2"] = pid
        self.wait_until(lambda: not dep.runner.running(), 60, "retrain job")
        self.pause(300)
        self.shot(self.window, "loop-7-retrained")

    # -- injected failures -------------------------------------------------------------------
    def _nan_tailed_run(self) -> Any:
        with self.probe.excluded():
            return nan_tailed_copy(self.proj, self.result)

    def _truncated_run(self) -> Any:
        with self.probe.excluded():
            return truncated_copy(self.proj, self.result)

    def _send_failing(self, label: str, res: Any) -> None:
        """Send `res` to Real2Sim on the Deploy page: it must be reported as a failure."""
        dep = self._dep
        dep.result = res
        dep.refit_button.setEnabled(True)  # as a new run's end does
        got: dict[str, Any] = {}

        def done(fid: str) -> None:
            got["done"] = fid

        def failed(msg: str) -> None:
            got["failed"] = msg

        dep.sig_refit_done.connect(done)
        dep.sig_refit_failed.connect(failed)
        try:
            dep.refit_button.click()
            self.wait_until(lambda: got, 900, f"refit of the {label}")
        finally:
            dep.sig_refit_done.disconnect(done)
            dep.sig_refit_failed.disconnect(failed)
        self.wait_until(lambda: not dep.runner.running(), 60, "refit job")
        status, note = dep.status.text(), dep.refit_note.text()
        as_success = (
            "done" in got
            or dep.retrain_button.isEnabled()
            or "saved" in status
            or "Refit failed" not in note
        )
        self.injected.append(
            {
                "injected": label,
                "trajectory": res.trajectory_id,
                "reported": "failed" in got and "Refit failed" in note,
                "as_success": as_success,
                "message": got.get("failed", got.get("done", "")),
                "status": status,
            }
        )


def _failed(label: Any, prefix: str) -> bool:
    """The page's status label says its job failed."""
    return bool(label.text().startswith(prefix))


def run(root: Path, out: Path, inject: bool, shots: Path | None) -> int:
    """Open the window at 1366x768, run the loop, write the report; 0 when it was written."""
    logging.basicConfig(level=logging.WARNING)
    share_gl_contexts()  # as the app does: the 3D views draw in windows of their own
    qapp = QtWidgets.QApplication.instance() or QtWidgets.QApplication([sys.argv[0]])
    controller = AppController()
    controller.install_log_handler()
    win = MainWindow(controller)
    win.resize(1366, 768)
    win.show()
    loop = GuiLoop(win, controller, root, inject=inject, shots=shots)
    try:
        report = loop.run()
        report["errors_shown"] = list(win.last_error) if win.last_error else []
    finally:
        win.shutdown()
        win.close()
        controller.shutdown()
        qapp.processEvents()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.loop_run", description=__doc__)
    p.add_argument("--project", type=Path, required=True, help="new project folder")
    p.add_argument("--out", type=Path, required=True, help="report (JSON)")
    p.add_argument("--inject", action="store_true", help="send two failing runs to Real2Sim")
    p.add_argument("--shots", type=Path, default=None, help="save each page as a PNG here")
    args = p.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    return run(args.project, args.out, args.inject, args.shots)


if __name__ == "__main__":
    raise SystemExit(main())
