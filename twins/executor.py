"""Many rollouts through one interface (docs/ARCHITECTURE.md §5): fits, randomized training, evaluation.

- `SerialExecutor`: in this process (one worker, tests, debugging).
- `LocalExecutor(workers)`: a process pool (spawn start method, so no parent state such as a
  PyBullet client or a GUI is inherited); every rollout builds its own `TwinWorld`, which
  opens its own PyBullet DIRECT client in the worker.
- `RayExecutor(address)`: the same `map` on a Ray cluster (`address=None` starts a local
  Ray instance owned by this executor and shut down by `close`).

`map` keeps the order of `items`. The function and items must be picklable (module-level
functions, plain values, specs and trajectories). Nothing distributed is home-made.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol, TypeVar

from twins.errors import TwinError

X = TypeVar("X")
Y = TypeVar("Y")
BACKENDS = ("local", "ray")


class Executor(Protocol):
    """Runs `fn` over `items`, yielding results in the order of `items`."""

    workers: int

    def map(self, fn: Callable[[X], Y], items: Sequence[X]) -> Iterator[Y]: ...

    def close(self) -> None: ...


class SerialExecutor:
    """Runs everything in the calling process."""

    workers = 1

    def map(self, fn: Callable[[X], Y], items: Sequence[X]) -> Iterator[Y]:
        return (fn(x) for x in items)

    def close(self) -> None:
        pass

    def __enter__(self) -> SerialExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalExecutor:
    """A local process pool of `workers` processes (started on first use). One worker runs
    in this process unless `isolated`: the desktop app isolates its fits, since a replay's
    PyBullet calls hold the GIL and stalled the window (and the robot link's heartbeat
    thread) 0.5 s at a time."""

    def __init__(self, workers: int | None = None, isolated: bool = False) -> None:
        n = workers if workers is not None else (os.cpu_count() or 1)
        if n < 1:
            raise TwinError(f"executor: workers must be at least 1, not {n}")
        self.workers = int(n)
        self.isolated = isolated
        self._pool: ProcessPoolExecutor | None = None

    def map(self, fn: Callable[[X], Y], items: Sequence[X]) -> Iterator[Y]:
        if self.workers == 1 and not self.isolated:
            return (fn(x) for x in items)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn")
            )
        chunk = max(1, len(items) // (4 * self.workers))
        return self._pool.map(fn, items, chunksize=chunk)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RayExecutor:
    """Ray tasks: `address` of a running cluster ("host:port", "auto"), or None for a local
    instance with `workers` CPUs started here and stopped by `close`."""

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError as exc:  # an optional dependency fails at first use
            raise TwinError(f"--backend ray needs the 'ray' package ({exc})") from exc
        self._ray: Any = ray
        self._owned = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "configure_logging": False,
            }
            if address is None:
                kwargs["num_cpus"] = workers or os.cpu_count() or 1
                kwargs["object_store_memory"] = 100 * 1024 * 1024
            try:
                ray.init(address=address, **kwargs)
            except Exception as exc:  # ray raises ConnectionError, RuntimeError, ValueError...
                where = address or "a new local instance"
                raise TwinError(f"cannot reach Ray at {where}: {exc}") from exc
            self._owned = True
        self.workers = int(ray.cluster_resources().get("CPU", 1))

    def map(self, fn: Callable[[X], Y], items: Sequence[X]) -> Iterator[Y]:
        ray = self._ray
        remote = ray.remote(num_cpus=1)(fn)
        refs = [remote.remote(x) for x in items]
        return (ray.get(r) for r in refs)

    def close(self) -> None:
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()
        self._owned = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_executor(
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    isolated: bool = False,
) -> Executor:
    """The executor for a CLI/GUI choice: "local" (process pool; 1 worker = in process
    unless `isolated`) or "ray" (at `address`, or a local instance)."""
    if backend == "local":
        if address:
            raise TwinError("--address is for --backend ray")
        return LocalExecutor(workers or 1, isolated=isolated)
    if backend == "ray":
        return RayExecutor(address, workers)
    raise TwinError(f"backend '{backend}' is not one of {BACKENDS}")
