"""The support plane of a handheld scan: the floor below the cameras, never the ceiling above
them; no plane -> a message listing the candidates; the user's pick is honoured. And error
text without terminal colour codes."""

from __future__ import annotations

import numpy as np
import pytest

from reconstruction.errors import ReconstructionError, clean_message
from reconstruction.support import choose_support_plane, up_direction


def _room(rng: np.random.Generator) -> np.ndarray:
    floor = np.column_stack([rng.uniform(-1, 1, 4000), rng.uniform(-1, 1, 4000), np.zeros(4000)])
    ceiling = np.column_stack(
        [rng.uniform(-2, 2, 9000), rng.uniform(-2, 2, 9000), np.full(9000, 2.5)]
    )
    return np.vstack([floor, ceiling])


def test_floor_below_cameras_wins_over_a_larger_ceiling() -> None:
    pts = _room(np.random.default_rng(0))
    cams = np.array([[0.0, 0.0, 1.3], [0.5, 0.2, 1.2]])
    ch = choose_support_plane(pts, np.array([0.0, 0.0, 1.0]), cams)
    assert ch.plane is not None
    assert ch.plane.normal[2] > 0.99 and abs(ch.plane.d) < 0.01  # z = 0, facing up
    refused = [c for c in ch.candidates if c["refused"]]
    assert any("above the cameras" in c["refused"] for c in refused)


def test_only_a_ceiling_says_so_and_lets_the_user_pick() -> None:
    rng = np.random.default_rng(1)
    ceiling = np.column_stack(
        [rng.uniform(-2, 2, 5000), rng.uniform(-2, 2, 5000), np.full(5000, 2.5)]
    )
    cams = np.array([[0.0, 0.0, 1.3]])
    ch = choose_support_plane(ceiling, np.array([0.0, 0.0, 1.0]), cams)
    assert ch.plane is None
    assert "no support plane found" in ch.message and "--support-plane" in ch.message
    picked = choose_support_plane(ceiling, np.array([0.0, 0.0, 1.0]), cams, choice="1")
    assert picked.plane is not None and picked.chosen == 1
    given = choose_support_plane(ceiling, np.array([0.0, 0.0, 1.0]), cams, choice="0,0,2,-1")
    assert given.plane is not None and given.plane.d == pytest.approx(-0.5)
    with pytest.raises(ReconstructionError, match="support-plane"):
        choose_support_plane(ceiling, np.array([0.0, 0.0, 1.0]), cams, choice="7")


def test_up_from_accelerometer_or_upright_cameras() -> None:
    T = np.eye(4)  # OpenCV camera: y points down in the image
    up, src = up_direction(T[None])
    assert np.allclose(up, [0, -1, 0]) and "upright" in src
    up, src = up_direction(T[None], gravity_up=np.array([0.0, 0.0, 9.8]))
    assert np.allclose(up, [0, 0, 1]) and src == "accelerometer"


def test_clean_message_strips_open3d_colour_codes() -> None:
    raw = "\x1b[1;33m[Open3D WARNING] Could not   generate full range map\x1b[0;m"
    assert clean_message(raw) == "Could not generate full range map"
