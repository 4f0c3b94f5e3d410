from __future__ import annotations

import os

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(scope="module")
def lab_frames():  # type: ignore[no-untyped-def]
    """Three 640x480 frames from the lab's fixed camera (real MuJoCo rendering + noise)."""
    from devices.lab.camera import LabCamera
    from devices.lab.sim import LabSim

    sim = LabSim("panda_table")
    with LabCamera(sim, "fixed", 640, 480) as cam:
        return [cam.grab() for _ in range(3)]
