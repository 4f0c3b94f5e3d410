"""The rotation a hand-eye calibration's views lack, and the views that add it: the wrist
rotation spread finds the one axis views turn about, and views turned about another axis
through the board centre keep looking at the board from the same distance."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from reconstruction.calibration import CalibrationError, LacksRotationError, park_martin
from reconstruction.handeye import rotation_spread
from reconstruction.scan_path import look_at, orbit_targets, tilted_views

AT = (0.45, 0.0, 0.0)  # the board centre
CENTRE = np.array(AT)
X = np.eye(4)  # hand = camera: the hand's rotations are the camera's
X[:3, 3] = (0.05, 0.0, 0.03)


def _one_axis_cameras(n: int = 8) -> list[np.ndarray]:
    """Cameras on one circle around the board, each looking at it with the same roll:
    their rotations differ about the vertical only."""
    return orbit_targets(AT, 0.4, 60.0, n, (-60.0, 60.0))


def test_spread_finds_rotation_about_one_axis_only() -> None:
    hands = [C @ np.linalg.inv(X) for C in _one_axis_cameras()]
    rs = rotation_spread(hands)
    assert rs.std_deg[0] < 1e-6 and rs.std_deg[1] < 1e-6  # two axes not turned about
    # the azimuths' own spread (the mean rotation sits in the middle of the arc)
    assert rs.std_deg[2] == pytest.approx(float(np.std(np.linspace(-60, 60, 8))), abs=1e-6)
    assert abs(rs.axis_in_base(2) @ [0, 0, 1]) > 0.9999  # ... only about the vertical
    assert rs.lacking_axis(5.0) == 1
    assert abs(rs.axis_in_base(1) @ [0, 0, 1]) < 1e-6  # the one to add is horizontal


def test_tilted_views_add_the_missing_rotation_and_keep_the_board_in_view() -> None:
    cams = _one_axis_cameras()
    rs = rotation_spread([C @ np.linalg.inv(X) for C in cams])
    axis = rs.axis_in_base(1)
    extra = tilted_views(cams, axis, AT, (25.0, -25.0), min_elevation_deg=25.0)
    assert extra and extra[0][0] == 0 and extra[1][0] == 0  # first camera, both signs
    assert {i for i, _ in extra[:4]} == {0, len(cams) - 1}  # then the far end of the path
    for i, T in extra:
        C = cams[i]
        # still at the same distance, still looking through the board centre
        assert np.linalg.norm(T[:3, 3] - CENTRE) == pytest.approx(0.4, abs=1e-9)
        to_centre = (CENTRE - T[:3, 3]) / 0.4
        assert to_centre @ T[:3, 2] == pytest.approx(1.0, abs=1e-9)
        # turned by 25 deg about the given axis
        rel = Rotation.from_matrix(T[:3, :3] @ C[:3, :3].T).as_rotvec()
        assert np.degrees(np.linalg.norm(rel)) == pytest.approx(25.0, abs=1e-6)
        assert abs(rel @ axis) / np.linalg.norm(rel) == pytest.approx(1.0, abs=1e-9)
        assert np.degrees(np.arcsin((T[2, 3] - CENTRE[2]) / 0.4)) >= 25.0
    # four of them give the views a second axis well over the 5 deg a guided path needs
    more = [C @ np.linalg.inv(X) for C in cams] + [T @ np.linalg.inv(X) for _, T in extra[:4]]
    assert rotation_spread(more).std_deg[1] > 10.0
    assert rotation_spread(more).lacking_axis(5.0) is None


def test_tilted_views_stay_above_the_board() -> None:
    low = [look_at(CENTRE + [-0.3, 0.0, 0.2], CENTRE)]  # 34 deg elevation
    # turning about the horizontal axis across the view lowers one side below 25 deg
    (kept,) = tilted_views(low, [0.0, 1.0, 0.0], AT, (20.0, -20.0), 25.0)
    assert kept[1][2, 3] > low[0][2, 3]


def test_closed_form_names_one_axis_motion_with_its_own_error() -> None:
    cams = _one_axis_cameras(5)
    hands = [C @ np.linalg.inv(X) for C in cams]
    T_base_board = np.eye(4)
    T_base_board[:3, 3] = CENTRE
    boards = [np.linalg.inv(C) @ T_base_board for C in cams]
    with pytest.raises(LacksRotationError, match="add views tilted about another axis"):
        park_martin(hands, boards)
    assert issubclass(LacksRotationError, CalibrationError)  # callers of old still catch it
