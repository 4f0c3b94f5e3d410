"""The virtual lab as a driver for the agent's entry point (`python -m devices.robots.agent.serve
--driver lab`, `python main.py lab serve`): its workspace box and its cameras, each rendered
in a child process beside the lab so rendering never holds the lab's GIL. MuJoCo is imported
only inside the functions (devices.lab), never by this module at import.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devices.errors import DeviceError
from devices.frames import RGBDFrame
from devices.robots.agent.server import CameraFeed
from devices.robots.wire import protocol as P

# Where the end effector may go in the panda_table scene when the lab does not say: above the
# table top, within its extent (base frame, m).
LAB_WORKSPACE = {"lower": (-0.3, -0.65, 0.0), "upper": (1.0, 0.65, 1.3)}


def _camera_worker(
    conn: Any, scene: str, config: Path | None, name: str, width: int, height: int
) -> None:
    """Child process: render camera `name` at the joint state the parent sends each time.

    Rendering and depth noise run here, beside the lab process, so they never hold the
    lab's GIL while the 250 Hz control loop wants it.
    """
    import os

    os.environ.setdefault("LP_NUM_THREADS", "1")  # one llvmpipe render thread, no bursts
    try:  # started from a SCHED_FIFO thread of `lab serve`: rendering is not real-time work
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    os.nice(5)  # control and physics come first
    import msgpack
    import numpy as np

    # MuJoCo + trimesh (~1 s): only in the spawned camera process
    from devices.lab.camera import LabCamera
    from devices.lab.sim import LabSim

    class Latest:  # what LabCamera reads the scene state from: the parent's snapshot
        def __init__(self, sim: LabSim) -> None:
            self.sim, self.latest = sim, (sim.time, sim.data.qpos.copy())

        def snapshot(self) -> tuple[float, Any]:
            return self.latest

    cam = None
    try:
        src = Latest(LabSim(scene, config))
        cam = LabCamera(src, name, width, height)
        while True:
            req = conn.recv_bytes()
            if not req:
                break
            t, q = msgpack.unpackb(req)
            src.latest = (float(t), np.frombuffer(q, dtype=np.float64).copy())
            conn.send_bytes(b"F" + P.pack(P.frame_to_message(cam.grab(), name))[4:])
    except (EOFError, OSError, KeyboardInterrupt):
        pass
    except Exception as exc:  # sent to the parent, which reports it to clients
        conn.send_bytes(b"E" + f"{type(exc).__name__}: {exc}".encode())
    finally:
        if cam is not None:
            cam.close()


def camera_feed(
    driver: Any, scene: str, config: Path | None, name: str, width: int, height: int, fps: float
) -> CameraFeed:
    """A paced frame iterator factory for one lab camera, rendered in a child process."""

    def frames() -> Iterator[RGBDFrame]:
        import msgpack

        ctx = multiprocessing.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(
            target=_camera_worker,
            name=f"lab-camera-{name}",
            daemon=True,
            args=(child, scene, config, name, width, height),
        )
        proc.start()
        child.close()
        try:
            period, t0, k = 1.0 / fps, time.perf_counter(), 0
            while True:
                t, qpos = driver.snapshot()
                conn.send_bytes(msgpack.packb([t, qpos.tobytes()]))
                if not conn.poll(60.0 if k == 0 else 5.0):
                    raise DeviceError(f"lab camera {name}: renderer process did not answer")
                data = conn.recv_bytes()
                if data[:1] != b"F":
                    raise DeviceError(f"lab camera {name}: {data[1:].decode(errors='replace')}")
                yield P.frame_from_message(P.unpack_body(data[1:]))
                if k == 0:
                    t0 = time.perf_counter()  # pace from the first frame (renderer start-up)
                k += 1
                due = t0 + k * period
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                elif now - due > 5 * period:
                    t0, k = now, 1
        finally:
            try:
                conn.send_bytes(b"")
            except OSError:
                pass
            proc.join(3.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            conn.close()

    return frames


def lab_cameras(
    driver: Any, scene: str, config: Path | None, size: str, fps: float
) -> dict[str, CameraFeed]:
    """One paced feed per lab camera at `size` ('WxH', a resolution the lab renders)."""
    try:
        w, h = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise DeviceError(f"--camera-size {size!r}: expected WxH, e.g. 424x240") from None
    # MuJoCo (~1 s): registry.py imports this module whichever driver is served
    from devices.lab.camera import RESOLUTIONS

    if (w, h) not in RESOLUTIONS:
        raise DeviceError(
            f"--camera-size {w}x{h}: the lab cameras render "
            f"{', '.join(f'{a}x{b}' for a, b in RESOLUTIONS)}"
        )
    return {
        name: camera_feed(driver, scene, config, name, w, h, fps) for name in driver.info().cameras
    }
