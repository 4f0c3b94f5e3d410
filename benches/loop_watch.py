"""What `benches/loop_run.py` watches and injects besides the window: the robot link's drops
(`LinkWatch`), how late any Python thread of the app's process runs (`ThreadProbe`: what the
link's heartbeat thread meets), how long the garbage collector held it (`GcWatch`), and the failing deploy runs sent to Real2Sim
(`nan_tailed_copy`, `truncated_copy`: copies of a real run with the same lineage)."""

from __future__ import annotations

import gc
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.workflows.deploy import DeployResult
from benches.soak import StallProbe
from devices.trajectory import Trajectory

NAN_TAIL = 15  # samples without a command the old deploy recorder left at a run's end


class LinkWatch:
    """Counts the robot link's drops from the controller's device rows: a "reconnecting"
    row is a drop, a later "connected" its recovery, an "error" row a loss."""

    def __init__(self, controller: Any) -> None:
        self._lock = threading.Lock()
        self.drops = self.recovered = self.lost = 0
        self.events: list[str] = []
        self._down = False
        controller.devices_changed.connect(self._on_devices)

    def _on_devices(self, devices: Any) -> None:
        row = devices.get("robot") if isinstance(devices, dict) else None
        if row is None:
            return
        with self._lock:
            if row.state == "reconnecting" and not self._down:
                self._down = True
                self.drops += 1
                self.events.append(f"{time.strftime('%H:%M:%S')} dropped: {row.detail}")
            elif row.state == "connected" and self._down:
                self._down = False
                self.recovered += 1
                self.events.append(f"{time.strftime('%H:%M:%S')} back")
            elif row.state == "error":
                self.lost += 1
                self.events.append(f"{time.strftime('%H:%M:%S')} lost: {row.detail}")

    def unrecovered(self) -> int:
        with self._lock:
            return self.drops - self.recovered


class ThreadProbe:
    """What any Python thread of this process meets (the robot link's heartbeat thread
    among them): a thread that sleeps 10 ms, its lateness recorded per section of `probe`.
    Late here but not on the GUI thread: the GIL or the CPU was held elsewhere."""

    def __init__(self, probe: StallProbe) -> None:
        self.probe = probe
        self.worst: dict[str, float] = {}
        self._on = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-probe", daemon=True)

    def start(self) -> None:
        self._on.set()
        self._thread.start()

    def stop(self) -> None:
        self._on.clear()
        self._thread.join(1.0)

    def _run(self) -> None:
        while self._on.is_set():
            t = time.perf_counter()
            time.sleep(0.01)
            late = (time.perf_counter() - t - 0.01) * 1000
            section = self.probe._section
            if section is not None and late > self.worst.get(section, 0.0):
                self.worst[section] = round(late, 1)


class GcWatch:
    """How long Python's cyclic garbage collector held the GIL, per section of `probe`
    (`gc.callbacks`): a full collection walks the whole heap with every thread waiting,
    wherever the allocation that set it off happened to be (a stall's stack does not show it)."""

    def __init__(self, probe: StallProbe) -> None:
        self.probe = probe
        self.worst: dict[str, float] = {}
        self.full: dict[str, int] = {}  # full (generation 2) collections per section
        self._t0 = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        ms = (time.perf_counter() - self._t0) * 1000
        section = self.probe._section
        if section is None:
            return
        if ms > self.worst.get(section, 0.0):
            self.worst[section] = round(ms, 1)
        if info.get("generation") == 2:
            self.full[section] = self.full.get(section, 0) + 1


def _copy_run(proj: Any, res: Any, label: str, edit: Callable[[Path], None]) -> Any:
    """A copy of the deploy run `res` (trajectory and run artifacts, same lineage) whose
    trajectory folder `edit` changes; returns its DeployResult."""

    proj.refresh()
    src_t, src_r = proj.artifact(res.trajectory_id), proj.artifact(res.run_id)
    with proj.new_artifact(
        "trajectory", inputs=src_t.inputs, settings=src_t.settings, summary=label
    ) as f:
        shutil.copytree(proj.path_of(src_t.id), f, dirs_exist_ok=True)
        edit(Path(f))
    proj.refresh()
    tid = proj.artifacts("trajectory")[-1].id
    with proj.new_artifact(
        "run", inputs=[src_r.inputs[0], tid], settings=src_r.settings, summary=label
    ) as f:
        shutil.copytree(proj.path_of(src_r.id), f, dirs_exist_ok=True)
    proj.refresh()
    return DeployResult(tid, proj.artifacts("run")[-1].id, dict(res.outcome))


def nan_tailed_copy(proj: Any, res: Any) -> Any:
    """The run as the old deploy recorder saved it: NAN_TAIL samples without a command."""

    def add_tail(folder: Path) -> None:
        tr = Trajectory.load(folder)
        dt = float(np.median(np.diff(tr.t)))
        t = np.concatenate([tr.t, tr.t[-1] + dt * np.arange(1, NAN_TAIL + 1)])
        channels = {}
        for name, v in tr.channels.items():
            tail = np.repeat(v[-1:], NAN_TAIL, axis=0)
            if name == "robot/command":
                tail = np.full_like(tail, np.nan)
            channels[name] = np.concatenate([v, tail])
        Trajectory(t, channels, dict(tr.units), tr.source, dict(tr.meta)).save(folder)

    return _copy_run(proj, res, "deploy run with a NaN command tail (injected)", add_tail)


def truncated_copy(proj: Any, res: Any) -> Any:
    """The run with its recording's data file cut in half on disk."""

    def cut(folder: Path) -> None:
        data = folder / "data.parquet"
        raw = data.read_bytes()
        data.write_bytes(raw[: len(raw) // 2])

    return _copy_run(proj, res, "deploy run with its recording cut short (injected)", cut)
