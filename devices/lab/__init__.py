"""The virtual lab: MuJoCo "reality" standing in for a robot and cameras (DESIGN §6).

The only package that imports mujoco. Public API:

    from devices.lab.driver import make_driver, LabDriver   # real-time RobotDriver
    from devices.lab.sim import LabSim                      # deterministic, no threads
    from devices.lab.scenes import SCENES, build_model      # registry of scenes
    from devices.lab.config import LabConfig, LabError      # the hidden truth (JSON)
    from devices.lab.camera import LabCamera, d435_intrinsics
    from devices.lab.truth import truth_meshes, truth_camera_pose   # benchmarks only

    drv = make_driver("panda_table", config_path=None)      # started, default truth
    cam = drv.camera("fixed", 424, 240)                     # or "wrist"
    frame = cam.grab()                                      # devices.frames.RGBDFrame
    drv.write_command("position", q); drv.read_state(); drv.realtime_factor()
    drv.close()

Scenes: "panda_table" (7-DoF Panda, closed gripper as pusher, box + cylinder + U-block,
cameras "fixed" and "wrist"), "pendulum" (torque-driven), "objects_table" (objects only).
World frame = robot base frame; table top at z = 0. Default configs are also saved as
resources/lab/<scene>.json.

Truth (masses, friction, gains, latency, noise, camera poses) is read only from the config
file; `LabDriver.info()` and states never carry it.
"""

import os as _os

# MuJoCo picks its GL backend when first imported; headless rendering needs EGL.
_os.environ.setdefault("MUJOCO_GL", "egl")
