"""The column-mapping importer: the shared real recordings through the shipped mappings,
every bad-input case with the file named, and the LeRobot-style export read back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from devices.errors import DataFileError
from devices.importers import load_furuta_npz, load_pendulum_csv
from devices.mapping import export_lerobot, import_table, load_mapping, parse_mapping
from resources import path, shared_data

PEND = shared_data("real", "simple_pendulum")
QUBE = shared_data("real", "furuta_pendulum")
needs_data = pytest.mark.skipif(not PEND.is_dir(), reason="shared real data not present")

PEND_MAP = {
    "time": {"column": "time", "unit": "s"},
    "joint_names": ["Joint_1"],
    "channels": {
        "robot/joint_pos": {"columns": ["position"], "unit": "rad"},
        "robot/joint_vel": {"columns": ["velocity"], "unit": "rad/s"},
        "robot/command": {"columns": ["torque"], "unit": "N*m"},
    },
}


def _swing(n: int = 300, rate: float = 100.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = np.arange(n) / rate
    q = 0.8 * np.sin(2 * np.pi * 0.7 * t)
    qd = 0.8 * 2 * np.pi * 0.7 * np.cos(2 * np.pi * 0.7 * t)
    return t, q, qd


def _csv(tmp: Path, name: str, t: np.ndarray, q: np.ndarray, qd: np.ndarray) -> Path:
    f = tmp / name
    rows = ["time,position,velocity,torque"]
    rows += [f"{a:.17g},{b:.17g},{c:.17g},0.1" for a, b, c in zip(t, q, qd, strict=True)]
    f.write_text("\n".join(rows) + "\n")
    return f


@needs_data
@pytest.mark.parametrize(
    "run",
    [
        "pd_system_identification_data_measured",
        "energy_shaping_data_measured",
        "energy_shaping_data_measured_1kg",
        "gravity_compensation_data_measured",
    ],
)
def test_simple_pendulum_imports_through_its_mapping(run: str) -> None:
    f = PEND / f"results_control_method_{run}.csv"
    traj = import_table(f, load_mapping(path("mappings", "simple_pendulum.json")))
    old = load_pendulum_csv(f)  # the dedicated loader agrees sample for sample
    assert np.array_equal(traj.t, old.t)
    for ch in ("robot/joint_pos", "robot/command"):  # velocity: derived from the positions
        assert np.array_equal(traj[ch], old[ch]) and traj.units[ch] == old.units[ch]
    assert traj.units["robot/joint_vel"] == "rad/s"
    assert traj.meta["joint_names"] == ["Joint_1"] and traj.source == "real"


@needs_data
def test_every_qube_rollout_imports_through_its_mapping() -> None:
    files = sorted(QUBE.glob("*/*.npz"))
    assert len(files) >= 40
    m = load_mapping(path("mappings", "furuta_pendulum.json"))
    for f in files:
        traj = import_table(f, m)
        assert traj["robot/joint_pos"].shape == (len(traj), 2)
    old = load_furuta_npz(files[0])
    new = import_table(files[0], m)
    for ch in ("robot/joint_pos", "robot/joint_vel", "robot/command"):
        assert np.allclose(new[ch], old[ch])
    assert "last value held" in new.meta["import_notes"][0]


def test_parquet_and_csv_give_the_same_trajectory(tmp_path: Path) -> None:
    import pandas as pd

    t, q, qd = _swing()
    f = _csv(tmp_path, "run.csv", t, q, qd)
    pd.read_csv(f).to_parquet(tmp_path / "run.parquet")
    m = parse_mapping(PEND_MAP)
    a, b = import_table(f, m), import_table(tmp_path / "run.parquet", m)
    assert np.allclose(a["robot/joint_pos"], b["robot/joint_pos"])
    assert np.allclose(a.t, b.t)


def test_units_and_scale_convert_to_si(tmp_path: Path) -> None:
    t, q, qd = _swing()
    f = _csv(tmp_path, "deg.csv", t * 1000, np.degrees(q), np.degrees(qd))
    m = parse_mapping(
        {
            "time": {"column": "time", "unit": "ms"},
            "channels": {
                "robot/joint_pos": {"columns": ["position"], "unit": "deg"},
                "robot/joint_vel": {"columns": ["velocity"], "unit": "deg/s"},
                "robot/command": {"columns": ["torque"], "unit": "N*m", "scale": 2.0},
            },
        }
    )
    traj = import_table(f, m)
    assert np.allclose(traj.t, t) and np.allclose(traj["robot/joint_pos"][:, 0], q)
    assert np.allclose(traj["robot/joint_vel"][:, 0], qd)
    assert np.allclose(traj["robot/command"], 0.2)


def test_nan_and_inf_samples_are_refused(tmp_path: Path) -> None:
    t, q, qd = _swing()
    q[17] = np.nan
    with pytest.raises(DataFileError, match=r"nan\.csv: column 'position' .* NaN at row 18"):
        import_table(_csv(tmp_path, "nan.csv", t, q, qd), parse_mapping(PEND_MAP))
    t, q, qd = _swing()
    qd[5] = np.inf
    with pytest.raises(DataFileError, match=r"inf\.csv: column 'velocity' .* inf at row 6"):
        import_table(_csv(tmp_path, "inf.csv", t, q, qd), parse_mapping(PEND_MAP))


def test_bad_timestamps_are_refused(tmp_path: Path) -> None:
    t, q, qd = _swing()
    t[10] = t[9]
    with pytest.raises(DataFileError, match=r"dup\.csv: duplicated timestamp in 'time' at row 11"):
        import_table(_csv(tmp_path, "dup.csv", t, q, qd), parse_mapping(PEND_MAP))
    t, q, qd = _swing()
    t[20], t[21] = t[21], t[20]
    with pytest.raises(DataFileError, match=r"back\.csv: timestamps in 'time' are not monotonic"):
        import_table(_csv(tmp_path, "back.csv", t, q, qd), parse_mapping(PEND_MAP))
    t, q, qd = _swing()
    with pytest.raises(DataFileError, match=r"ms\.csv: .* looks like milliseconds"):
        import_table(_csv(tmp_path, "ms.csv", t * 1000, q, qd), parse_mapping(PEND_MAP))


def test_degrees_declared_as_radians_are_detected(tmp_path: Path) -> None:
    t, q, qd = _swing()
    # positions in degrees, velocities in rad/s: the two disagree by 57x
    f = _csv(tmp_path, "deg_pos.csv", t, np.degrees(q), qd)
    with pytest.raises(DataFileError, match=r"deg_pos\.csv: .*57x.* look like degrees"):
        import_table(f, parse_mapping(PEND_MAP))
    # velocities in deg/s declared rad/s
    f = _csv(tmp_path, "deg_vel.csv", t, q, np.degrees(qd))
    with pytest.raises(DataFileError, match=r"deg_vel\.csv: .* look like deg/s"):
        import_table(f, parse_mapping(PEND_MAP))
    # no velocity column: the range and speed give it away
    only_pos = {
        **PEND_MAP,
        "channels": {"robot/joint_pos": PEND_MAP["channels"]["robot/joint_pos"]},
    }
    f = _csv(tmp_path, "deg_only.csv", t, np.degrees(2 * q), qd)
    with pytest.raises(DataFileError, match=r"deg_only\.csv: .* look like degrees"):
        import_table(f, parse_mapping(only_pos))


def test_millimetres_declared_as_metres_are_detected(tmp_path: Path) -> None:
    t = np.arange(100) / 50.0
    f = tmp_path / "puck.csv"
    rows = ["t,x,y,z,qx,qy,qz,qw"]
    rows += [f"{a},{400 + 100 * a},{-50.0},{20.0},0,0,0,1" for a in t]
    f.write_text("\n".join(rows) + "\n")
    m = {
        "time": {"column": "t", "unit": "s"},
        "channels": {
            "objects/puck/pose": {
                "columns": ["x", "y", "z", "qx", "qy", "qz", "qw"],
                "unit": "xyz_m+quat_xyzw",
            }
        },
    }
    with pytest.raises(DataFileError, match=r"puck\.csv: objects/puck/pose .* look like millim"):
        import_table(f, parse_mapping(m))
    m["channels"]["objects/puck/pose"]["scale"] = 1e-3
    traj = import_table(f, parse_mapping(m))
    assert np.allclose(traj["objects/puck/pose"][0, :3], [0.4, -0.05, 0.02])


def test_a_mapping_naming_missing_columns_is_refused(tmp_path: Path) -> None:
    t, q, qd = _swing()
    f = _csv(tmp_path, "run.csv", t, q, qd)
    m = json.loads(json.dumps(PEND_MAP))
    m["channels"]["robot/joint_effort"] = {"columns": ["current"], "unit": "N*m"}
    mf = tmp_path / "map.json"
    mf.write_text(json.dumps(m))
    with pytest.raises(
        DataFileError, match=r"run\.csv: the mapping .*map\.json names columns \['current'\]"
    ):
        import_table(f, load_mapping(mf))


def test_bad_mapping_files_are_refused(tmp_path: Path) -> None:
    mf = tmp_path / "m.json"
    mf.write_text("{not json")
    with pytest.raises(DataFileError, match=r"m\.json: unreadable mapping JSON"):
        load_mapping(mf)
    with pytest.raises(DataFileError, match="unit 'furlong'"):
        parse_mapping(
            {"time": {"column": "t"}, "channels": {"a/b": {"columns": ["x"], "unit": "furlong"}}}
        )
    with pytest.raises(DataFileError, match='needs "time"'):
        parse_mapping({"channels": {}})


def test_joint_count_must_match_the_mapping(tmp_path: Path) -> None:
    t, q, qd = _swing()
    m = {**PEND_MAP, "joint_names": ["arm", "pendulum"]}
    with pytest.raises(DataFileError, match=r"run\.csv: robot/joint_pos has 1 columns but"):
        import_table(_csv(tmp_path, "run.csv", t, q, qd), parse_mapping(m))


def test_lerobot_export_reads_back_through_the_shipped_mapping(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    t, q, qd = _swing()
    traj = import_table(_csv(tmp_path, "run.csv", t, q, qd), parse_mapping(PEND_MAP))
    out = export_lerobot(traj, tmp_path / "episode_000000.parquet")
    table = pq.read_table(out)
    for col in ("timestamp", "frame_index", "episode_index", "index", "observation.state"):
        assert col in table.column_names
    info = json.loads(table.schema.metadata[b"twinbench"])
    assert info["features"]["observation.state"]["unit"] == "rad"
    assert info["joint_names"] == ["Joint_1"]
    back = import_table(out, load_mapping(path("mappings", "lerobot_export.json")))
    assert np.allclose(back["robot/joint_pos"], traj["robot/joint_pos"], atol=1e-6)
    assert np.allclose(back.t, traj.t, atol=1e-5)


def test_a_derivative_channel_is_the_velocity_of_its_columns(tmp_path: Path) -> None:
    t, q, qd = _swing()
    f = _csv(tmp_path, "d.csv", t, q, qd + 0.5)  # the velocity column is off: not read
    m = parse_mapping(
        {
            "time": {"column": "time", "unit": "s"},
            "channels": {
                "robot/joint_pos": {"columns": ["position"], "unit": "rad"},
                "robot/joint_vel": {"columns": ["position"], "unit": "rad/s", "derivative": True},
            },
        }
    )
    traj = import_table(f, m)
    assert np.allclose(traj["robot/joint_vel"][5:-5, 0], qd[5:-5], atol=1e-2 * np.abs(qd).max())
    with pytest.raises(DataFileError, match="derivative"):
        parse_mapping(
            {
                "time": {"column": "time"},
                "channels": {"v": {"columns": ["a"], "unit": "rad", "derivative": 1}},
            }
        )


@pytest.mark.skipif(not PEND.is_dir(), reason="shared real data not present")
def test_pendulum_velocity_is_derived_from_the_encoder() -> None:
    # the recorded velocity of the PD identification run jumps 2.4 rad/s RMS from sample
    # to sample (2.0 rad/s RMS off a smooth derivative of the positions); the mapping
    # derives it from the positions instead
    from scipy.signal import savgol_filter

    f = PEND / "results_control_method_pd_system_identification_data_measured.csv"
    traj = import_table(f, load_mapping(path("mappings", "simple_pendulum.json")))
    q, v = traj["robot/joint_pos"][:, 0], traj["robot/joint_vel"][:, 0]
    ref = savgol_filter(q, 11, 2, deriv=1, delta=float(np.median(np.diff(traj.t))))
    assert np.sqrt(np.mean((v - ref) ** 2)) < 0.05
    assert np.sqrt(np.mean(np.diff(v) ** 2)) < 0.3
