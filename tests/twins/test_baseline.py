"""The bare comparison world of the twin benchmark is the same physics as the twin."""

from __future__ import annotations

import numpy as np
import pytest

from benches.baseline import BareWorld
from devices.trajectory import Trajectory
from twins.builder import TwinWorld
from twins.simulate import replay_in
from twins.spec import TwinSpec


def test_bare_world_with_twin_settings_tracks_the_twin(demo_twin: TwinSpec) -> None:
    t = np.arange(0.0, 1.0 + 1e-9, 0.01)
    q0 = np.asarray(demo_twin.robot.initial_joint_pos)  # type: ignore[union-attr]
    cmd = q0 + 0.25 * np.sin(2 * np.pi * 0.4 * t)[:, None] * (np.arange(len(q0)) < 7)
    real = Trajectory(t, {"robot/command": cmd}, {"robot/command": "rad"})
    with TwinWorld(demo_twin) as w:
        twin = replay_in(w, real)["robot/joint_pos"]
    bare = BareWorld(demo_twin, "twin")
    try:
        got = bare.replay(t, cmd)
    finally:
        bare.close()
    # same bodies, servo gains and limits; the twin adds joint damping and armature
    # (measured 1.6e-3 rad); the commanded motion itself is 0.25 rad
    assert np.abs(got - twin).max() < 4e-3


def test_bare_world_settings_are_checked(demo_twin: TwinSpec) -> None:
    with pytest.raises(ValueError, match="'twin' or 'default'"):
        BareWorld(demo_twin, "fast")
