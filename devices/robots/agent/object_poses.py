"""Object poses streamed by the workbench to the agent (`object_pose` messages, wire/PROTOCOL.md).

A robot does not know where the objects on its table are; the workbench's camera tracker
does. It streams each tracked pose with the time the camera captured it, on the robot's
clock (the `t` of the states the agent streams), and the tracker's quality. The agent keeps
the newest good pose per object for a policy that observes `object_pose`, and stops that
policy when the newest good pose is older than the spec's `object_max_age_s`: a report
that says `lost` (or a quality below the spec's minimum) is kept as the latest report but
does not refresh the pose, so a loss longer than the age limit stops the robot, exactly
as the twin ends an episode whose tracking stays frozen too long (policies/tasks/base.py).

Every report is checked before it is kept: 7 numbers (ints or floats: not strings, booleans
or None), finite, a position within `MAX_POSITION_M` of the base and a unit quaternion xyzw
(robot base frame); a finite capture time not in the future of the robot's clock by more
than the feed's tolerance (one control period: the newest state the agent has seen is at
most that old) and newer than the last one of that object; a quality in [0, 1]; and an
object the loaded policy observes. A stamp further ahead would stretch the age limit: a
pose stamped 49 ms ahead under a 50 ms tolerance kept a 200 ms limit from acting for 252 ms.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError

FUTURE_TOLERANCE_S = 1.0 / 250.0  # default: one control period at 250 Hz (agents pass theirs)
MAX_POSITION_M = 100.0  # |x|, |y|, |z| of an object in the robot base frame
MAX_RATE_HZ = 500.0  # per object: reports closer than 1/MAX_RATE_HZ in capture time refused
QUAT_TOLERANCE = 0.01  # |norm(q) - 1| accepted (then normalised)


class ObjectPoseError(DeviceError):
    """An `object_pose` report was refused; `code` is the wire error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ObjectReport:
    """One object's report as kept by the agent (times on the robot's clock, s)."""

    name: str
    pose: NDArray[np.float64]  # (7,) xyz m + quaternion xyzw, robot base frame
    t: float  # capture time
    quality: float
    lost: bool
    received: float  # robot time when it arrived


def check_report(
    name: Any, pose: Any, t: Any, quality: Any, lost: Any
) -> tuple[str, NDArray[np.float64], float, float, bool]:
    """The checked fields of one report; ObjectPoseError('bad_request') naming the field."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ObjectPoseError("bad_request", "'object' must be a non-empty name")
    what = f"object '{name}': 'pose' must be 7 numbers (xyz + quaternion xyzw)"
    if isinstance(pose, np.ndarray) and pose.ndim == 1:  # a local caller's array
        pose = pose.tolist()
    if not isinstance(pose, (list, tuple)) or len(pose) != 7:
        got = f"{len(pose)} values" if isinstance(pose, (list, tuple)) else type(pose).__name__
        raise ObjectPoseError("bad_request", f"{what}, got {got}")
    for i, v in enumerate(pose):
        if not _is_number(v):
            raise ObjectPoseError(
                "bad_request", f"{what}; 'pose'[{i}] is {type(v).__name__} {v!r:.40}"
            )
    try:
        p = np.array(pose, dtype=np.float64)
    except OverflowError:  # an int beyond the float range (only from a local caller)
        raise ObjectPoseError("bad_request", f"{what}; a value is out of range") from None
    if not np.all(np.isfinite(p)):
        raise ObjectPoseError("bad_request", f"object '{name}': 'pose' holds NaN or inf")
    if np.any(np.abs(p[:3]) > MAX_POSITION_M):
        raise ObjectPoseError(
            "bad_request",
            f"object '{name}': position {p[:3].tolist()} m is beyond +-{MAX_POSITION_M:g} m of "
            "the robot base",
        )
    qn = float(np.linalg.norm(p[3:]))
    if abs(qn - 1.0) > QUAT_TOLERANCE:
        raise ObjectPoseError(
            "bad_request", f"object '{name}': quaternion norm is {qn:.4f}, not 1 (xyzw expected)"
        )
    p[3:] /= qn
    if not _is_number(t) or not math.isfinite(t):
        raise ObjectPoseError(
            "bad_request", f"object '{name}': 't' (capture time, robot clock s) must be a number"
        )
    if not _is_number(quality):
        raise ObjectPoseError("bad_request", f"object '{name}': 'quality' must be a number")
    if not (math.isfinite(quality) and 0.0 <= quality <= 1.0):
        raise ObjectPoseError(
            "bad_request", f"object '{name}': 'quality' must be within [0, 1], not {quality!r}"
        )
    if not isinstance(lost, bool):
        raise ObjectPoseError("bad_request", f"object '{name}': 'lost' must be true or false")
    return name, p, float(t), float(quality), lost


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class ObjectFeed:
    """The newest report and the newest good pose of each object the policy observes.
    Thread-safe: sessions write, the control loop and the policy worker read.

    future_tolerance_s: how far a capture time may be ahead of the robot time `update` is
    given (the newest measured state's): one control period (the agent passes 1 / its
    control rate), as that state may be up to one tick old when a report arrives."""

    def __init__(self, future_tolerance_s: float = FUTURE_TOLERANCE_S) -> None:
        self.future_tolerance_s = float(future_tolerance_s)
        self._lock = threading.Lock()
        self.objects: tuple[str, ...] = ()
        self.min_quality = 0.0
        self._good: dict[str, ObjectReport] = {}
        self._last: dict[str, ObjectReport] = {}

    def expect(self, objects: Sequence[str], min_quality: float) -> None:
        """A policy observing `objects` was loaded: forget every earlier report."""
        with self._lock:
            self.objects, self.min_quality = tuple(objects), float(min_quality)
            self._good, self._last = {}, {}

    def update(
        self,
        name: Any,
        pose: Any,
        t: Any,
        quality: Any,
        lost: Any,
        now: float,
        future_tolerance_s: float | None = None,
    ) -> ObjectReport:
        """Keep one report (`now`: the robot's clock, the newest measured state's time).
        ObjectPoseError: 'bad_request' for a malformed field, 'refused' for an object no
        policy observes, a capture time more than `future_tolerance_s` (default: the
        feed's) after `now`, or not newer than the last one."""
        name, p, t, quality, lost = check_report(name, pose, t, quality, lost)
        tol = self.future_tolerance_s if future_tolerance_s is None else future_tolerance_s
        with self._lock:
            if name not in self.objects:
                raise ObjectPoseError(
                    "refused",
                    f"object '{name}' is not observed by the loaded policy (it observes "
                    f"{list(self.objects) or 'no object'})",
                )
            if t > now + tol:
                raise ObjectPoseError(
                    "refused",
                    f"object '{name}': capture time {t:.3f} s is {t - now:.3f} s in the future "
                    f"of the robot's clock ({now:.3f} s; tolerance {tol * 1e3:.1f} ms); stamp "
                    "poses on the robot's clock",
                )
            prev = self._last.get(name)
            if prev is not None and t < prev.t + 1.0 / MAX_RATE_HZ:
                raise ObjectPoseError(
                    "refused",
                    f"object '{name}': capture time {t:.4f} s is not newer than the last "
                    f"report's {prev.t:.4f} s (+{1e3 / MAX_RATE_HZ:g} ms)",
                )
            rep = ObjectReport(name, p, t, quality, lost, now)
            self._last[name] = rep
            if not lost and quality >= self.min_quality:
                self._good[name] = rep
            return rep

    def good(self, name: str) -> ObjectReport | None:
        """The newest good report of `name` (None: none yet)."""
        return self._good.get(name)

    def last(self, name: str) -> ObjectReport | None:
        return self._last.get(name)

    def stale(self, name: str, now: float, max_age_s: float, since: float) -> str | None:
        """Why the policy must stop, or None: no good pose of `name` newer than `max_age_s`
        at robot time `now` (`since`: when the policy started, for a pose never sent)."""
        good, last = self._good.get(name), self._last.get(name)
        if good is None:
            if now - since <= max_age_s:
                return None
            what = "never reported" if last is None else _lost_text(last)
            return (
                f"object tracking: no good pose of '{name}' in {(now - since) * 1e3:.0f} ms "
                f"({what}; limit {max_age_s * 1e3:.0f} ms)"
            )
        age = now - good.t
        if age <= max_age_s:
            return None
        why = "stale" if last is None or last.t <= good.t else _lost_text(last)
        return (
            f"object tracking: pose of '{name}' is {age * 1e3:.0f} ms old ({why}; limit "
            f"{max_age_s * 1e3:.0f} ms)"
        )


def _lost_text(rep: ObjectReport) -> str:
    return (
        f"tracking lost, quality {rep.quality:.2f}"
        if rep.lost
        else (f"tracking quality {rep.quality:.2f} too low")
    )
