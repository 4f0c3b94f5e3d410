"""Object fit from pushes (app/workflows/object_fit.py): pushes of the cylinder made by the
demo twin at known mass and friction, seen as a tracker would see them (1 mm noise, no
spin), are fitted back from the nominal values; a held-out push is then predicted better."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.workflows.object_fit import ObjectFitError, fit_object, pose_rmse, push_part, upright
from devices.poses import POSE_UNIT, drop_spin
from devices.trajectory import Trajectory
from twins.executor import LocalExecutor
from twins.fit.design import robot_info_for, simulate_motion, start_pose
from twins.from_scan import build_twin
from twins.pushes import plan_push
from twins.scan_input import procedural_scan
from twins.spec import TwinSpec

CH = "objects/cylinder/pose"
TRUE = {"objects.cylinder.density": 900.0, "objects.cylinder.friction": 0.8}
BOUNDS = {"objects.cylinder.density": (200.0, 2500.0), "objects.cylinder.friction": (0.2, 1.5)}


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> TwinSpec:
    return build_twin(procedural_scan(), Path(tmp_path_factory.mktemp("tw")) / "demo", name="demo")


def _push(spec: TwinSpec, values: dict[str, float], direction: float, seed: int) -> Trajectory:
    """A push of the cylinder recorded in `spec` at `values`, its pose as a tracker gives it."""
    info = replace(
        robot_info_for(spec),
        description="franka_panda/panda.urdf",
        meta={"ee_link": "panda_grasptarget"},
    )
    xy = next(o.pose for o in spec.objects if o.name == "cylinder")[:2]
    m = plan_push(
        info, start_pose(spec, info), target_xy=tuple(xy), direction=direction, speed=0.12,
        distance=0.14, velocity=0.8,
    )  # fmt: skip
    sim = simulate_motion(spec, values, m)
    rng = np.random.default_rng(seed)
    P = np.array([drop_spin(p) for p in sim[CH]])
    P[:, :3] += rng.normal(0.0, 0.001, (len(P), 3))
    keep = ("robot/joint_pos", "robot/joint_vel", "robot/command", CH)
    return Trajectory(
        sim.t,
        {k: (P if k == CH else sim[k]) for k in keep},
        {k: sim.units.get(k, "") for k in keep},
        "real",
        {**dict(sim.meta), "name": f"push {direction:g}", "spinless_objects": ["cylinder"]},
    )


@pytest.mark.slow
@pytest.mark.xfail(
    reason="issue 12: a library push (hand at 3 cm, upright tool) barely shows the cylinder's "
    "friction: on the pushes that stay upright (0, 30, 60 deg) the twin's own pose RMSE at "
    "friction 0.6-0.9 stays within 1.7-3.3 mm (noise 1.7), the -30..-60 deg pushes tip the "
    "cylinder and are chaotic (RMSE 14-90 mm replaying the truth itself); this test passed "
    "only while the -60 deg push's chaos happened to favour 0.8 (with numpy 2.4.6 / scipy "
    "1.17.1 / trimesh 5.2.0 it fits 0.67 inside a 90 % interval of +-0.006, far too narrow "
    "for a jagged loss); upright pushes 0/60 fit 0.65 and predict the held-out push worse "
    "than nominal (3.1 vs 2.9 mm)",
    strict=False,
)
def test_pushes_made_at_known_values_are_fitted_back(twin: TwinSpec) -> None:
    pushes = [_push(twin, TRUE, d, k) for k, d in enumerate((0.0, -60.0, 45.0))]
    nominal = twin.params.nominal()
    assert nominal["objects.cylinder.friction"] != pytest.approx(TRUE["objects.cylinder.friction"])
    with LocalExecutor(2) as ex:
        res = fit_object(twin, pushes[:2], "cylinder", budget=40, executor=ex, bounds=BOUNDS)
    est = res.estimate
    assert set(est) == set(TRUE)
    assert est["objects.cylinder.friction"] == pytest.approx(0.8, rel=0.1)
    # mass shows only weakly in a slow push (the pusher's force, not the path): loosely
    assert est["objects.cylinder.density"] == pytest.approx(900.0, rel=0.35)
    lo, hi = res.posterior.interval90["objects.cylinder.friction"]
    assert lo <= est["objects.cylinder.friction"] <= hi
    # the held-out push: the fitted twin predicts the object's path better than nominal
    before = pose_rmse(twin, None, pushes[2], "cylinder")
    after = pose_rmse(twin, est, pushes[2], "cylinder")
    assert after < 0.5 * before
    assert after < 0.004  # m: the tracker's noise and what mass leaves undetermined


def test_a_push_that_misses_is_named(twin: TwinSpec) -> None:
    t = np.linspace(0.0, 1.0, 51)
    pose = np.tile([0.48, 0.2, 0.045, 0, 0, 0, 1.0], (51, 1))
    traj = Trajectory(t, {CH: pose}, {CH: POSE_UNIT}, "real", {"name": "missed"})
    with pytest.raises(ObjectFitError, match="missed.*did not move"):
        push_part(traj, "cylinder")


def test_upright_drops_the_trackers_tilt_noise_but_keeps_a_real_tip() -> None:
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng(3)
    t = np.linspace(0.0, 2.0, 61)
    noisy = Rotation.from_rotvec(rng.normal(0.0, np.radians(0.8), (61, 3))).as_quat()
    P = np.column_stack([0.48 + 0.05 * t, np.full(61, 0.2), np.full(61, 0.045), noisy])
    meta = {"name": "tilt", "spinless_objects": ["cylinder"]}
    traj = Trajectory(t, {CH: P}, {CH: POSE_UNIT}, "real", meta)
    up = upright(traj, "cylinder", [0.48, 0.2, 0.045, 0.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(up[CH][:, 3:], np.tile([0.0, 0.0, 0.0, 1.0], (61, 1)), atol=1e-12)
    np.testing.assert_array_equal(up[CH][:, :3], P[:, :3])  # the path is the measurement
    # a cylinder that really tipped (25 deg) keeps what the camera saw
    tipped = P.copy()
    tipped[40:, 3:] = Rotation.from_rotvec([np.radians(25.0), 0.0, 0.0]).as_quat()
    kept = upright(traj.with_channels(channels={CH: tipped}), "cylinder", [0, 0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(kept[CH], tipped)
    # an object whose spin the camera sees (not spinless) is left alone
    other = upright(traj.with_channels(meta={"name": "box"}), "cylinder", [0, 0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(other[CH], P)
