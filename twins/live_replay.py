"""Replays for live tuning: worlds that stay built between parameter changes, optionally
spread over worker processes.

`Replayer(spec)` keeps a world (and, for delayed commands, a zero-latency twin of it) and
replays recording windows at given values, retuning in place where it can
(`twins.retune`). `ReplayPool(spec, windows, processes)` runs one `Replayer` per worker
process over a fixed list of windows: `run(values, indices)` sends the values to every
worker, each replays its share, and the results come back in window order. PyBullet holds
Python's GIL while it steps, so threads would not run in parallel; processes do.

Windows are the fit's (`twins.objective.windows`): each replayed from its own recorded start,
commands before it kept for latency; a whole recording is one window.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Mapping, Sequence
from typing import Any

from devices.trajectory import Trajectory
from twins.errors import TwinError
from twins.spec import TwinSpec

Plain = tuple[Any, ...]  # a Trajectory as picklable parts (t, channels, units, source, meta)


def plain(traj: Trajectory) -> Plain:
    return (traj.t, dict(traj.channels), dict(traj.units), traj.source, dict(traj.meta))


class Replayer:
    """A twin world kept between changes (see the module docstring)."""

    def __init__(self, spec: TwinSpec) -> None:
        self.spec = spec
        self.world: Any = None
        self._zero: Any = None
        self.values: dict[str, float] = spec.params.nominal()

    @property
    def zero_latency(self) -> Any:
        """The world with every latency at 0 (delayed commands are precomputed)."""
        from twins.builder import TwinWorld
        from twins.retune import retune

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
        from twins.builder import TwinWorld
        from twins.retune import retune

        new = self.spec.params.validate({**self.values, **values})
        if self.world is not None and retune(self.world, new):
            self.values = new
            return False
        world = TwinWorld(self.spec, new)
        if self.world is not None:
            self.world.close()
        self.world, self.values = world, new
        return True

    def replay(self, w: Trajectory) -> Trajectory:
        from twins.objective import _replay_window

        if self.world is None:
            self.set_values({})
        return _replay_window(self, self.values, w)  # type: ignore[arg-type]

    def close(self) -> None:
        for w in (self.world, self._zero):
            if w is not None:
                w.close()
        self.world = self._zero = None


def _serve(conn: Any, spec: TwinSpec, windows: Sequence[Plain]) -> None:
    """A pool worker: replays windows on request until told to close."""
    rep = Replayer(spec)
    wins = [Trajectory(*w) for w in windows]
    try:
        rep.set_values({})
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "close":
                return
            _, values, indices = msg
            t0 = time.perf_counter()
            try:
                rebuilt = rep.set_values(values)
            except TwinError as exc:
                conn.send(("error", str(exc)))
                continue
            out: list[tuple[int, Plain | None, str]] = []
            for i in indices:
                try:
                    out.append((i, plain(rep.replay(wins[i])), ""))
                except (TwinError, KeyError, ValueError) as exc:
                    out.append((i, None, str(exc)))
            conn.send(("ok", out, rebuilt, time.perf_counter() - t0))
    except (EOFError, KeyboardInterrupt):
        return
    finally:
        rep.close()


class ReplayPool:
    """`processes` workers, each with its own world, over a fixed list of windows."""

    def __init__(self, spec: TwinSpec, windows: Sequence[Trajectory], processes: int) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no Qt, no inherited threads
        self.windows = list(windows)
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
        self, values: Mapping[str, float], indices: Sequence[int]
    ) -> tuple[dict[int, Trajectory], dict[int, str], bool, str]:
        """Replay windows `indices` at `values`, spread over the workers: (sims by window,
        errors by window, any world rebuilt, an error refusing the values)."""
        share: list[list[int]] = [[] for _ in self._conns]
        # longest first, each to the least loaded worker
        load = [0.0] * len(share)
        for i in sorted(indices, key=lambda k: -self.windows[k].duration):
            k = load.index(min(load))
            share[k].append(i)
            load[k] += self.windows[i].duration
        for c, mine in zip(self._conns, share, strict=True):
            c.send(("run", dict(values), mine))
        sims: dict[int, Trajectory] = {}
        errors: dict[int, str] = {}
        rebuilt, refused = False, ""
        for c in self._conns:
            msg = c.recv()
            if msg[0] == "error":
                refused = msg[1]
                continue
            _, out, rb, _ = msg
            rebuilt |= bool(rb)
            for i, p, err in out:
                if p is None:
                    errors[i] = err
                else:
                    sims[i] = Trajectory(*p)
        return sims, errors, rebuilt, refused

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
