"""The virtual lab: MuJoCo "reality" standing in for a robot and cameras (docs/ARCHITECTURE.md §8).

The only package that imports mujoco. Public API (import from the submodules):

    from devices.lab.driver import make_driver, LabDriver   # real-time RobotDriver
    from devices.lab.sim import LabSim                      # deterministic, no threads
    from devices.lab.scenes import SCENES, build_model, default_config_path
    from devices.lab.config import LabConfig, LabError      # the hidden truth (JSON)
    from devices.lab.camera import LabCamera, d435_intrinsics
    from devices.lab.board import charuco_board             # cv2 board of a BoardConfig
    from devices.lab.randomize import randomized_config     # new unseen truths
    from devices.lab.truth import truth_meshes, truth_camera_pose   # benchmarks only

    drv = make_driver("panda_table", config_path=None)      # started, default truth
    drv.write_command("position", q); s = drv.read_state(); drv.realtime_factor()
    T_base_hand = drv.body_pose("panda_hand", s.joint_pos)  # nominal kinematics
    cam = drv.camera("fixed", 424, 240)                     # or "wrist"; 640x480 too
    cam.set_pose(T_world_camera)                            # optional: handheld camera
    frame = cam.grab()                                      # devices.frames.RGBDFrame
    cam.close(); drv.close()                                # close() holds the arm

Scenes: "panda_table" (7-DoF Panda, closed gripper = pusher; box, cylinder, U-block;
cameras "fixed" and "wrist"), "panda_calib" (same robot, cameras and truth, a ChArUco
board instead of objects), "pendulum" (torque-driven), "objects_table" (objects only).
Default truths are also files: resources/lab/<scene>.json.

Conventions: world frame = robot base frame, table top at z = 0; lab clock = simulated
seconds since start (states and frames share it); camera poses in OpenCV axes. Frames
carry `T_world_camera = None` (a real camera does not know its pose): use calibration, or
measured joints + `body_pose` + a hand-eye estimate; `info().meta` holds the wrist
camera's NOMINAL (CAD) mount pose. Truth (masses, friction, restitution, COM offsets,
joint damping/friction/armature, PD gains and force limits, latency, sensor noise, true
camera poses, board pose) is read only from the config file; `info()` and states never
carry it.
"""

import os as _os

# MuJoCo picks its GL backend when first imported; headless rendering needs EGL.
_os.environ.setdefault("MUJOCO_GL", "egl")
