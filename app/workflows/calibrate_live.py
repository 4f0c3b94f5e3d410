"""Live visual tuning (the Calibrate page's engine; Qt-free): a twin and some recordings,
re-simulated off the GUI thread whenever a parameter changes.

Follows `twin_live.LiveTwin`: commands (`set_values`, `set_visible`, `set_window`) return at
once; a worker thread owns the twin's world and publishes `CalibFrame`s, "latest wins"
(`on_frame` is called at most once until the view has taken the frame). Parameter edits
coalesce: every edit waiting when the worker wakes becomes one re-simulation with the newest
value of each parameter, and a result overtaken by a newer edit while it was computed is
dropped, never drawn.

Each change: the values go into the world in place where the engine allows it
(`twins.retune`, ~1 ms) or the world is rebuilt (~90 ms for a Panda); each visible recording
is replayed open loop from its first sample (`twins.simulate.replay_in`). With worker
processes, a first frame carries the simulated curves and the twin's body poses at the
time cursor (`set_cursor`; the ghost grid's sample nearest to it, computed here), a second
one the ghost over the whole recording (`GHOST_HZ`) so the cursor can scrub it, asked of the
workers once no edit came for `FULL_GHOST_AFTER_S` or when the cursor moves (while a slider
is dragged they only replay); replays on this thread give one frame with both.
The recorded motion itself is drawn from the same twin's kinematics (`recorded` tracks,
computed once).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.trajectory import Trajectory
from resources.errors import TwinbenchError
from twins.builder import TwinWorld
from twins.fit.objective import windows
from twins.ghost import body_tracks, start_poses
from twins.live_replay import Replayer, ReplayPool
from twins.spec import TwinSpec

log = logging.getLogger(__name__)

GHOST_HZ = 25.0  # ghost poses per second of recording (scrubbing granularity)
# With worker processes, the ghost over the whole recording is asked for once no edit has
# come for this long (or at once when the time cursor moves): while a slider is dragged the
# workers only replay, and the first frame's redraw has the CPU to itself.
FULL_GHOST_AFTER_S = 0.08


@dataclass(frozen=True)
class BodyTrack:
    """Body poses over time: `t` (K,) s from the recording's start; body -> (K, 4, 4)."""

    t: NDArray[np.float64]
    poses: Mapping[str, NDArray[np.float64]]

    def at(self, time_s: float) -> dict[str, NDArray[np.float64]]:
        """Every body's pose at the sample nearest `time_s`."""
        if not len(self.t):
            return {}
        k = int(np.argmin(np.abs(self.t - time_s)))
        return {name: P[k] for name, P in self.poses.items()}


@dataclass(frozen=True)
class CalibFrame:
    """What the page draws: per visible recording its simulation (or why there is none),
    the ghost (twin) and the recorded motion's body poses."""

    seq: int
    request: int  # the newest parameter edit this frame includes (0: the twin's own values)
    values: Mapping[str, float]
    sims: Mapping[str, Trajectory]
    errors: Mapping[str, str]
    ghost: Mapping[str, BodyTrack]
    recorded: Mapping[str, BodyTrack]
    full_ghost: bool  # False: the ghost holds only the cursor's sample so far
    rebuilt: bool  # the world was rebuilt for this change (not retuned in place)
    sim_ms: float  # world update + replays, milliseconds
    error: str = ""
    sim_cpu_ms: float = float("nan")  # CPU time of the busiest replay worker


@dataclass
class _Cmd:
    kind: str
    args: tuple[Any, ...] = ()
    request: int = 0
    sent: float = field(default_factory=time.perf_counter)


class LiveCalibration:
    """Owns a twin world on a worker thread; see the module docstring.

    `spec` and `recordings` (id -> real Trajectory) are fixed for its life; the page opens a
    new one for another twin. `values` start at the twin's nominals."""

    def __init__(
        self,
        spec: TwinSpec,
        recordings: Mapping[str, Trajectory],
        on_frame: Callable[[], None],
        visible: Sequence[str] | None = None,
        ghost_hz: float = GHOST_HZ,
        window_s: float | None = None,
        processes: int = 0,
    ) -> None:
        self.spec = spec
        self.window_s = window_s
        self.processes = processes
        self.recordings = dict(recordings)
        self._on_frame = on_frame
        self._ghost_hz = ghost_hz
        self._values = spec.params.nominal()
        self._visible = list(self.recordings if visible is None else visible)
        self._cmds: queue.Queue[_Cmd] = queue.Queue()
        self._lock = threading.Lock()
        self._latest: CalibFrame | None = None
        self._notified = False
        self._seq = 0
        self._request = 0
        self._pending_requests = 0  # edits sent and not yet taken by the worker
        self.dropped = 0  # results overtaken by a newer edit (tests read it)
        self.simulated = 0  # re-simulations run
        self._world: Any = None  # kinematics for the ghost and the recorded motion
        self._replayer: Any = None  # in this thread (processes == 0) ...
        self._pool: Any = None  # ... or a pool of worker processes
        self._windows: dict[str, list[int]] = {}  # recording -> its windows' indices
        self._all_windows: list[Trajectory] = []
        self._rebuilt_once = False
        self._recorded: dict[str, BodyTrack] = {}
        self._start: dict[str, NDArray[np.float64]] | None = None  # this world's start poses
        self.cursor_s = 0.0  # where the ghost is looked at first (s from a recording's start)
        self._thread = threading.Thread(target=self._run, name="calibrate-live", daemon=True)
        self._thread.start()
        self._send(_Cmd("values", ({},)))

    # -- commands (any thread; return at once) ---------------------------------------------
    def set_values(self, values: Mapping[str, float]) -> int:
        """New values for some parameters; returns the edit's number (frames say which
        edit they include)."""
        with self._lock:
            self._request += 1
            self._pending_requests += 1
            req = self._request
        self._send(_Cmd("values", (dict(values),), req))
        return req

    def set_visible(self, ids: Sequence[str]) -> None:
        """Which recordings to simulate and draw."""
        self._send(_Cmd("visible", (list(ids),)))

    def set_window(self, window_s: float | None) -> None:
        """Replay each recording whole (None) or restarted from its recorded state every
        `window_s` seconds, as the fit does (the residuals are then the fit's)."""
        self._send(_Cmd("window", (window_s,)))

    def set_cursor(self, time_s: float) -> None:
        """The time cursor (s from the recording's start): a new simulation's first frame
        holds the ghost there (no re-simulation); a ghost over the whole recording still
        owed is then sent at once (scrubbing shows it)."""
        self.cursor_s = float(time_s)
        self._send(_Cmd("cursor"))

    def close(self, timeout_s: float = 10.0, wait: bool = True) -> None:
        """Stop the worker; it closes its world and replay processes itself. `wait=False`
        returns at once (a window's GUI thread: closing worker processes takes a while)."""
        if self._thread.is_alive():
            self._send(_Cmd("close"))
            if not wait:
                return
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("calibration worker did not stop within %.0f s", timeout_s)

    @property
    def workers(self) -> int:
        """Replay worker processes running (0: replays on the worker thread)."""
        pool = self._pool
        return pool.size if pool is not None else 0

    @property
    def replay_cpu_s(self) -> float:
        """CPU time the replay worker processes spent so far, summed over them."""
        pool = self._pool
        return pool.cpu_spent_s if pool is not None else 0.0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def latest_request(self) -> int:
        """The number of the newest edit sent."""
        with self._lock:
            return self._request

    def take_frame(self) -> CalibFrame | None:
        """The newest frame (None before the first); re-arms `on_frame`."""
        with self._lock:
            self._notified = False
            return self._latest

    def latest_frame(self) -> CalibFrame | None:
        with self._lock:
            return self._latest

    def _send(self, cmd: _Cmd) -> None:
        self._cmds.put(cmd)

    def _newer_edit_waiting(self) -> bool:
        with self._lock:
            return self._pending_requests > 0

    # -- worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        owed: Any = None  # the full ghost of the last frame, when still to be sent
        try:
            while True:
                try:
                    first = self._cmds.get(timeout=FULL_GHOST_AFTER_S if owed else None)
                except queue.Empty:  # no edit for a while: the ghost over the recording
                    self._full_ghost(owed)
                    owed = None
                    continue
                cmds = [first]
                while True:
                    try:
                        cmds.append(self._cmds.get_nowait())
                    except queue.Empty:
                        break
                if any(c.kind == "close" for c in cmds):
                    return
                if all(c.kind == "cursor" for c in cmds):
                    if owed is not None:
                        self._full_ghost(owed)
                    owed = None
                    continue
                owed = None
                edits = [c for c in cmds if c.kind == "values"]
                with self._lock:
                    self._pending_requests -= sum(1 for c in edits if c.request > 0)
                for c in edits:
                    self._values.update(c.args[0])
                for c in cmds:
                    if c.kind == "visible":
                        self._visible = [i for i in c.args[0] if i in self.recordings]
                    elif c.kind == "window" and c.args[0] != self.window_s:
                        self.window_s = c.args[0]
                        self._close_replay()
                request = max([c.request for c in edits] + [self._last_request()])
                owed = self._simulate(request)
        except Exception:
            log.exception("the calibration worker stopped")
            self._publish(self._empty_frame("the calibration worker stopped (see the log)"))
        finally:
            self._close_replay()
            if self._world is not None:
                self._world.close()

    def _close_replay(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._replayer is not None:
            self._replayer.close()
        self._pool = self._replayer = None
        self._windows, self._all_windows = {}, []

    def _open_replay(self) -> None:
        """Cut the recordings into windows and start the replay worlds (once per window
        setting)."""

        lat = [p.high for n, p in self.spec.params.items() if n.endswith(".latency")]
        lead = max(lat + [0.0]) + 0.01
        for rid, rec in self.recordings.items():
            ws = windows(rec, self.window_s, lead)
            self._windows[rid] = list(
                range(len(self._all_windows), len(self._all_windows) + len(ws))
            )
            self._all_windows += ws
        if self.processes > 0:
            n = min(self.processes, len(self._all_windows))  # no idle worker
            try:
                self._pool = ReplayPool(self.spec, self._all_windows, n)
                return
            except (OSError, RuntimeError, EOFError) as exc:  # e.g. no process may start here
                log.warning("replays run on one thread: worker processes did not start (%s)", exc)
        self._replayer = Replayer(self.spec)

    def _last_request(self) -> int:
        f = self._latest
        return f.request if f is not None else 0

    def _empty_frame(self, error: str) -> CalibFrame:
        return CalibFrame(
            0, self._last_request(), dict(self._values), {}, {}, {}, {}, True, False, 0.0, error
        )

    def _replay(self, indices: list[int], times: Mapping[int, NDArray[np.float64]]) -> Any:
        """Replay windows (with the ghost's body poses at `times`) at the current values,
        in the pool or on this thread; `twins.live_replay.Result`."""
        if self._pool is not None:
            return self._pool.run(self._values, indices, times)
        rep = self._replayer
        try:
            rebuilt = rep.set_values(self._values)
        except TwinbenchError as exc:
            return {}, {}, {}, False, str(exc)
        sims: dict[int, Trajectory] = {}
        tracks: dict[int, Any] = {}
        errors: dict[int, str] = {}
        for i in indices:
            if self._newer_edit_waiting():
                break
            try:
                sims[i], tracks[i] = rep.replay_tracked(self._all_windows[i], times.get(i))
            except (TwinbenchError, KeyError, ValueError) as exc:
                errors[i] = str(exc)
        return sims, tracks, errors, rebuilt, ""

    def _ghost_times(self, rid: str) -> tuple[NDArray[np.float64], dict[int, NDArray[np.float64]]]:
        """The ghost's time grid over recording `rid` (s from its start) and, per window,
        the grid's times inside it (s from the window's start)."""
        rec = self.recordings[rid]
        grid = np.linspace(0.0, rec.duration, max(2, int(rec.duration * self._ghost_hz) + 1))
        idx = self._windows[rid]
        starts = [float(self._all_windows[i].meta.get("window_start_s", 0.0)) for i in idx]
        ends = starts[1:] + [np.inf]
        return grid, {
            i: grid[(grid >= a - 1e-9) & (grid < b - 1e-9)] - a
            for i, a, b in zip(idx, starts, ends, strict=True)
        }

    def _merge_tracks(self, rid: str, grid: NDArray[np.float64], tracks: Mapping[int, Any]) -> Any:
        """The windows' body poses as one track over the recording (None if one is missing)."""
        parts: list[Any] = [tracks.get(i) for i in self._windows[rid]]
        if any(not p for p in parts):  # missing, or a window too short for a grid time
            return None
        poses = {b: np.concatenate([p[b] for p in parts]) for b in parts[0]}
        if any(len(P) != len(grid) for P in poses.values()):
            return None
        return BodyTrack(grid, poses)

    def _stitch(self, rid: str, sims: Mapping[int, Trajectory]) -> Trajectory | None:
        """The windows' simulations of recording `rid` on its own time base (NaN where no
        window covers a sample); earlier windows keep the samples two windows share."""
        rec = self.recordings[rid]
        idx = [i for i in self._windows[rid] if i in sims]
        if len(idx) != len(self._windows[rid]):
            return None
        if len(idx) == 1:
            return sims[idx[0]]
        t_rel = rec.t - rec.t[0]
        chans: dict[str, NDArray[np.float64]] = {}
        units: dict[str, str] = {}
        for i in reversed(idx):
            w, sim = self._all_windows[i], sims[i]
            i0 = int(np.searchsorted(t_rel, float(w.meta.get("window_start_s", 0.0)) - 1e-9))
            n = min(len(sim.t), len(rec.t) - i0)
            for name, arr in sim.channels.items():
                if name not in chans:
                    chans[name] = np.full((len(rec.t), arr.shape[1]), np.nan)
                    units[name] = sim.units.get(name, "")
                chans[name][i0 : i0 + n] = arr[:n]
        meta = {**dict(sims[idx[0]].meta), "windows": len(idx), "window_s": self.window_s}
        return Trajectory(rec.t, chans, units, "sim", meta)

    def _simulate(self, request: int) -> Any:
        """Re-simulate the visible recordings and publish the frame; with worker processes,
        returns what `_full_ghost` needs to send the ghost over the recordings later."""

        t0 = time.perf_counter()
        error = ""
        try:
            if self._replayer is None and self._pool is None:
                self._open_replay()
            if self._world is None:
                self._world = TwinWorld(self.spec)
        except TwinbenchError as exc:
            self._publish(self._empty_frame(str(exc)))
            return None
        for rid in self._visible:  # recorded motion: once per recording
            if rid not in self._recorded:
                self._recorded[rid] = self._track(body_tracks, self.recordings[rid], None)
        indices = [i for rid in self._visible for i in self._windows.get(rid, [])]
        grids: dict[str, NDArray[np.float64]] = {}
        times: dict[int, NDArray[np.float64]] = {}
        for rid in self._visible:
            grids[rid], per_window = self._ghost_times(rid)
            times.update(per_window)
        before = dict(self._values)
        pooled = self._pool is not None  # ghost over the recording in a second frame
        wsims, wtracks, werrors, rebuilt, refused = self._replay(indices, {} if pooled else times)
        if refused:  # a value the twin refuses: the previous values stay
            error = refused
            self._values = dict(self._latest.values) if self._latest else self.spec.params.nominal()
        if self._newer_edit_waiting():
            self.dropped += 1
            return None
        sims: dict[str, Trajectory] = {}
        ghost: dict[str, BodyTrack] = {}
        errors: dict[str, str] = {}
        for rid in self._visible:
            bad = [werrors[i] for i in self._windows.get(rid, []) if i in werrors]
            if bad:
                errors[rid] = bad[0]
                continue
            s = self._stitch(rid, wsims)
            if s is None:
                continue
            sims[rid] = s
            if pooled:  # the grid's sample nearest the cursor, the one scrubbing shows
                g = grids[rid]
                k = int(np.argmin(np.abs(g - self.cursor_s)))
                ghost[rid] = self._track(body_tracks, s, g[k : k + 1])
                continue
            track = self._merge_tracks(rid, grids[rid], wtracks)
            ghost[rid] = track if track is not None else self._track(body_tracks, s, None)
        self.simulated += 1
        sim_ms = 1000 * (time.perf_counter() - t0)
        cpu_ms = 1000 * self._pool.cpu_s if self._pool is not None else float("nan")
        frame = CalibFrame(
            0,
            request,
            before if not refused else dict(self._values),
            sims,
            errors,
            ghost,
            {rid: self._recorded[rid] for rid in self._visible if rid in self._recorded},
            True,
            rebuilt,
            sim_ms,
            error,
            cpu_ms,
        )
        if not pooled:
            self._publish(frame)
            return None
        self._publish(replace(frame, full_ghost=False))
        return (frame, grids, times) if sims else None

    def _full_ghost(self, owed: Any) -> None:
        """Send `owed` (`_simulate`'s frame, ghost grids and times) again with the ghost over
        the whole recordings, asked of the workers that replayed them (unless a newer edit
        waits: its simulation brings its own)."""

        frame, grids, times = owed
        if self._newer_edit_waiting() or self._pool is None:
            return
        wtracks = self._pool.tracks({i: t for i, t in times.items() if len(t)})
        full = {}
        for rid, s in frame.sims.items():
            track = self._merge_tracks(rid, grids[rid], wtracks)
            full[rid] = track if track is not None else self._track(body_tracks, s, None)
        if not self._newer_edit_waiting():
            self._publish(replace(frame, ghost=full, full_ghost=True))

    def _track(
        self, body_tracks: Callable[..., Any], traj: Trajectory, times: NDArray[np.float64] | None
    ) -> BodyTrack:
        if times is None:
            n = max(2, int(traj.duration * self._ghost_hz) + 1)
            times = np.linspace(0.0, traj.duration, n)
        if any(not np.all(np.isfinite(a)) for a in traj.channels.values()):
            traj = _held(traj)  # samples no window covers: the ghost holds the last pose
        if self._start is None:  # this world keeps the twin's own values
            self._start = start_poses(self._world)
        return BodyTrack(times, body_tracks(self._world, traj, times, self._start))

    def _publish(self, frame: CalibFrame) -> None:
        with self._lock:
            self._seq += 1
            self._latest = replace(frame, seq=self._seq)
            notify = not self._notified
            self._notified = True
        if notify:
            self._on_frame()


def _held(traj: Trajectory) -> Trajectory:
    """`traj` with NaN rows replaced by the last finite row (the first finite one at the
    start)."""
    chans = {}
    for name, arr in traj.channels.items():
        a = np.array(arr, dtype=float)
        ok = np.all(np.isfinite(a), axis=1)
        if ok.all() or not ok.any():
            chans[name] = np.nan_to_num(a)
            continue
        idx = np.where(ok, np.arange(len(a)), 0)
        idx = np.maximum.accumulate(idx)
        idx[: int(np.argmax(ok))] = int(np.argmax(ok))
        chans[name] = a[idx]
    return traj.with_channels(channels=chans)
