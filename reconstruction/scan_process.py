"""A posed scan's `ScanSession` in a worker process (`ScanProcess`).

Open3D keeps Python's GIL through each of its calls: fusing a frame (15 ms on a quiet core),
extracting the fused points for a preview (50 ms for 86k points) or the mesh (90 ms), the
table's RANSAC and the clusters' DBSCAN. On a busy 2-core laptop each of these took 200-500
ms, and every thread of the process — the window's event loop, the robot link's heartbeat —
waited that long. In a worker process they cost the window nothing, and a crash inside
Open3D ends the scan with a message instead of ending the app.

The worker is a fresh interpreter (spawn: no Qt, no inherited threads). Each call is one
round trip over a pipe: a frame is 1.5 MB pickled (~1 ms); results (previews, the mesh, the
objects) come back as plain numpy and trimesh objects. Handheld scans stay in-process: their
tracker builds each frame's view on a second thread ahead of `add`.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.frames import RGBDFrame
from reconstruction.errors import ReconstructionError
from reconstruction.pipeline import (
    PREVIEW_POINTS,
    Box,
    Preview,
    ScanSession,
    SegmentSettings,
)
from reconstruction.scan_result import ScanResult
from reconstruction.segment import Cluster, Plane
from reconstruction.tsdf import TSDFSettings
from resources.errors import TwinbenchError

_CALLS = ("add", "preview", "table_objects", "finish")
START_TIMEOUT_S = 120.0  # a fresh interpreter imports Open3D: seconds on a loaded machine


def _serve(conn: Any, settings: TSDFSettings) -> None:
    """The worker: one ScanSession, one call per message, until the pipe closes."""
    import os

    os.nice(5)  # background work: the window and the robot link come first
    try:
        sess = ScanSession(settings)
        conn.send(("ready",))
        while True:
            name, args, kw = conn.recv()
            if name == "close":
                return
            try:
                if name == "finish":
                    kw["progress"] = lambda f, text: conn.send(("progress", f, text))
                out = getattr(sess, name)(*args, **kw)
                if name == "add":
                    out = (out, sess.last_pose, sess.frames_integrated, sess.skipped)
                conn.send(("ok", out))
            except Exception as exc:  # any failure goes back to the caller, by name
                conn.send(("error", _portable(exc)))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        return


def _portable(exc: Exception) -> Exception:
    """`exc` if it survives pickling with its message, else a ReconstructionError saying it."""
    import pickle

    try:
        back = pickle.loads(pickle.dumps(exc))
        if str(back) == str(exc):
            return exc
    except Exception:  # an exception class that cannot be rebuilt from its args
        pass
    return ReconstructionError(f"{type(exc).__name__}: {exc}")


class ScanProcess:
    """The calls of a posed `ScanSession` that a scan makes, served by a worker process.
    Close it (or use it as a context manager): the worker also ends when this process does."""

    track = False

    def __init__(self, settings: TSDFSettings | None = None) -> None:
        self.settings = settings or TSDFSettings()
        self.last_pose: NDArray[np.float64] | None = None
        self.frames_integrated = 0
        self.skipped: dict[int, str] = {}
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, self.settings), daemon=True, name="twinbench-scan"
        )
        self._proc.start()
        child.close()
        self._ready = False

    # --- the session's calls ----------------------------------------------------------------
    def add(self, frame: RGBDFrame, T_base_camera: NDArray[np.float64] | None = None) -> bool:
        ok, self.last_pose, self.frames_integrated, self.skipped = self._call(
            "add", frame, T_base_camera
        )
        return bool(ok)

    def preview(self, max_points: int = PREVIEW_POINTS) -> Preview:
        out: Preview = self._call("preview", max_points)
        return out

    def table_objects(
        self, seed: int = 0, exclude: list[Box] | None = None
    ) -> tuple[Plane, list[Cluster]]:
        out: tuple[Plane, list[Cluster]] = self._call("table_objects", seed, exclude)
        return out

    def finish(
        self,
        seg: SegmentSettings | None = None,
        T_base_camera: NDArray[np.float64] | None = None,
        calibration: dict[str, Any] | None = None,
        progress: Callable[[float, str], None] | None = None,
    ) -> ScanResult:
        out: ScanResult = self._call("finish", seg, T_base_camera, calibration, progress=progress)
        return out

    # --- the worker ---------------------------------------------------------------------------
    def _call(self, name: str, *args: Any, progress: Any = None) -> Any:
        assert name in _CALLS
        if not self._ready:
            self._ready = self._receive(START_TIMEOUT_S, None)[0] == "ready"
        try:
            self._conn.send((name, args, {}))
        except (BrokenPipeError, OSError):
            raise self._died(name) from None
        while True:
            msg = self._receive(None, name)
            if msg[0] == "progress":
                if progress is not None:
                    progress(msg[1], msg[2])
                continue
            if msg[0] == "error":
                err = msg[1]
                raise (
                    err
                    if isinstance(err, TwinbenchError)
                    else ReconstructionError(
                        f"the scan worker failed in {name}: {type(err).__name__}: {err}"
                    )
                ) from err
            return msg[1]

    def _receive(self, timeout: float | None, name: str | None) -> tuple[Any, ...]:
        """The worker's next message, waiting while it lives (at most `timeout` s)."""
        t0 = time.monotonic()
        while not self._conn.poll(0.25):
            if not self._proc.is_alive():
                raise self._died(name or "start")
            if timeout is not None and time.monotonic() - t0 > timeout:
                self.close()
                raise ReconstructionError(
                    f"the scan worker process did not start in {timeout:.0f} s"
                )
        try:
            msg: tuple[Any, ...] = self._conn.recv()
        except (EOFError, OSError):
            raise self._died(name or "start") from None
        return msg

    def _died(self, name: str) -> ReconstructionError:
        self._proc.join(2.0)
        code = self._proc.exitcode
        self.close()
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else (f"exited with code {code}")
        )
        return ReconstructionError(
            f"the scan worker process {how} during {name} (out of memory, or a crash in "
            "Open3D); the frames recorded so far are kept in the recording if one was made"
        )

    def close(self) -> None:
        """End the worker (what it fused is gone; a finished scan's result is already here)."""
        if self._proc.is_alive():
            try:
                self._conn.send(("close", (), {}))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(5.0)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(2.0)
        self._conn.close()

    def __enter__(self) -> ScanProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
