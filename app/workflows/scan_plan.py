"""Where a guided scan and calibration of a connected robot look, and how they move: the one
home of these numbers (workspace centre, board centre, exclusion box, orbits, second pass,
settling), used by app/workflows/scan_robot.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from reconstruction.scan_path import orbit_targets
from resources.errors import TwinbenchError

# --- where to look (robot base frame, m): the one home of these numbers ----------------------
WORKSPACE_CENTRE = (0.57, 0.0, 0.03)  # centre of the tabletop workspace the orbit looks at
BOARD_CENTRE = (0.435, 0.0, 0.0)  # where the user lays the ChArUco board, roughly
# The robot's own base and column: never an object, whatever the camera sees there.
EXCLUDE_ROBOT = ((-0.3, -0.3, -0.1), (0.2, 0.3, 1.5))


class RobotScanError(TwinbenchError):
    """A guided scan of a connected robot cannot run; the message names robot and camera."""


@dataclass(frozen=True)
class Orbit:
    """`views` camera poses on an arc at `distance` m and `elevation_deg` around a centre."""

    distance: float
    elevation_deg: float
    views: int
    azimuth_deg: tuple[float, float]

    def targets(
        self, centre: tuple[float, float, float], base_azimuth_deg: float = 180.0
    ) -> list[NDArray[np.float64]]:
        return orbit_targets(
            centre,
            self.distance,
            self.elevation_deg,
            self.views,
            self.azimuth_deg,
            base_azimuth_deg=base_azimuth_deg,
        )


@dataclass
class RobotScanPlan:
    """Where to look and how to move (SI units). The first orbit is `views` views at
    `distance`/`elevation_deg`; `extra_orbits` follow; then the second pass: `object_views`
    views per object found, at each of `object_elevations_deg` (0 views: no second pass)."""

    centre: tuple[float, float, float] = WORKSPACE_CENTRE
    distance: float = 0.55
    elevation_deg: float = 55.0
    views: int = 10
    azimuth_deg: tuple[float, float] = (-80.0, 80.0)
    extra_orbits: tuple[Orbit, ...] = (Orbit(0.5, 70.0, 8, (-150.0, 150.0)),)
    object_views: int = 8  # per object and elevation (second pass); 0: none
    object_distance: float = 0.5
    object_elevations_deg: tuple[float, ...] = (35.0, 55.0)
    object_azimuth_deg: tuple[float, float] = (-180.0, 135.0)
    exclude: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...] = (
        EXCLUDE_ROBOT,
    )
    fixed_frames: int = 3  # frames from each calibrated fixed camera
    camera: str | None = None  # None: the first camera with a nominal mount pose
    speed_rad_s: float = 1.2  # joint-space speed of the moves
    settle_tol_rad: float = 3e-3
    settle_vel_rad_s: float = 0.02
    settle_timeout_s: float = 4.0

    @classmethod
    def quick(cls, **changes: Any) -> RobotScanPlan:
        """Fewer views: one orbit, one elevation of 6 views per object."""
        base = cls(views=8, extra_orbits=(), object_views=6, object_elevations_deg=(40.0,))
        return replace(base, **changes)

    def orbits(self) -> list[Orbit]:
        return [Orbit(self.distance, self.elevation_deg, self.views, self.azimuth_deg)] + list(
            self.extra_orbits
        )


@dataclass
class CalibrationPlan:
    """The guided calibration path: two thirds of the views on a wide orbit around the
    board, the rest steeper and closer (rotation about several axes for hand-eye).
    `hold_roll`: solve each view with the camera's roll about its optical axis as planned
    (default: free, the inverse kinematics' nearest).

    When the views found still turn the wrist about one axis only (the second axis of their
    rotation spread under `min_rotation_deg`), the calibration adds views itself: rounds of
    up to `extra_per_round` views turned by ±`tilt_deg` about the lacking axis through the
    board centre, at most `max_extra_views` views taken and `max_extra_tries` poses tried.
    Still under `fail_rotation_deg` after that, it fails (the mount would be guessed along
    that axis: 15 mm off in the lab at ±0.1 deg); between the two it warns."""

    board_centre: tuple[float, float, float] = BOARD_CENTRE
    views: int = 12
    wide: tuple[float, float, tuple[float, float]] = (0.42, 60.0, (-70.0, 70.0))
    steep: tuple[float, float, tuple[float, float]] = (0.35, 75.0, (-120.0, 120.0))
    fixed_frames: int = 3
    hold_roll: bool = False
    # the guided path turns the wrist ±15 deg about its second axis (in the lab ±3.4 deg
    # once the views where the arm never held still are left out); one axis only: < 0.1
    min_rotation_deg: float = 2.0
    fail_rotation_deg: float = 0.5
    tilt_deg: float = 25.0
    extra_per_round: int = 4
    max_extra_views: int = 8
    max_extra_tries: int = 16
    min_elevation_deg: float = 25.0  # tilted views stay this far above the board's horizon

    def targets(self) -> list[NDArray[np.float64]]:
        n_wide = self.views * 2 // 3
        return Orbit(self.wide[0], self.wide[1], n_wide, self.wide[2]).targets(
            self.board_centre
        ) + Orbit(self.steep[0], self.steep[1], self.views - n_wide, self.steep[2]).targets(
            self.board_centre
        )
