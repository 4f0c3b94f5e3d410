"""What the Scan page shows while a scan runs: the job wrapped so the page can pause it and
read its newest partial result (`Live`, shared by the worker thread and the GUI timer), and
the colour / depth previews as images."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from PySide6 import QtGui

from resources.jobs import Job, Progress


def qimage(rgb: np.ndarray) -> QtGui.QImage:
    a = np.ascontiguousarray(rgb)
    h, w = a.shape[:2]
    return QtGui.QImage(a.data, w, h, 3 * w, QtGui.QImage.Format.Format_RGB888).copy()


def depth_colormap(depth_m: np.ndarray, near: float = 0.2, far: float = 1.2) -> np.ndarray:
    """Depth (m) -> RGB (near warm, far cool, no data black)."""
    t = np.clip((depth_m - near) / (far - near), 0, 1)
    rgb = np.stack([255 * (1 - t), 255 * (1 - np.abs(2 * t - 1)), 255 * t], -1).astype(np.uint8)
    rgb[depth_m <= 0] = 0
    return rgb


class Live:
    """Shared between the worker thread (writes) and the GUI timer (reads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.partial: dict[str, Any] = {}
        self.message = ""
        self.fraction: float | None = None
        self.resume = threading.Event()
        self.resume.set()
        self.stop = threading.Event()
        self.updates = 0

    def wrap(self, job: Job[Any]) -> Job[Any]:
        try:
            while True:
                self.resume.wait()
                rec = next(job)
                with self.lock:
                    if isinstance(rec.partial, dict):
                        self.partial.update(rec.partial)
                    self.message, self.fraction = rec.message, rec.fraction
                yield Progress(rec.fraction, rec.message)
        except StopIteration as stop:
            return stop.value
        finally:
            job.close()

    def take(self) -> tuple[dict[str, Any], str, float | None]:
        with self.lock:
            p, self.partial = self.partial, {}
            return p, self.message, self.fraction
