"""Lab cameras: RealSense-D435-like colour + aligned depth rendered by MuJoCo (EGL).

`LabCamera(source, name, width, height)` renders camera `name` of the source's scene (a
`LabDriver` in real time, or a `LabSim`) and returns `RGBDFrame`s: RGB uint8, depth uint16
with depth_scale 0.001 aligned to colour (both share `intrinsics`), timestamp = lab clock.
Intrinsics follow the D435 colour sensor: fx = fy = 920 px * height / 720 (613 px at
640x480, 307 px at 424x240), principal point at the image centre.

Depth carries the D435 error model of devices/lab/depth_noise.py (sigma uses this frame's
focal length, so lower resolutions are noisier, as on the real sensor).

Pose: `RGBDFrame.T_world_camera` is left None, for the fixed and the wrist camera alike —
a real camera does not know where it is. Downstream code gets it from calibration (fixed)
or from measured joints, forward kinematics and a hand-eye estimate (wrist). The truth
(OpenCV convention, world = robot base) is for benchmarks only: `LabCamera.truth_pose()`
(at the last grab) or `devices.lab.truth.truth_camera_pose(config, name, joint_pos)`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import mujoco
import numpy as np
from numpy.typing import NDArray

from devices.frames import Intrinsics, RGBDFrame
from devices.lab.config import CameraConfig, LabConfig, LabError
from devices.lab.depth_noise import apply_depth_noise
from devices.lab.parts import R_CV_MJ

RESOLUTIONS = ((424, 240), (640, 480), (848, 480), (1280, 720))
DEPTH_SCALE = 0.001


def d435_intrinsics(width: int, height: int, focal_px_720: float = 920.0) -> Intrinsics:
    """Colour intrinsics of a D435 at a supported resolution (square pixels, centred)."""
    if (width, height) not in RESOLUTIONS:
        raise LabError(
            f"lab camera: resolution {width}x{height} not supported (use one of {RESOLUTIONS})"
        )
    f = focal_px_720 * height / 720.0
    return Intrinsics(width, height, f, f, (width - 1) / 2.0, (height - 1) / 2.0)


class LabCamera:
    """Renders one lab camera. `grab()` is thread-safe and may be called from any thread:
    the EGL context is made current only for the duration of each render.

    `source` is a LabDriver, a LabSim, or any object with `.sim` (a LabSim) and
    `snapshot() -> (lab time, qpos)`: the scene state to render.
    """

    def __init__(
        self,
        source: object,
        name: str,
        width: int = 640,
        height: int = 480,
        seed: int | None = None,
    ) -> None:
        sim: Any = getattr(source, "sim", source)  # LabDriver -> its LabSim
        self._source = source
        self.config: LabConfig = sim.config
        self.cam: CameraConfig = self.config.camera(name)
        self.name = name
        self.intrinsics = d435_intrinsics(width, height, self.cam.focal_px_720)
        self._model: mujoco.MjModel = sim.model
        self._data = mujoco.MjData(self._model)
        self._cam_id = self._model.camera(name).id
        self._rng = np.random.default_rng(self.config.seed + 1000 if seed is None else seed)
        self._lock = threading.Lock()
        self._gl: object | None = None
        self._ctx: mujoco.MjrContext | None = None
        self._scene = mujoco.MjvScene(self._model, maxgeom=2000)
        self._opt = mujoco.MjvOption()
        self._vcam = mujoco.MjvCamera()
        self._vcam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._vcam.fixedcamid = self._cam_id
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._rgb = np.empty((height, width, 3), np.uint8)
        self._zbuf = np.empty((height, width), np.float32)
        self._index = 0
        self._truth = np.eye(4)
        self._override: NDArray[np.float64] | None = None

    def set_pose(self, T_world_camera: NDArray[np.float64] | None) -> None:
        """Hold this camera somewhere else (a handheld camera; OpenCV axes, world frame),
        or None to put it back on its mount. The pose is truth: frames still carry None."""
        with self._lock:
            if T_world_camera is None:
                if self._override is not None:
                    # MuJoCo (sleep enabled) computes static cameras once per MjData: start
                    # from fresh data so the mount pose is recomputed.
                    self._data = mujoco.MjData(self._model)
                self._override = None
            else:
                self._override = np.array(T_world_camera, dtype=float)

    def _snapshot(self) -> tuple[float, NDArray[np.float64]]:
        snap = getattr(self._source, "snapshot", None)
        if snap is not None:
            return snap()  # type: ignore[no-any-return]
        sim = self._source
        return float(sim.time), sim.data.qpos.copy()  # type: ignore[attr-defined]

    def _ensure_gl(self) -> None:
        if self._ctx is not None:
            return
        try:
            self._gl = mujoco.GLContext(1280, 720)
            with self._current():
                self._ctx = mujoco.MjrContext(self._model, mujoco.mjtFontScale.mjFONTSCALE_100)
                mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._ctx)
        except Exception as exc:  # EGL/GL failures come as many types
            raise LabError(
                f"lab camera {self.name!r}: cannot create an offscreen GL context "
                f"({exc}); headless machines need MUJOCO_GL=egl and libegl1 + "
                "libgl1-mesa-dri"
            ) from exc
        self._ctx.readDepthMap = mujoco.mjtDepthMap.mjDEPTH_ZEROFAR

    def _current(self) -> contextlib.AbstractContextManager[object]:
        """Make the GL context current for a block and release it after, so any thread
        (one at a time, under self._lock) may render next."""
        as_current = getattr(self._gl, "as_current", None)
        if as_current is not None:
            return as_current()  # type: ignore[no-any-return]
        self._gl.make_current()  # type: ignore[union-attr]
        return contextlib.nullcontext()

    def render_true(self) -> tuple[float, NDArray[np.uint8], NDArray[np.float32]]:
        """(lab time, RGB, perfect z-depth in m with 0 where nothing was hit)."""
        t, qpos = self._snapshot()
        with self._lock:
            self._ensure_gl()
            d = self._data
            d.qpos[:] = qpos
            mujoco.mj_kinematics(self._model, d)
            mujoco.mj_camlight(self._model, d)
            if self._override is not None:
                d.cam_xpos[self._cam_id] = self._override[:3, 3]
                d.cam_xmat[self._cam_id] = (self._override[:3, :3] @ R_CV_MJ).ravel()
            T = np.eye(4)
            T[:3, :3] = d.cam_xmat[self._cam_id].reshape(3, 3) @ R_CV_MJ
            T[:3, 3] = d.cam_xpos[self._cam_id]
            self._truth = T
            mujoco.mjv_updateScene(
                self._model, d, self._opt, None, self._vcam, mujoco.mjtCatBit.mjCAT_ALL, self._scene
            )
            with self._current():
                mujoco.mjr_render(self._rect, self._scene, self._ctx)
                mujoco.mjr_readPixels(self._rgb, self._zbuf, self._rect, self._ctx)
            rgb = np.flipud(self._rgb).copy()
            zb = np.flipud(self._zbuf).astype(np.float64)
        ext = self._model.stat.extent
        near, far = self._model.vis.map.znear * ext, self._model.vis.map.zfar * ext
        # Same linearisation as mujoco.Renderer for mjDEPTH_ZEROFAR.
        c = -0.5 * (-(far + near) / (far - near)) - 0.5
        dd = -0.5 * (-(2 * far * near) / (far - near))
        z = (dd / (zb + c)).astype(np.float32)
        z[(z >= far * 0.999) | ~np.isfinite(z)] = 0
        return t, rgb, z

    def grab(self) -> RGBDFrame:
        """Render the scene now and return one noisy RGBDFrame."""
        t, rgb, z = self.render_true()
        c = self.cam
        depth = apply_depth_noise(
            z,
            self.intrinsics.fx,
            self._rng,
            subpixel=c.subpixel,
            baseline=c.baseline_m,
            min_depth=c.min_depth_m,
            max_depth=c.max_depth_m,
            edge_jump=c.edge_jump_m,
            edge_dropout=c.edge_dropout,
            depth_scale=DEPTH_SCALE,
        )
        self._index += 1
        return RGBDFrame(
            color=rgb,
            depth=depth,
            depth_scale=DEPTH_SCALE,
            intrinsics=self.intrinsics,
            timestamp=t,
            index=self._index,
            T_world_camera=None,
            meta={
                "camera": self.name,
                "aligned": True,
                "source": "lab",
                "model": "D435 (simulated)",
            },
        )

    def truth_pose(self) -> NDArray[np.float64]:
        """TRUE T_world_camera (OpenCV axes) at the last grab. Benchmarks/tests only."""
        return self._truth.copy()

    def close(self) -> None:
        with self._lock:
            if self._ctx is not None and self._gl is not None:
                with self._current():
                    self._ctx.free()
                self._gl.free()  # type: ignore[attr-defined]
            self._ctx = None
            self._gl = None

    def __enter__(self) -> LabCamera:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
