"""How the fit weighs its channels: each channel's residuals are divided by a scale so joint
angles, efforts and object poses can be mixed in one objective.

- "spread" (the default): the recorded channel's std. Simple, but a precise channel then
  counts no more than a noisy one of the same spread.
- "noise": the channel's sensor noise, estimated from the recording itself
  (`noise_level`): a weighted least squares, so joint angles measured to 0.2 mrad count as
  much as efforts measured to 0.05 N*m.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from devices.trajectory import Trajectory
from twins.errors import TwinError
from twins.fit.objective import POSE_UNIT


def noise_level(data: NDArray[np.float64]) -> float:
    """A recorded channel's white sensor noise (std), from its third differences: smooth
    motion sampled fast barely moves them ((ω dt)³ of its amplitude), noise of std σ gives
    them std σ √20; the median absolute deviation keeps the few fast samples out. Columns
    pooled (rms)."""
    if len(data) < 8:
        return float("nan")
    d3 = np.diff(data, n=3, axis=0)
    mad = np.median(np.abs(d3 - np.median(d3, axis=0)), axis=0) * 1.4826 / math.sqrt(20)
    return float(np.sqrt(np.mean(mad**2)))


def channel_scales(
    windows_: Sequence[Trajectory], channels: Mapping[str, float], scales: str = "spread"
) -> tuple[tuple[str, float, float], ...]:
    """(name, weight, scale) per channel. Scale "spread": the recorded channel's std (mixes
    units, but a precise channel counts no more than a noisy one); "noise": its sensor
    noise (`noise_level`, a weighted least squares: joint angles measured to 0.2 mrad then
    count as much as efforts measured to 0.05 N*m), never below 1e-6 of the spread."""
    if scales not in ("spread", "noise"):
        raise TwinError(f"fit: scales '{scales}' is not one of spread, noise")
    out = []
    for name, weight in channels.items():
        if weight <= 0:
            continue
        missing = [w for w in windows_ if name not in w.channels]
        if missing:
            raise TwinError(_missing(name, missing[0], windows_))
        data = np.vstack([w[name] for w in windows_])
        pose = windows_[0].units.get(name) == POSE_UNIT and data.shape[1] == 7
        if pose:
            data = data[:, :3]
            scale = max(float(np.std(data)), 1e-3)
        else:
            scale = max(float(np.std(data)), 1e-6)
        if scales == "noise":
            levels = [noise_level(w[name][:, :3] if pose else w[name]) for w in windows_]
            level = float(np.sqrt(np.nanmean(np.square(levels)))) if levels else math.nan
            if math.isfinite(level):
                scale = max(level, 1e-6 * scale)
        out.append((name, float(weight), scale))
    if not out:
        raise TwinError("fit: no channel with a positive weight")
    return tuple(out)


FITTABLE = ("robot/joint_pos", "robot/joint_vel", "robot/joint_effort")  # + objects/<n>/pose


def _missing(name: str, window: Trajectory, windows_: Sequence[Trajectory]) -> str:
    """The refusal of a channel a recording lacks, with the channels to pass instead: the
    ones a replay simulates that every recording has (an object-only recording, from
    `track --camera-file`, has only its objects' poses, and the default channel is
    robot/joint_pos)."""
    rec = str(window.meta.get("name", "?"))
    common = [
        c
        for c in window.channels
        if (c in FITTABLE or (c.startswith("objects/") and c.endswith("/pose")))
        and all(c in w.channels for w in windows_)
    ]
    msg = f"fit: channel '{name}' is missing from recording {rec}"
    if not common:
        return f"{msg}, which has no channel a twin simulates ({', '.join(window.channels)})"
    what = "only object poses" if all(c.startswith("objects/") for c in common) else "channels"
    return (
        f"{msg}, which has {what} to fit: pass them with --channels "
        f"{' '.join(f'{c}=1' for c in common)} (NAME=WEIGHT; the default is "
        "robot/joint_pos=1)"
    )
