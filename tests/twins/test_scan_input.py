"""The demo twin's objects come from the lab scene's own description, so they cannot drift
from what the lab simulates (they did: U-block 0.10 x 0.07 m vs the lab's 0.12 x 0.09 m)."""

from __future__ import annotations

import numpy as np
import pytest
import trimesh

from devices.poses import pose_to_matrix
from twins.errors import TwinError
from twins.scan_input import lab_scene_objects, procedural_scan


def test_demo_objects_are_the_lab_scene_objects() -> None:
    from devices.lab.scenes import panda_table_config
    from devices.lab.truth import truth_meshes

    truth = {k: m for k, m in truth_meshes(panda_table_config()).items() if k != "table"}
    demo = {o.name: o for o in procedural_scan().objects}
    assert set(demo) == set(truth)
    for name, o in demo.items():
        placed = o.mesh.copy()
        placed.apply_transform(pose_to_matrix(o.pose))
        assert np.allclose(placed.bounds, truth[name].bounds, atol=1e-6), name
        assert placed.volume == pytest.approx(truth[name].volume, rel=0.01), name
    assert sorted(demo["u_block"].mesh.extents) == pytest.approx([0.05, 0.09, 0.12], abs=1e-9)


def test_unknown_scene_names_the_file() -> None:
    with pytest.raises(TwinError, match=r"no_such_scene\.json"):
        lab_scene_objects("no_such_scene")


def test_meshes_are_closed_and_upright() -> None:
    for o in lab_scene_objects():
        assert isinstance(o.mesh, trimesh.Trimesh) and o.mesh.is_watertight, o.name
        assert pose_to_matrix(o.pose)[2, 2] == pytest.approx(1.0)
