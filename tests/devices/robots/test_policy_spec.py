"""The agent reads an uploaded spec with the one PolicySpec (devices/robots/wire/policy_spec.py):
what PROTOCOL.md documents is accepted, every way a spec can be wrong is a DeviceError
(the agent refuses the upload with it) naming the entry, and the observation builder
fills the documented layout."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.robots.wire.policy_spec import (
    TERM_SIZES,
    PolicySpec,
    PolicySpecError,
    build_observation,
)

JOINTS = ("j0", "j1", "j2")
OBJ = {
    "observation": ["joint_pos", "joint_vel", "object_pose", "object_goal"],
    "object": "puck",
    "object_goal": [0.5, 0.1],
}


def _read(d: Any) -> PolicySpec:
    return PolicySpec.from_dict(d, robot_joints=JOINTS)


def test_documented_specs_are_read_for_the_robots_joints() -> None:
    s = _read({})  # every entry has a default
    assert s.observation == ("joint_pos", "joint_vel") and s.joints == JOINTS
    assert (s.action_mode, s.action_type, s.action_scale) == ("position", "absolute", 1.0)
    s = _read({**OBJ, "joints": ["other"], "object_min_quality": 0.5, "target": [9.0]})
    assert s.joints == JOINTS  # the workbench checked the names before the upload
    assert s.target is None  # not observed: not part of the spec
    assert (s.object, s.object_goal, s.object_max_age_s, s.object_min_quality) == (
        "puck",
        (0.5, 0.1),
        0.2,
        0.5,
    )
    assert s.obs_dim == 2 * 3 + TERM_SIZES["object_pose"] + TERM_SIZES["object_goal"] == 15
    # no object term observed: object entries are ignored, as they always were
    s = _read({"object": "puck", "object_max_age_s": 99})
    assert s.object is None and s.object_max_age_s == 0.2


@pytest.mark.parametrize(
    ("d", "message"),
    [
        ("spec", "must be a map"),
        ({"observation": ["joint_pos", "gripper"]}, r"unknown observation term\(s\) \['gripper'\]"),
        ({"observation": []}, "unknown observation term"),
        ({"observation": ["joint_pos", "joint_pos"]}, "listed twice"),
        ({"action": [1]}, "'action' must be a map"),
        ({"action": {"mode": "torque"}}, "action mode 'torque' is not position or velocity"),
        ({"action": {"mode": "velocity", "type": "delta"}}, "action type 'delta' is not valid"),
        ({"action": {"scale": 0.0}}, "action scale must be > 0"),
        ({"observation": ["target"]}, "observes 'target' but 'target' is not 3 numbers"),
        ({"observation": ["target"], "target": [1, 2]}, "'target' is not 3 numbers"),
        ({**OBJ, "object": ""}, "observes an object term but names no 'object'"),
        ({**OBJ, "object_goal": None}, "'object_goal' is not 2 numbers"),
        ({**OBJ, "object_goal": [1.0, float("nan")]}, "'object_goal' is not 2 numbers"),
        ({**OBJ, "object_goal": [1.0]}, "'object_goal' is not 2 numbers"),
        ({**OBJ, "object_max_age_s": 10}, r"'object_max_age_s' must be a number in \[0.005, 5\]"),
        ({**OBJ, "object_max_age_s": True}, "'object_max_age_s' must be a number"),
        ({**OBJ, "object_min_quality": 1.5}, r"'object_min_quality' must be a number in \[0, 1\]"),
    ],
)
def test_bad_specs_are_refused_naming_the_entry(d: Any, message: str) -> None:
    with pytest.raises(DeviceError, match=message) as e:
        _read(d)
    assert isinstance(e.value, PolicySpecError)


def test_values_no_term_uses_are_refused_where_the_wire_would_drop_them() -> None:
    with pytest.raises(PolicySpecError, match=r"\['target'\] given but no observed term"):
        PolicySpec(("joint_pos",), JOINTS, target=(0.0, 0.0, 0.0))
    with pytest.raises(PolicySpecError, match="object"):
        PolicySpec(("joint_pos",), JOINTS, object="puck")


def test_builder_fills_the_terms_in_order() -> None:
    spec = _read({**OBJ, "observation": ["object_goal", "joint_vel", "object_pose", "joint_pos"]})
    pose = np.arange(7.0) / 10
    out = np.full((1, spec.obs_dim), np.nan, np.float32)
    got = build_observation(spec, [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], object_pose=pose, out=out)
    assert got is out
    want = np.concatenate([[0.5, 0.1], [4.0, 5.0, 6.0], pose, [1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(out[0], want.astype(np.float32))
    with pytest.raises(PolicySpecError, match="no value for the observed term 'object_pose'"):
        build_observation(spec, [1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
