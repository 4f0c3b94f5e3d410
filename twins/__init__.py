"""Digital twin: TwinSpec, parameters, PyBullet builder, simulate/replay, fitting.

Spec and build: params.py (Param, ParamSet) · spec.py (TwinSpec and parts, JSON) · make.py
(spec factories, default ranges) · urdf.py (read/repair/export URDF) · inertia.py ·
decompose.py (V-HACD hulls) · primitives.py (box/cylinder recognition) · scan_input.py +
from_scan.py (scan -> twin folder) · builder.py (TwinWorld, read-back, deterministic reset) ·
actuators.py (servo, PD, torque, DC motor) · contacts.py · sleeping.py · rigs.py (twins of
the real pendulum and Qube) · export.py (URDF export) · engine.py (pybullet, loaded quietly).

Simulate: simulate.py (replay, rollout) · world_cache.py · live_replay.py + retune.py (live
tuning) · ghost.py + view.py (poses and meshes for a 3D view) · kinematics.py + chain.py
(forward kinematics) · robot_surface.py (the robot's surface by forward kinematics, masked
out of a camera's depth by the object tracker) · pushes.py (object pushes for the excitation
library) · object_motion.py (free objects in recordings).

Fit: fit/ (`twins.fit`: FitConfig, fit_steps; its search, objective, channels, latency,
posterior, SMC, identifiability and experiment design; see fit/__init__.py) · executor.py
(many rollouts through one interface: fits, training, evaluation).

twin_live lives in app/workflows (the Twin page's worker thread).
"""
