"""`Trajectory`: timestamps plus named channels; robots record it, twins simulate it.

Stored as a folder: `data.parquet` (one column per channel component, e.g.
`robot/joint_pos[3]`, readable by pandas/pyarrow) and `meta.json` (units, source, meta,
channel shapes, format version).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from devices.errors import DataFileError
from resources import atomic

FORMAT_VERSION = 1
# (T, 1) s: when row k's `robot/command` reached the robot's controller, relative to t[k]
# (robots that report it: PROTOCOL.md `command_time`); twins replay each command from then
COMMAND_DELAY = "robot/command_delay"
Source = Literal["real", "sim"]


def _freeze(a: Any) -> NDArray[np.float64]:
    arr = np.array(a, dtype=float, copy=True)
    if arr.ndim == 1:
        arr = arr[:, None]
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True)
class Trajectory:
    """Timestamps `t` (T,) in seconds, strictly increasing, and channels of shape (T, n).

    Channel names are `group/name` ("robot/joint_pos", "robot/command",
    "objects/puck/pose"); `units` gives each channel's unit ("rad", "m", "N*m",
    "xyz_m+quat_xyzw"). Arrays are read-only copies.
    """

    t: NDArray[np.float64]
    channels: Mapping[str, NDArray[np.float64]]
    units: Mapping[str, str] = field(default_factory=dict)
    source: Source = "real"
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        t = np.array(self.t, dtype=float, copy=True).reshape(-1)
        t.setflags(write=False)
        if t.size and not np.all(np.isfinite(t)):
            raise DataFileError("Trajectory: timestamps contain NaN or inf")
        if t.size > 1 and not np.all(np.diff(t) > 0):
            bad = int(np.argmin(np.diff(t) > 0))
            raise DataFileError(
                f"Trajectory: timestamps must be strictly increasing (sample {bad + 1} at "
                f"t={t[bad + 1]:.6f} s follows t={t[bad]:.6f} s)"
            )
        chans: dict[str, NDArray[np.float64]] = {}
        for name, values in self.channels.items():
            arr = _freeze(values)
            if arr.shape[0] != t.shape[0]:
                raise DataFileError(
                    f"Trajectory: channel '{name}' has {arr.shape[0]} samples but there are "
                    f"{t.shape[0]} timestamps"
                )
            chans[name] = arr
        if self.source not in ("real", "sim"):
            raise DataFileError(f"Trajectory: source must be 'real' or 'sim', not {self.source!r}")
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "channels", MappingProxyType(chans))
        object.__setattr__(self, "units", MappingProxyType(dict(self.units)))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))

    # -- basic queries -------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.t.shape[0])

    @property
    def duration(self) -> float:
        """Seconds from the first to the last sample (0 for fewer than two samples)."""
        return float(self.t[-1] - self.t[0]) if len(self) > 1 else 0.0

    def __getitem__(self, name: str) -> NDArray[np.float64]:
        try:
            return self.channels[name]
        except KeyError:
            raise KeyError(
                f"Trajectory has no channel '{name}' (has: {', '.join(self.channels)})"
            ) from None

    def check_finite(self, label: str = "trajectory") -> None:
        """Raise DataFileError naming the channel and time of the first NaN/inf."""
        for name, arr in self.channels.items():
            bad = ~np.isfinite(arr)
            if bad.any():
                i = int(np.argwhere(bad.any(axis=1))[0, 0])
                raise DataFileError(
                    f"{label}: channel '{name}' has NaN/inf at sample {i} (t={self.t[i]:.4f} s)"
                )

    def with_channels(self, **updates: Any) -> Trajectory:
        """Copy with some fields replaced (channels/units/meta/source/t)."""
        fields: dict[str, Any] = {
            "t": self.t,
            "channels": dict(self.channels),
            "units": dict(self.units),
            "source": self.source,
            "meta": dict(self.meta),
        }
        fields.update(updates)
        return Trajectory(**fields)

    def resample(self, t: NDArray[np.float64]) -> Trajectory:
        """Linear interpolation of every channel at times `t` (held constant past the ends).

        Pose channels (unit xyz_m+quat_xyzw) interpolate position linearly and re-normalise
        the quaternion (after sign alignment), which is accurate for the small steps between
        samples.
        """
        t = np.asarray(t, dtype=float).reshape(-1)
        out: dict[str, NDArray[np.float64]] = {}
        for name, arr in self.channels.items():
            res = np.stack([np.interp(t, self.t, arr[:, k]) for k in range(arr.shape[1])], 1)
            if self.units.get(name) == "xyz_m+quat_xyzw" and arr.shape[1] == 7:
                q = arr[:, 3:7].copy()
                for i in range(1, len(q)):
                    if np.dot(q[i], q[i - 1]) < 0:
                        q[i] = -q[i]
                qi = np.stack([np.interp(t, self.t, q[:, k]) for k in range(4)], 1)
                qi /= np.linalg.norm(qi, axis=1, keepdims=True)
                res[:, 3:7] = qi
            out[name] = res
        return Trajectory(t, out, dict(self.units), self.source, dict(self.meta))

    def slice_time(self, t0: float, t1: float) -> Trajectory:
        """Samples with t0 <= t <= t1."""
        m = (self.t >= t0) & (self.t <= t1)
        return Trajectory(
            self.t[m],
            {k: v[m] for k, v in self.channels.items()},
            dict(self.units),
            self.source,
            dict(self.meta),
        )

    # -- files ---------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """Write `data.parquet` and `meta.json` into `folder` (atomically, each file)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        cols: dict[str, Any] = {"t": pa.array(self.t)}
        shapes: dict[str, int] = {}
        for name, arr in self.channels.items():
            shapes[name] = int(arr.shape[1])
            for k in range(arr.shape[1]):
                cols[f"{name}[{k}]"] = pa.array(arr[:, k])
        table = pa.table(cols)
        atomic.write_with(folder / "data.parquet", lambda p: pq.write_table(table, p))
        meta = {
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "units": dict(self.units),
            "channels": shapes,
            "meta": atomic.jsonable(dict(self.meta)),
        }
        atomic.write_json(folder / "meta.json", meta)

    @classmethod
    def load(cls, folder: Path) -> Trajectory:
        """Read a trajectory folder; DataFileError names the file and what is wrong."""
        import pyarrow.parquet as pq

        folder = Path(folder)
        meta_path, data_path = folder / "meta.json", folder / "data.parquet"
        for p in (meta_path, data_path):
            if not p.is_file():
                raise DataFileError(f"{p}: missing (not a trajectory folder?)")
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise DataFileError(f"{meta_path}: unreadable JSON ({exc})") from exc
        version = meta.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise DataFileError(
                f"{meta_path}: trajectory format version {version!r} is not supported "
                f"(this Twinbench reads up to {FORMAT_VERSION})"
            )
        try:
            table = pq.read_table(data_path)
        except Exception as exc:  # pyarrow raises several unrelated types on corrupt files
            raise DataFileError(f"{data_path}: corrupt parquet file ({exc})") from exc
        names = table.column_names
        if "t" not in names:
            raise DataFileError(f"{data_path}: no 't' column")
        t = table.column("t").to_numpy()
        channels = {}
        for name, width in meta.get("channels", {}).items():
            try:
                channels[name] = np.stack(
                    [table.column(f"{name}[{k}]").to_numpy() for k in range(int(width))], 1
                )
            except KeyError as exc:
                raise DataFileError(
                    f"{data_path}: column {exc} listed in meta.json is missing"
                ) from exc
        return cls(
            t, channels, meta.get("units", {}), meta.get("source", "real"), meta.get("meta", {})
        )
