"""The real cube tosses (../shared/data/real/cube_tosses) through their bundled mapping: units
as the data says, free flight under gravity, the angular velocity's frame, and clear errors
for a broken file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from devices.errors import DataFileError
from devices.mapping import import_table, load_mapping
from resources import path as res
from resources import shared_data

TOSSES = shared_data("real", "cube_tosses")
needs_data = pytest.mark.skipif(
    not (TOSSES / "toss_000.csv").is_file(), reason="shared real data not present"
)
MAPPING = res("mappings", "cube_tosses.json")


def _load(i: int):  # type: ignore[no-untyped-def]
    return import_table(TOSSES / f"toss_{i:03d}.csv", load_mapping(MAPPING))


def _flight(t: np.ndarray, P: np.ndarray, half: float = 0.0524) -> int:
    """Samples before the cube's lowest corner first comes within 5 mm of the table."""
    corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]) * half
    low = np.array([Rotation.from_quat(q).apply(corners)[:, 2].min() for q in P[:, 3:]])
    return int(np.argmax(low + P[:, 2] < 0.005))


@needs_data
def test_a_toss_imports_in_si_units_and_falls_at_g() -> None:
    tr = _load(0)
    assert tr.source == "real" and tr.meta["name"] == "toss_000"
    assert tr.units["objects/cube/pose"] == "xyz_m+quat_xyzw"
    assert tr.meta["rate_hz"] == pytest.approx(148, abs=1)
    P = tr["objects/cube/pose"]
    assert np.allclose(np.linalg.norm(P[:, 3:], axis=1), 1, atol=1e-3)
    # at rest on the table: the centre half a side (0.0524 m) above it
    assert P[-1, 2] == pytest.approx(0.051, abs=0.002)
    zdd = []
    for i in (0, 1, 2, 3, 5, 8):
        tr = _load(i)
        P = tr["objects/cube/pose"]
        k = _flight(tr.t, P)
        assert k >= 8, (i, k)  # in the air for at least 8 samples
        zdd.append(2 * np.polyfit(tr.t[:k], P[:k, 2], 2)[0])
    assert np.median(zdd) == pytest.approx(-9.7, abs=0.3), zdd
    # the velocity column is the positions' derivative (the mapping's units check agrees)
    v = tr["objects/cube/velocity"]
    dP = np.gradient(P[:, :3], tr.t, axis=0)
    assert np.median(np.linalg.norm(v - dP, axis=1)) < 0.05


@needs_data
def test_the_angular_velocity_column_is_in_the_body_frame() -> None:
    tr = _load(7)
    Rs = Rotation.from_quat(tr["objects/cube/pose"][:, 3:])
    w = tr["objects/cube/angular_velocity_body"]
    k = 3
    dt = tr.t[k + 1] - tr.t[k - 1]
    body = (Rs[k - 1].inv() * Rs[k + 1]).as_rotvec() / dt
    world = (Rs[k + 1] * Rs[k - 1].inv()).as_rotvec() / dt
    assert np.linalg.norm(body - w[k]) < 0.2 * np.linalg.norm(w[k])
    assert np.linalg.norm(world - w[k]) > 0.5 * np.linalg.norm(w[k])


HEADER = "t,x,y,z,qw,qx,qy,qz,vx,vy,vz,wx,wy,wz"


def _write(path: Path, rows: np.ndarray, header: str = HEADER) -> Path:
    np.savetxt(path, rows, delimiter=",", header=header, comments="", fmt="%.6f")
    return path


def _rows(n: int = 30, scale: float = 1.0) -> np.ndarray:
    t = np.arange(n) / 148
    rows = np.zeros((n, 14))
    rows[:, 0] = t
    rows[:, 1] = (0.2 - 1.0 * t) * scale
    rows[:, 3] = (0.15 - 4.9 * t**2) * scale
    rows[:, 4] = 1.0
    rows[:, 8] = -1.0
    rows[:, 10] = -9.8 * t
    return rows


def test_a_broken_toss_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    mapping = load_mapping(MAPPING)
    good = _write(tmp_path / "good.csv", _rows())
    assert import_table(good, mapping)["objects/cube/pose"].shape == (30, 7)
    missing = _write(tmp_path / "no_qw.csv", _rows()[:, [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13]],
                     HEADER.replace("qw,", ""))  # fmt: skip
    with pytest.raises(DataFileError, match=r"no_qw\.csv.*\['qw'\]"):
        import_table(missing, mapping)
    rows = _rows()
    rows[12, 3] = np.nan
    with pytest.raises(DataFileError, match=r"nan\.csv: column 'z' .*NaN at row 13"):
        import_table(_write(tmp_path / "nan.csv", rows), mapping)
    rows = _rows()
    rows[[10, 11]] = rows[[11, 10]]
    with pytest.raises(DataFileError, match=r"shuffled\.csv: timestamps .* not monotonic"):
        import_table(_write(tmp_path / "shuffled.csv", rows), mapping)
    # positions written in millimetres, velocities in m/s: the mapping says metres
    rows = _rows()
    rows[:, 1:4] *= 1000
    with pytest.raises(DataFileError, match=r"mm\.csv: objects/cube/pose changes 99\dx as fast"):
        import_table(_write(tmp_path / "mm.csv", rows), mapping)
