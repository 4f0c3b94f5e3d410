"""Import recordings made elsewhere into `Trajectory` (with units and joint names).

- `load_pendulum_csv`: the torque-limited simple pendulum's CSVs (time, position,
  velocity, torque) — the measured file gives state and torque, the desired file (optional)
  the controller's request.
- `load_furuta_npz`: Quanser Qube-Servo 2 rollouts (time, states [theta, alpha, dtheta,
  dalpha], actions_applied [V]).

Every error names the file and what is wrong (DataFileError). The general path for any
lab's logs is devices/mapping.py (a column-mapping file; resources/mappings/ has the ones
for these two rigs, and tests check both paths give the same trajectories).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from devices.errors import DataFileError
from devices.trajectory import Trajectory

PENDULUM_COLUMNS = ("time", "position", "velocity", "torque")


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: file not found")
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataFileError(f"{path}: unreadable CSV ({exc})") from exc
    if len(rows) < 3:
        raise DataFileError(f"{path}: needs a header and at least two rows")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in PENDULUM_COLUMNS if c not in header]
    if missing:
        raise DataFileError(f"{path}: missing columns {missing} (has {header})")
    try:
        data = np.array([[float(x) for x in r] for r in rows[1:] if r], dtype=float)
    except ValueError as exc:
        raise DataFileError(f"{path}: non-numeric value ({exc})") from None
    if data.ndim != 2 or data.shape[1] != len(header):
        raise DataFileError(f"{path}: rows have differing lengths")
    return {h: data[:, i] for i, h in enumerate(header)}


def load_pendulum_csv(
    measured: Path, desired: Path | None = None, joint: str = "Joint_1", command: str = "measured"
) -> Trajectory:
    """Simple pendulum run -> Trajectory with robot/joint_pos [rad], robot/joint_vel
    [rad/s], robot/joint_effort [N*m] (measured torque) and robot/command [N*m]:
    the measured torque (what the motor produced; `command="measured"`) or the desired one
    (`command="desired"`, needs `desired`)."""
    m = _read_csv(measured)
    t = m["time"]
    if not np.all(np.diff(t) > 0):
        i = int(np.argmin(np.diff(t) > 0)) + 1
        raise DataFileError(f"{measured}: time is not strictly increasing at row {i + 1}")
    ch = {
        "robot/joint_pos": m["position"],
        "robot/joint_vel": m["velocity"],
        "robot/joint_effort": m["torque"],
    }
    if command == "measured":
        ch["robot/command"] = m["torque"]
    elif command == "desired":
        if desired is None:
            raise DataFileError(f"{measured}: command='desired' needs the desired CSV")
        d = _read_csv(desired)
        if len(d["time"]) != len(t):
            raise DataFileError(f"{desired}: {len(d['time'])} rows but {measured} has {len(t)}")
        ch["robot/command"] = d["torque"]
    else:
        raise DataFileError(f"command must be 'measured' or 'desired', not {command!r}")
    if desired is not None:
        d = _read_csv(desired)
        if len(d["time"]) == len(t):
            ch["robot/joint_pos_desired"] = d["position"]
    units = {
        "robot/joint_pos": "rad",
        "robot/joint_vel": "rad/s",
        "robot/joint_effort": "N*m",
        "robot/command": "N*m",
        "robot/joint_pos_desired": "rad",
    }
    traj = Trajectory(
        t - t[0],
        ch,
        {k: units[k] for k in ch},
        "real",
        {
            "name": Path(measured).stem,
            "joint_names": [joint],
            "command_joints": [joint],
            "device": "dfki simple pendulum",
            "file": Path(measured).name,
        },
    )
    traj.check_finite(str(measured))
    return traj


def load_furuta_npz(path: Path, arm: str = "arm", pendulum: str = "pendulum") -> Trajectory:
    """Qube-Servo 2 rollout -> Trajectory: robot/joint_pos [theta, alpha] rad,
    robot/joint_vel rad/s, robot/command [V] on the arm joint (the last action is held to
    fill the final sample)."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: file not found")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise DataFileError(f"{path}: unreadable .npz ({exc})") from exc
    for k in ("time", "states", "actions_applied"):
        if k not in arrays:
            raise DataFileError(f"{path}: array '{k}' missing (has {sorted(arrays)})")
    t, s, a = arrays["time"], arrays["states"], arrays["actions_applied"].reshape(-1, 1)
    if s.ndim != 2 or s.shape != (len(t), 4):
        raise DataFileError(f"{path}: states has shape {s.shape}, expected ({len(t)}, 4)")
    if len(a) not in (len(t), len(t) - 1):
        raise DataFileError(f"{path}: {len(a)} actions for {len(t)} time samples")
    if len(a) == len(t) - 1:
        a = np.vstack([a, a[-1:]])
    traj = Trajectory(
        t - t[0],
        {
            "robot/joint_pos": s[:, :2],
            "robot/joint_vel": s[:, 2:],
            "robot/command": a.astype(float),
        },
        {"robot/joint_pos": "rad", "robot/joint_vel": "rad/s", "robot/command": "V"},
        "real",
        {
            "name": path.stem,
            "joint_names": [arm, pendulum],
            "command_joints": [arm],
            "device": "Quanser Qube-Servo 2",
            "file": path.name,
            "rate_hz": float(1 / np.median(np.diff(t))),
        },
    )
    traj.check_finite(str(path))
    return traj
