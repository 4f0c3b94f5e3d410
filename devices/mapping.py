"""Import any lab's logs through a column-mapping file, and export to LeRobot-style Parquet.

A mapping (JSON) says which column is time, which columns make each channel, their unit and
an optional scale; values are converted to SI on the way in. A channel with
`"derivative": true` is the time derivative of its columns (slope of a quadratic fitted to
the 11 samples around each, `unit` naming the derivative's unit), for a velocity better derived from an
encoder's positions than read from a noisy, quantised velocity column:

```json
{
  "format": "twinbench-mapping", "version": 1,
  "robot": "simple_pendulum",
  "time": {"column": "time", "unit": "s"},
  "joint_names": ["Joint_1"], "command_joints": ["Joint_1"],
  "channels": {
    "robot/joint_pos": {"columns": ["position"], "unit": "rad"},
    "robot/command":   {"columns": ["torque"], "unit": "N*m", "scale": 1.0}
  },
  "meta": {"device": "dfki simple pendulum"}
}
```

Files: `.csv` (header row), `.parquet` (list columns expand to `name[k]`) and `.npz`
(2-D arrays expand to `name[k]`). A column one sample shorter than time (actions between
states, as in the Qube rollouts) holds its last value; the trajectory's meta says so.

Bad input is refused with a `DataFileError` naming the file and the problem: missing
columns, NaN/inf, non-monotonic or duplicated timestamps, and units that do not fit the
numbers (degrees declared as radians, millimetres as metres, milliseconds as seconds),
detected from ranges and from positions against velocities.

`export_lerobot` writes one Parquet file with LeRobot v2 column names (`timestamp`,
`frame_index`, `episode_index`, `index`, `task_index`, `observation.state`, `action`, plus
`observation.velocity`, `observation.effort`, `observation.objects.<name>.pose`), each
vector column a list of float32; the channel names, units and joint names go in the file's
key-value metadata under `twinbench`. `resources/mappings/lerobot_export.json` reads it back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DataFileError
from devices.trajectory import Trajectory
from resources import atomic

FORMAT = "twinbench-mapping"
# unit -> (SI unit, factor to SI)
UNITS: dict[str, tuple[str, float]] = {
    "s": ("s", 1.0),
    "ms": ("s", 1e-3),
    "us": ("s", 1e-6),
    "ns": ("s", 1e-9),
    "rad": ("rad", 1.0),
    "deg": ("rad", math.pi / 180),
    "rad/s": ("rad/s", 1.0),
    "deg/s": ("rad/s", math.pi / 180),
    "m": ("m", 1.0),
    "mm": ("m", 1e-3),
    "cm": ("m", 1e-2),
    "m/s": ("m/s", 1.0),
    "mm/s": ("m/s", 1e-3),
    "N*m": ("N*m", 1.0),
    "N*mm": ("N*m", 1e-3),
    "N": ("N", 1.0),
    "V": ("V", 1.0),
    "A": ("A", 1.0),
    "1": ("1", 1.0),
    "xyz_m+quat_xyzw": ("xyz_m+quat_xyzw", 1.0),
}
DEG = 180 / math.pi
MAX_REACH_M = 10.0  # a workspace coordinate beyond this is not metres


@dataclass(frozen=True)
class ChannelMap:
    """One channel: source columns, their unit (converted to SI) and an extra scale."""

    name: str
    columns: tuple[str, ...]
    unit: str
    scale: float = 1.0
    derivative: bool = False  # the channel is the time derivative of its columns


@dataclass(frozen=True)
class ColumnMapping:
    """A parsed mapping file (see the module docstring)."""

    time_column: str
    time_unit: str
    channels: tuple[ChannelMap, ...]
    joint_names: tuple[str, ...] = ()
    command_joints: tuple[str, ...] = ()
    robot: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # the mapping file, for messages

    def columns(self) -> list[str]:
        cols = [self.time_column]
        for c in self.channels:
            cols += [x for x in c.columns if x not in cols]
        return cols


def load_mapping(path: Path) -> ColumnMapping:
    """Read and check a mapping file; DataFileError names the file and the field."""
    path = Path(path)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataFileError(f"{path}: mapping file not found") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataFileError(f"{path}: unreadable mapping JSON ({exc})") from exc
    return parse_mapping(d, str(path))


def parse_mapping(d: Any, source: str = "mapping") -> ColumnMapping:
    """A mapping from its JSON object (`source` names it in messages)."""
    if not isinstance(d, dict):
        raise DataFileError(f"{source}: a mapping is a JSON object")
    if d.get("format", FORMAT) != FORMAT:
        raise DataFileError(f"{source}: format must be '{FORMAT}'")
    tm = d.get("time")
    if not isinstance(tm, dict) or not isinstance(tm.get("column"), str):
        raise DataFileError(f'{source}: needs "time": {{"column": NAME, "unit": "s"}}')
    t_unit = str(tm.get("unit", "s"))
    if UNITS.get(t_unit, ("",))[0] != "s":
        raise DataFileError(f"{source}: time unit '{t_unit}' is not one of s, ms, us, ns")
    chans = d.get("channels")
    if not isinstance(chans, dict) or not chans:
        raise DataFileError(f'{source}: needs "channels": {{NAME: {{"columns": [...]}}}}')
    out = []
    for name, c in chans.items():
        if not isinstance(c, dict) or not isinstance(c.get("columns"), list) or not c["columns"]:
            raise DataFileError(f"{source}: channel '{name}' needs a non-empty \"columns\" list")
        unit = str(c.get("unit", ""))
        if unit not in UNITS:
            raise DataFileError(
                f"{source}: channel '{name}' unit '{unit}' is not one of {', '.join(UNITS)}"
            )
        scale = c.get("scale", 1.0)
        if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
            raise DataFileError(f"{source}: channel '{name}' scale must be a non-zero number")
        deriv = c.get("derivative", False)
        if not isinstance(deriv, bool):
            raise DataFileError(f"{source}: channel '{name}' derivative must be true or false")
        out.append(
            ChannelMap(str(name), tuple(str(x) for x in c["columns"]), unit, float(scale), deriv)
        )
    return ColumnMapping(
        time_column=tm["column"],
        time_unit=t_unit,
        channels=tuple(out),
        joint_names=tuple(str(j) for j in d.get("joint_names", ())),
        command_joints=tuple(str(j) for j in d.get("command_joints", ())),
        robot=str(d.get("robot", "")),
        meta=dict(d.get("meta", {})),
        source=source,
    )


# -- reading tables ------------------------------------------------------------------------
def _expand(name: str, arr: NDArray[Any], into: dict[str, NDArray[Any]]) -> None:
    arr = np.asarray(arr)
    if arr.dtype == object:  # parquet list columns
        try:
            arr = np.stack([np.asarray(v, dtype=float) for v in arr])
        except (TypeError, ValueError):
            return
    if arr.ndim == 1:
        into[name] = arr
    elif arr.ndim == 2:
        if arr.shape[1] == 1:
            into[name] = arr[:, 0]
        for k in range(arr.shape[1]):
            into[f"{name}[{k}]"] = arr[:, k]


def read_table(path: Path) -> dict[str, NDArray[Any]]:
    """Columns of a CSV, Parquet or NPZ file by name (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: file not found")
    suffix = path.suffix.lower()
    cols: dict[str, NDArray[Any]] = {}
    try:
        if suffix == ".csv":
            import pandas as pd

            df = pd.read_csv(path, skipinitialspace=True)
            for c in df.columns:
                cols[str(c).strip()] = df[c].to_numpy()
        elif suffix in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            for c in table.column_names:
                _expand(c, table.column(c).to_numpy(zero_copy_only=False), cols)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                for k in z.files:
                    _expand(k, z[k], cols)
        else:
            raise DataFileError(f"{path}: unknown file type '{suffix}' (csv, parquet or npz)")
    except DataFileError:
        raise
    except Exception as exc:  # pandas/pyarrow/numpy raise many unrelated types on bad files
        raise DataFileError(f"{path}: unreadable {suffix[1:]} file ({exc})") from exc
    return cols


# -- the importer ---------------------------------------------------------------------------
def _numeric(path: Path, name: str, values: NDArray[Any]) -> NDArray[np.float64]:
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise DataFileError(f"{path}: column '{name}' is not numeric") from None


def _check_time(path: Path, col: str, t: NDArray[np.float64], unit: str) -> None:
    bad = ~np.isfinite(t)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataFileError(f"{path}: time column '{col}' has NaN/inf at row {i + 1}")
    if len(t) < 2:
        raise DataFileError(f"{path}: needs at least two samples, has {len(t)}")
    d = np.diff(t)
    if np.any(d == 0):
        i = int(np.argmax(d == 0)) + 1
        raise DataFileError(
            f"{path}: duplicated timestamp in '{col}' at row {i + 1} (t={t[i]:.6g} {unit}, "
            "same as the row before)"
        )
    if np.any(d < 0):
        i = int(np.argmax(d < 0)) + 1
        raise DataFileError(
            f"{path}: timestamps in '{col}' are not monotonic: row {i + 1} (t={t[i]:.6g} "
            f"{unit}) comes before row {i} (t={t[i - 1]:.6g} {unit})"
        )
    if unit == "s":
        dt = float(np.median(d))
        if dt >= 0.5 and len(t) > 50:
            raise DataFileError(
                f"{path}: time column '{col}' is declared in seconds but samples are "
                f"{dt:g} s apart ({len(t)} samples over {t[-1] - t[0]:g} s); it looks like "
                'milliseconds — set "unit": "ms" in the mapping'
            )


def _check_finite(path: Path, name: str, cols: tuple[str, ...], arr: NDArray[np.float64]) -> None:
    bad = ~np.isfinite(arr)
    if bad.any():
        i, k = (int(x) for x in np.argwhere(bad)[0])
        raise DataFileError(
            f"{path}: column '{cols[k]}' ({name}) has {'NaN' if np.isnan(arr[i, k]) else 'inf'} "
            f"at row {i + 1}; {int(bad.any(axis=1).sum())} rows affected"
        )


def _check_units(
    path: Path, t: NDArray[np.float64], si: dict[str, tuple[str, NDArray[np.float64], str]]
) -> None:
    """Units that do not fit the numbers: positions against velocities, and ranges."""
    pairs = [("robot/joint_pos", "robot/joint_vel")]
    for pos_name, vel_name in pairs:
        if pos_name not in si or vel_name not in si:
            continue
        pu, P, pdecl = si[pos_name]
        vu, V, vdecl = si[vel_name]
        if P.shape != V.shape or len(t) < 5:
            continue
        dP = np.gradient(P, t, axis=0)
        for k in range(P.shape[1]):
            v, dp = V[:, k], dP[:, k]
            if np.sum(v * v) < 1e-12 or np.sum(dp * dp) < 1e-12:
                continue
            ratio = float(np.sum(dp * v) / np.sum(v * v))
            if pu == "rad" and 40 < ratio < 80:
                raise DataFileError(
                    f"{path}: {pos_name} column {k} changes {ratio:.0f}x faster than "
                    f"{vel_name} says: positions declared '{pdecl}' look like degrees "
                    f"(or velocities like rad/s declared '{vdecl}'); fix the units in the mapping"
                )
            if pu == "rad" and 1 / 80 < ratio < 1 / 40:
                raise DataFileError(
                    f"{path}: {vel_name} column {k} is {1 / ratio:.0f}x what {pos_name} implies: "
                    f"velocities declared '{vdecl}' look like deg/s; fix the units in the mapping"
                )
            if pu == "m" and 500 < ratio < 2000:
                raise DataFileError(
                    f"{path}: {pos_name} column {k} changes {ratio:.0f}x faster than "
                    f"{vel_name} says: positions declared '{pdecl}' look like millimetres"
                )
    for pos_name in [n for n in si if n.startswith("objects/") and n.endswith("/pose")]:
        vel_name = pos_name[: -len("pose")] + "velocity"
        if vel_name not in si or len(t) < 5:
            continue
        _, P, pdecl = si[pos_name]
        _, V, vdecl = si[vel_name]
        if V.shape[1] != 3 or P.shape[1] < 3:
            continue
        dP = np.gradient(P[:, :3], t, axis=0)
        vv, dv = float(np.sum(V * V)), float(np.sum(dP * dP))
        if vv < 1e-12 or dv < 1e-12:
            continue
        ratio = float(np.sum(dP * V) / vv)
        if not 0.1 < ratio < 10:
            raise DataFileError(
                f"{path}: {pos_name} changes {ratio:.3g}x as fast as {vel_name} says "
                f"(positions declared '{pdecl}', velocities '{vdecl}'): one of the two units "
                "is wrong in the mapping (mm as m gives 1000x, m/s as mm/s 0.001x)"
            )
    for name, (u, arr, decl) in si.items():
        if u == "rad" and arr.size:
            peak = float(np.max(np.abs(arr)))
            steps = np.abs(np.diff(arr, axis=0)) / np.diff(t)[:, None]
            speed = float(np.percentile(steps, 95)) if steps.size else 0.0
            if peak > 4 * math.pi and peak <= 400 and speed > 50:
                raise DataFileError(
                    f"{path}: {name} declared '{decl}' reaches {peak:.1f} rad and moves at "
                    f'{speed:.0f} rad/s: these look like degrees (set "unit": "deg")'
                )
        if u in ("m", "xyz_m+quat_xyzw") and arr.size:
            xyz = arr[:, :3] if u == "xyz_m+quat_xyzw" else arr
            peak = float(np.max(np.abs(xyz)))
            if peak > MAX_REACH_M:
                raise DataFileError(
                    f"{path}: {name} declared '{decl}' reaches {peak:g} m, beyond any "
                    'workspace: these look like millimetres (set "unit": "mm")'
                )


def _derivative(
    path: Path, name: str, t: NDArray[np.float64], raw: NDArray[np.float64], k: int = 5
) -> NDArray[np.float64]:
    """d raw / dt: slope of a quadratic fitted to the 2k + 1 samples around each one, at
    their own timestamps (a velocity derived from an encoder's positions, where the recorded
    velocity is a noisy, quantised estimate); the ends use the nearest full window."""
    from numpy.lib.stride_tricks import sliding_window_view

    n = len(t)
    if n < 2 * k + 1:
        raise DataFileError(f"{path}: channel '{name}' needs {2 * k + 1} samples to differentiate")
    centre = np.clip(np.arange(n), k, n - k - 1)
    tw = sliding_window_view(t, 2 * k + 1)[centre - k]  # (n, 2k+1)
    dt = tw - t[:, None]
    A = np.stack([np.ones_like(dt), dt, dt * dt], axis=2)  # (n, 2k+1, 3)
    AtA = np.einsum("nwi,nwj->nij", A, A)
    out = np.empty_like(raw)
    for c in range(raw.shape[1]):
        xw = sliding_window_view(raw[:, c], 2 * k + 1)[centre - k]
        coef = np.linalg.solve(AtA, np.einsum("nwi,nw->ni", A, xw)[..., None])[..., 0]
        out[:, c] = coef[:, 1]
    return out


def import_table(path: Path, mapping: ColumnMapping, name: str | None = None) -> Trajectory:
    """Read `path` through `mapping` into a real `Trajectory` (SI units, time from 0)."""
    path = Path(path)
    cols = read_table(path)
    missing = [c for c in mapping.columns() if c not in cols]
    if missing:
        raise DataFileError(
            f"{path}: the mapping {mapping.source} names columns {missing} that the file "
            f"lacks (it has: {', '.join(sorted(cols)[:20])})"
        )
    t_raw = _numeric(path, mapping.time_column, cols[mapping.time_column]).reshape(-1)
    _check_time(path, mapping.time_column, t_raw, mapping.time_unit)
    t = (t_raw - t_raw[0]) * UNITS[mapping.time_unit][1]
    notes: list[str] = []
    channels: dict[str, NDArray[np.float64]] = {}
    units: dict[str, str] = {}
    si: dict[str, tuple[str, NDArray[np.float64], str]] = {}
    for ch in mapping.channels:
        parts = []
        for c in ch.columns:
            v = _numeric(path, c, cols[c]).reshape(-1)
            if len(v) == len(t) - 1:
                v = np.append(v, v[-1])
                notes.append(f"column '{c}' has one sample fewer than time: last value held")
            if len(v) != len(t):
                raise DataFileError(
                    f"{path}: column '{c}' has {len(v)} samples but time has {len(t)}"
                )
            parts.append(v)
        raw = np.stack(parts, axis=1)
        _check_finite(path, ch.name, ch.columns, raw)
        if ch.derivative:
            raw = _derivative(path, ch.name, t, raw)
        unit_si, factor = UNITS[ch.unit]
        arr = raw * (factor * ch.scale)
        if unit_si == "xyz_m+quat_xyzw":
            arr = raw.copy()
            arr[:, :3] *= ch.scale
        channels[ch.name], units[ch.name] = arr, unit_si
        si[ch.name] = (unit_si, arr, ch.unit)
    _check_units(path, t, si)
    meta: dict[str, Any] = {
        "name": name or path.stem,
        "file": path.name,
        "mapping": Path(mapping.source).name,
        **dict(mapping.meta),
    }
    if mapping.robot:
        meta["robot"] = mapping.robot
    if mapping.joint_names:
        meta["joint_names"] = list(mapping.joint_names)
        jp = channels.get("robot/joint_pos")
        if jp is not None and jp.shape[1] != len(mapping.joint_names):
            raise DataFileError(
                f"{path}: robot/joint_pos has {jp.shape[1]} columns but the mapping names "
                f"{len(mapping.joint_names)} joints {list(mapping.joint_names)}"
            )
    if mapping.command_joints:
        meta["command_joints"] = list(mapping.command_joints)
    if len(t) > 1:
        meta["rate_hz"] = float(1 / np.median(np.diff(t)))
    if notes:
        meta["import_notes"] = sorted(set(notes))
    return Trajectory(t, channels, units, "real", meta)


# -- export ----------------------------------------------------------------------------------
LEROBOT_COLUMNS = {
    "robot/joint_pos": "observation.state",
    "robot/joint_vel": "observation.velocity",
    "robot/joint_effort": "observation.effort",
    "robot/command": "action",
}


def export_lerobot(traj: Trajectory, path: Path, episode_index: int = 0) -> Path:
    """Write `traj` as one LeRobot-style Parquet episode (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    n = len(traj)
    cols: dict[str, Any] = {
        "timestamp": pa.array(traj.t.astype(np.float32)),
        "frame_index": pa.array(np.arange(n, dtype=np.int64)),
        "episode_index": pa.array(np.full(n, episode_index, dtype=np.int64)),
        "index": pa.array(np.arange(n, dtype=np.int64)),
        "task_index": pa.array(np.zeros(n, dtype=np.int64)),
    }
    features: dict[str, Any] = {}
    for name, arr in traj.channels.items():
        if name in LEROBOT_COLUMNS:
            col = LEROBOT_COLUMNS[name]
        elif name.startswith("objects/"):
            col = "observation." + name.replace("/", ".")
        else:
            col = "observation.extra." + name.replace("/", ".")
        values = arr.astype(np.float32)
        cols[col] = pa.array(list(values), type=pa.list_(pa.float32()))
        features[col] = {
            "channel": name,
            "unit": traj.units.get(name, ""),
            "shape": [int(arr.shape[1])],
        }
    info = {
        "fps": float(traj.meta.get("rate_hz", 1 / np.median(np.diff(traj.t))) if n > 1 else 0.0),
        "features": features,
        "joint_names": list(traj.meta.get("joint_names", [])),
        "command_joints": list(traj.meta.get("command_joints", [])),
        "source": traj.source,
        "name": str(traj.meta.get("name", "")),
    }
    table = pa.table(cols).replace_schema_metadata({"twinbench": json.dumps(info)})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_with(path, lambda p: pq.write_table(table, p))
    return path
