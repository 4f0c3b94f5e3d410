"""What object tracking takes and gives: the scanned object's model, the tracker's settings,
one object's track in one frame and every object's tracks in one frame (poses are
`T_world_object` of the model's own frame), and what masks the robot out of the depth
(`RobotMask`; twins/robot_surface.py's `RobotSurface` is one). The tracker is
`reconstruction.object_tracking`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import trimesh
from numpy.typing import NDArray

from reconstruction.errors import ReconstructionError

Mat4 = NDArray[np.float64]


class ObjectTrackingError(ReconstructionError):
    """Object tracking cannot run (bad model, camera pose or frame); the message says which."""


@dataclass(frozen=True)
class ObjectModel:
    """A scanned object: its mesh in its own frame and its pose at the start (the scan)."""

    name: str
    mesh: trimesh.Trimesh
    T_world_object: Mat4


@dataclass(frozen=True)
class ObjectTrackSettings:
    """Scales in metres. ICP levels run coarse to fine: `voxels[i]` downsamples the frame's
    points, `max_corr[i]` is the correspondence distance."""

    voxels: tuple[float, ...] = (0.008, 0.004, 0.002)
    max_corr: tuple[float, ...] = (0.03, 0.012, 0.005)
    iterations: tuple[int, ...] = (20, 15, 15)
    depth_range: tuple[float, float] = (0.15, 2.5)
    stride: int = 1  # pixel step when lifting depth to points
    table_clearance: float = 0.004
    workspace: tuple[tuple[float, float, float], tuple[float, float, float]] | None = None
    robot_margin: float = 0.012
    crop_margin: float = 0.03  # around the model's bounding sphere at the predicted pose
    model_points: int = 3000
    min_points: int = 30  # observed points an object needs for ICP
    min_support_px: int = 25  # explained pixels for a confident pose
    agree_m: float = 0.006  # depth agreement of a rendered model pixel (plus sensor noise)
    lost_quality: float = 0.4
    confident_quality: float = 0.7  # below it, every guess is tried and the best kept
    min_visible: float = 0.4  # share of the model's front pixels seen; less lowers quality
    accept_quality: float = 0.6  # a re-detection must reach this
    search_radius: float = 0.2  # local re-detection around the last seen pose
    redetect_voxel: float = 0.005
    seed: int = 0


@dataclass(frozen=True)
class ObjectTrack:
    """One object in one frame. `T_world_object` is None until the object was ever found;
    when lost it holds the last good pose. `method`: track | hold | redetect | lost."""

    T_world_object: Mat4 | None
    quality: float
    lost: bool
    rmse: float = float("nan")
    support_px: int = 0
    method: str = "track"


@dataclass(frozen=True)
class FrameTracks:
    """Every object's track in one frame, with the frame's time and number."""

    timestamp: float
    index: int
    objects: dict[str, ObjectTrack]


class RobotMask(Protocol):
    """Points on the robot's surface at given joint positions (base frame), masked out of
    the depth so the robot is not mistaken for an object (twins/robot_surface.py)."""

    def points(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64]: ...

    def close(self) -> None: ...
