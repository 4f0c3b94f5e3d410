"""Digital twin: TwinSpec, parameters, PyBullet builder, simulate/replay, fitting.

params.py (Param, ParamSet) · spec.py (TwinSpec and parts) · serialize.py (JSON, versioned) ·
make.py (spec factories, default ranges) · urdf.py (read/repair/export URDF) ·
inertia.py · decompose.py (V-HACD hulls) · primitives.py (box/cylinder recognition) ·
scan_input.py + from_scan.py (scan -> twin folder) · builder.py (TwinWorld, read-back,
deterministic reset) · actuators.py (servo, PD, torque, DC motor) · simulate.py (replay,
rollout) · rigs.py (twins of the real pendulum and Qube) · view.py (meshes and poses for a
3D view) · export.py (URDF export) · baseline.py (bare world for `bench twin`) ·
engine.py (pybullet, loaded quietly) · twin_live lives in app/workflows (the Twin page's
worker thread).
"""
