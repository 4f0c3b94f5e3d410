"""Replays for live tuning: worlds that stay built between parameter changes, optionally
spread over worker processes.

`Replayer(spec)` keeps a world (and, for delayed commands, a zero-latency twin of it) and
replays recording windows at given values, retuning in place where it can
(`twins.retune`). `ReplayPool(spec, windows, processes)` runs one `Replayer` per worker
process over a fixed list of windows: `run(values, indices)` sends the values to every
worker, each replays its share, and the results come back in window order; `tracks(times)`
then asks each worker for the drawn bodies' poses over the windows it just replayed (the
ghost over the whole recording can follow the curves instead of delaying them). PyBullet holds
Python's GIL while it steps, so threads would not run in parallel; processes do.

Windows are the fit's (`twins.fit.objective.windows`): each replayed from its own recorded start,
commands before it kept for latency; a whole recording is one window.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.trajectory import Trajectory
from twins.builder import TwinWorld
from twins.errors import TwinError
from twins.fit.objective import _replay_window
from twins.ghost import body_tracks, start_poses
from twins.retune import retune
from twins.spec import TwinSpec

Plain = tuple[Any, ...]  # a Trajectory as picklable parts (t, channels, units, source, meta)
# sims by window, body tracks by window (body -> (K, 4, 4)), errors by window, rebuilt, refusal
Result = tuple[
    dict[int, Trajectory], dict[int, dict[str, NDArray[np.float64]]], dict[int, str], bool, str
]


def plain(traj: Trajectory) -> Plain:
    return (traj.t, dict(traj.channels), dict(traj.units), traj.source, dict(traj.meta))


class Replayer:
    """A twin world kept between changes (see the module docstring)."""

    def __init__(self, spec: TwinSpec) -> None:
        self.spec = spec
        self.world: Any = None
        self._zero: Any = None
        self._start: dict[str, NDArray[np.float64]] | None = None  # ghost start poses
        self.values: dict[str, float] = spec.params.nominal()

    @property
    def zero_latency(self) -> Any:
        """The world with every latency at 0 (delayed commands are precomputed)."""
        lat = {n: 0.0 for n in self.values if n.endswith(".latency")}
        want = {**self.values, **lat}
        if self._zero is not None and not retune(self._zero, want):
            self._zero.close()
            self._zero = None
        if self._zero is None:
            self._zero = TwinWorld(self.spec, want)
        return self._zero

    def set_values(self, values: Mapping[str, float]) -> bool:
        """Take new values; True when the world had to be rebuilt. TwinError (naming the
        parameter) keeps the previous values."""
        new = self.spec.params.validate({**self.values, **values})
        if new != self.values:
            self._start = None
        if self.world is not None and retune(self.world, new):
            self.values = new
            return False
        world = TwinWorld(self.spec, new)
        if self.world is not None:
            self.world.close()
        self.world, self.values = world, new
        return True

    def replay(self, w: Trajectory) -> Trajectory:
        if self.world is None:
            self.set_values({})
        return _replay_window(self, self.values, w)  # type: ignore[arg-type]

    def replay_tracked(
        self, w: Trajectory, times: NDArray[np.float64] | None
    ) -> tuple[Trajectory, dict[str, NDArray[np.float64]]]:
        """`replay(w)` and, at `times` (s from the window's start), where every drawn body
        of the twin is in it (`twins.ghost.body_tracks`; kinematics only)."""
        sim = self.replay(w)
        if times is None or not len(times):
            return sim, {}
        if self._start is None:  # the same after every reset until the values change
            self._start = start_poses(self.world)
        return sim, body_tracks(self.world, sim, np.asarray(times, dtype=float), self._start)

    def close(self) -> None:
        for w in (self.world, self._zero):
            if w is not None:
                w.close()
        self.world = self._zero = None


def _batch_priority() -> None:
    """Mark this process as batch work (Linux SCHED_BATCH: the same share of the CPU, but
    waking up it does not preempt interactive threads), so a window's GUI thread is not
    pushed back by the replays it asked for; elsewhere nothing changes."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        pass


def _serve(conn: Any, spec: TwinSpec, windows: Sequence[Plain]) -> None:
    """A pool worker: replays windows on request until told to close."""
    _batch_priority()

    rep = Replayer(spec)
    wins = [Trajectory(*w) for w in windows]
    last: dict[int, Trajectory] = {}  # the windows replayed at the current values
    try:
        rep.set_values({})
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "close":
                return
            if msg[0] == "tracks":
                t0 = time.process_time()
                if rep._start is None:
                    rep._start = start_poses(rep.world)
                got = {
                    i: body_tracks(rep.world, last[i], np.asarray(at, float), rep._start)
                    for i, at in msg[1]
                    if i in last and at is not None and len(at)
                }
                conn.send(("tracks", got, time.process_time() - t0))
                continue
            _, values, tasks = msg
            last = {}
            t0 = time.process_time()
            try:
                rebuilt = rep.set_values(values)
            except TwinError as exc:
                conn.send(("error", str(exc)))
                continue
            out: list[tuple[int, Plain | None, dict[str, Any], str]] = []
            for i, times in tasks:
                try:
                    sim, poses = rep.replay_tracked(wins[i], times)
                    last[i] = sim
                    out.append((i, plain(sim), poses, ""))
                except (TwinError, KeyError, ValueError) as exc:
                    out.append((i, None, {}, str(exc)))
            conn.send(("ok", out, rebuilt, time.process_time() - t0))  # CPU seconds
    except (EOFError, KeyboardInterrupt):
        return
    finally:
        rep.close()


class ReplayPool:
    """`processes` workers, each with its own world, over a fixed list of windows."""

    def __init__(self, spec: TwinSpec, windows: Sequence[Trajectory], processes: int) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no Qt, no inherited threads
        self.windows = list(windows)
        self.cpu_s = 0.0
        self.cpu_spent_s = 0.0  # CPU time of every worker on every request, summed
        self._owner: dict[int, int] = {}  # window -> the worker that replayed it last
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        parts = [plain(w) for w in self.windows]
        for _ in range(max(1, processes)):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(b, spec, parts), daemon=True)
            p.start()
            b.close()
            self._conns.append(a)
            self._procs.append(p)
        for c in self._conns:
            msg = c.recv()
            if msg[0] != "ready":
                raise TwinError(f"a replay worker did not start: {msg}")

    @property
    def size(self) -> int:
        return len(self._conns)

    def run(
        self,
        values: Mapping[str, float],
        indices: Sequence[int],
        times: Mapping[int, NDArray[np.float64]] | None = None,
    ) -> Result:
        """Replay windows `indices` at `values`, spread over the workers, each with its
        body poses at `times[i]` (s from the window's start): (sims, body tracks, errors by
        window, any world rebuilt, an error refusing the values). `cpu_s` then holds the
        most CPU time one worker spent (its wall time on an idle core)."""
        share: list[list[int]] = [[] for _ in self._conns]
        # longest first, each to the least loaded worker
        load = [0.0] * len(share)
        for i in sorted(indices, key=lambda k: -self.windows[k].duration):
            k = load.index(min(load))
            share[k].append(i)
            load[k] += self.windows[i].duration
        at = times or {}
        self._owner = {i: k for k, mine in enumerate(share) for i in mine}
        for c, mine in zip(self._conns, share, strict=True):
            c.send(("run", dict(values), [(i, at.get(i)) for i in mine]))
        sims: dict[int, Trajectory] = {}
        tracks: dict[int, dict[str, NDArray[np.float64]]] = {}
        errors: dict[int, str] = {}
        rebuilt, refused = False, ""
        self.cpu_s = 0.0
        for c in self._conns:
            msg = c.recv()
            if msg[0] == "error":
                refused = msg[1]
                continue
            _, out, rb, cpu = msg
            self.cpu_s = max(self.cpu_s, float(cpu))
            self.cpu_spent_s += float(cpu)
            rebuilt |= bool(rb)
            for i, p, poses, err in out:
                if p is None:
                    errors[i] = err
                else:
                    sims[i] = Trajectory(*p)
                    tracks[i] = poses
        return sims, tracks, errors, rebuilt, refused

    def tracks(
        self, times: Mapping[int, NDArray[np.float64]]
    ) -> dict[int, dict[str, NDArray[np.float64]]]:
        """Body poses (body -> (K, 4, 4)) at `times[i]` (s from window i's start) in the
        windows the last `run` replayed, from the workers that replayed them; `cpu_s`
        then holds the most CPU time one worker spent on them."""
        asks: list[list[tuple[int, NDArray[np.float64]]]] = [[] for _ in self._conns]
        for i, at in times.items():
            if i in self._owner:
                asks[self._owner[i]].append((i, at))
        busy = [k for k, a in enumerate(asks) if a]
        for k in busy:
            self._conns[k].send(("tracks", asks[k]))
        out: dict[int, dict[str, NDArray[np.float64]]] = {}
        self.cpu_s = 0.0
        for k in busy:
            msg = self._conns[k].recv()
            if msg[0] == "tracks":
                out.update(msg[1])
                self.cpu_s = max(self.cpu_s, float(msg[2]))
                self.cpu_spent_s += float(msg[2])
        return out

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(("close",))
            except (OSError, BrokenPipeError):
                pass
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
        for c in self._conns:
            c.close()
        self._conns, self._procs = [], []
