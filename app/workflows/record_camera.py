"""The camera side of a recording: frames streamed by the robot protocol written to a `.db3`
(the SDK's own recorder, devices/cameras/software.py) while a motion plays, and the frame
index at every robot state, so object poses can be tracked from the depth stream afterwards
(reconstruction/object_tracks.py) and every sample points at its frame.

    with CameraCapture(client, "fixed", folder / "camera.db3") as cap:
        ... play the motion ...
    index = cap.frame_index(traj.t)       # (T,) newest frame at or before each sample, -1 before
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.cameras.software import DB3Writer
from devices.errors import DeviceError
from devices.robots.client import RobotClient
from resources.errors import TwinbenchError

log = logging.getLogger(__name__)

PRIME_FRAMES = 3  # frames that must have arrived before the motion starts
PRIME_TIMEOUT_S = 20.0


class CameraCapture:
    """A thread that writes camera `camera`'s frames to `path` until `stop()`."""

    def __init__(self, client: RobotClient, camera: str, path: Path, fps: int = 15) -> None:
        if camera not in getattr(client, "cameras", []):
            raise DeviceError(
                f"robot at {client.address} has no camera '{camera}' "
                f"(cameras: {', '.join(getattr(client, 'cameras', [])) or 'none'})"
            )
        self.client, self.camera, self.path, self.fps = client, camera, Path(path), fps
        self.timestamps: list[float] = []
        self.indices: list[int] = []
        self.error: str = ""
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"record-{camera}", daemon=True)

    def __enter__(self) -> CameraCapture:
        """Start, and return once frames flow (a renderer or sensor may take seconds to
        deliver its second frame; the motion should not start before)."""
        self._thread.start()
        self._started.wait(timeout=PRIME_TIMEOUT_S)
        if self.error:
            raise DeviceError(f"camera '{self.camera}' at {self.client.address}: {self.error}")
        if len(self.timestamps) < PRIME_FRAMES:
            self.stop()
            raise DeviceError(
                f"camera '{self.camera}' at {self.client.address}: fewer than {PRIME_FRAMES} "
                f"frames in {PRIME_TIMEOUT_S:.0f} s; is it streaming?"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        frames = self.client.camera_frames(self.camera, timeout_s=PRIME_TIMEOUT_S / 2)
        try:
            with DB3Writer(self.path, fps=self.fps) as writer:
                for f in frames:
                    if self._stop.is_set():
                        break
                    writer.write(f)
                    self.timestamps.append(float(f.timestamp))
                    self.indices.append(int(f.index))
                    if len(self.timestamps) >= PRIME_FRAMES:
                        self._started.set()
        except (TwinbenchError, RuntimeError, OSError) as exc:
            self.error = str(exc)
            log.warning("camera %s: recording stopped: %s", self.camera, exc)
        finally:
            self._started.set()
            frames.close()

    def stop(self) -> None:
        """Stop writing and wait for the file to be closed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15.0)

    def frame_index(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        """Position (0-based, in the written file) of the newest frame at or before each
        time in `t` (robot clock); -1 before the first frame."""
        ts = np.asarray(self.timestamps, float)
        return (np.searchsorted(ts, np.asarray(t, float), side="right") - 1).astype(float)

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        """What the meta of a recording spanning robot times [t0, t1] says of its frames."""
        ts = np.asarray(self.timestamps, float)
        inside = ts[(ts >= t0) & (ts <= t1)]
        rate = float(len(inside) / (t1 - t0)) if t1 > t0 else 0.0
        gaps = int(np.sum(np.diff(self.indices) - 1)) if len(self.indices) > 1 else 0
        return {
            "camera": self.camera,
            "camera_recording": self.path.name,
            "camera_frames": len(ts),
            "camera_frames_in_recording": len(inside),
            "camera_rate_hz": rate,
            "camera_dropped_frames": gaps,
            **({"camera_error": self.error} if self.error else {}),
        }
