"""The robot's surface as points, placed by forward kinematics: what the object tracker
masks out of the camera's depth so the robot, which hides objects, is not mistaken for one.

    with RobotSurface("franka_panda/panda.urdf", joint_names) as surface:
        pts = surface.points(joint_pos)      # (N, 3) base frame

The URDF's visual meshes (and boxes, cylinders, spheres) are sampled once; each call places
them at the given joint positions (`twins/kinematics.RobotKinematics`). It satisfies
`reconstruction.object_track_types.RobotMask`, which the tracking jobs
(reconstruction/track_objects.py) and the deploy-time pose feeder
(reconstruction/pose_feeder.py) take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import trimesh
from numpy.typing import NDArray

from reconstruction.track_objects import TrackError
from twins.kinematics import RobotKinematics, description_path
from twins.urdf import visuals


def _mesh_of(v: Any) -> trimesh.Trimesh | None:
    if v.kind == "mesh":
        if v.mesh is None:
            return None
        m = trimesh.load(v.mesh, force="mesh", process=False)
        if not isinstance(m, trimesh.Trimesh) or not len(m.faces):
            return None
        return trimesh.Trimesh(m.vertices * np.asarray(v.scale), m.faces, process=False)
    if v.kind == "box":
        return trimesh.creation.box(v.size)
    if v.kind == "cylinder":
        return trimesh.creation.cylinder(v.size[0], v.size[1])
    if v.kind == "sphere":
        return trimesh.creation.icosphere(2, v.size[0])
    return None


class RobotSurface:
    """Points on a URDF robot's visual surface, placed by forward kinematics."""

    def __init__(
        self, description: str, joint_names: Sequence[str], points_per_link: int = 400
    ) -> None:
        path = description_path(description)
        self.kin = RobotKinematics(path, joint_names)
        parts: dict[str, list[NDArray[np.float64]]] = {}
        for k, v in enumerate(visuals(path)):
            mesh = _mesh_of(v)
            if mesh is None:
                continue
            pts, _ = trimesh.sample.sample_surface(mesh, points_per_link, seed=k)
            T = v.origin
            parts.setdefault(v.link, []).append(np.asarray(pts) @ T[:3, :3].T + T[:3, 3])
        if not parts:
            self.kin.close()
            raise TrackError(f"robot description '{description}': no visual geometry to mask")
        self.parts = {link: np.vstack(p) for link, p in parts.items()}

    def points(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64]:
        """(N, 3) base-frame points on the robot at `joint_pos`."""
        out = []
        for link, P in self.parts.items():
            T = self.kin.link_pose(link, joint_pos)
            out.append(P @ T[:3, :3].T + T[:3, 3])
        return np.vstack(out)

    def close(self) -> None:
        self.kin.close()

    def __enter__(self) -> RobotSurface:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
