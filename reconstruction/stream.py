"""Two-core handheld scanning: frames are read, and their tracking views built, on a worker
thread one or two frames ahead of the tracker (`read_ahead`), and a tracked frame's fusion
runs on another worker while the next frame is registered (`DeferredFusion`).

Both only overlap work whose inputs are already fixed, so a scan's result does not depend on
thread timing: the view of a frame depends only on the frame, and a frame's fusion starts
right after the next frame's model view was raycast and made a View (the raycast then sees
the model without the newest fused frame; the TSDF is never read and written at once).
Open3D's ICP releases the GIL, its fusion, raycast and voxel downsampling hold it (docs/
TRAPS.md): the fusion starts once the view is built, so it overlaps the ICP (lab 8 s path:
the view took 13.9 ms a frame while a fusion ran beside it, 7.5 ms after it).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from devices.frames import RGBDFrame

_END = object()


def read_ahead(
    frames: Iterable[RGBDFrame],
    prepare: Callable[[RGBDFrame], None] | None = None,
    depth: int = 2,
) -> Iterator[RGBDFrame]:
    """The frames of `frames`, read (and `prepare`d) on a worker thread up to `depth` frames
    ahead. An error of the source is raised here, at the frame where it happened; leaving
    the loop early stops the reader."""
    q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for f in frames:
                if prepare is not None:
                    prepare(f)
                if not put(f):
                    return
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(exc)

    t = threading.Thread(target=work, name="scan-read-ahead", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        t.join(timeout=5.0)


class DeferredFusion:
    """One fusion at a time on a worker thread. `defer(fn)` holds a fusion until `start()`
    (called once the next raycast is a View) or `wait()`; `wait()` returns when none is held or
    running, re-raising its error."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._held: Callable[[], None] | None = None
        self._running: Future[None] | None = None

    def defer(self, fn: Callable[[], None]) -> None:
        self.wait()
        self._held = fn

    @property
    def pending(self) -> bool:
        return self._held is not None or self._running is not None

    def start(self) -> None:
        if self._held is None:
            return
        if self._running is not None:
            self._running.result()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="scan-fusion")
        fn, self._held = self._held, None
        self._running = self._pool.submit(fn)

    def join_running(self) -> None:
        """Wait for the running fusion (not the held one)."""
        run, self._running = self._running, None
        if run is not None:
            run.result()

    def wait(self) -> None:
        self.start()
        run, self._running = self._running, None
        if run is not None:
            run.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
