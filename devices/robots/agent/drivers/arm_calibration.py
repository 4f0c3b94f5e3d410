"""Per-joint calibration of a serial-bus servo arm, stored as JSON next to its robot
description:

    {"robot": "so101", "bus": "feetech", "ticks_per_rev": 4096,
     "joints": [{"name": "shoulder_pan", "id": 1, "offset": 2048, "direction": 1,
                 "min": -1.9, "max": 1.9, "velocity": 3.0, "effort": 2.9}, ...]}

`offset` is the raw servo position (ticks) at joint angle 0, `direction` is +1 or -1,
`min`/`max` the calibrated range (rad), `velocity` (rad/s) and `effort` (N*m) the joint's
limits. joint angle = direction * (ticks - offset) * 2*pi / ticks_per_rev.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError


@dataclass(frozen=True)
class JointCalibration:
    name: str
    id: int
    offset: float  # ticks at joint angle 0
    direction: int  # +1 or -1
    min: float  # rad
    max: float  # rad
    velocity: float = 3.0  # rad/s
    effort: float = 3.0  # N*m


@dataclass(frozen=True)
class ArmCalibration:
    robot: str
    bus: str
    joints: tuple[JointCalibration, ...]
    ticks_per_rev: int = 4096
    source: str = "<memory>"  # the file it came from, for messages

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(j.name for j in self.joints)

    @property
    def ids(self) -> list[int]:
        return [j.id for j in self.joints]

    def _vec(self, key: str) -> NDArray[np.float64]:
        return np.array([float(getattr(j, key)) for j in self.joints])

    def to_rad(self, ticks: NDArray[np.float64]) -> NDArray[np.float64]:
        k = 2.0 * math.pi / self.ticks_per_rev
        return self._vec("direction") * (np.asarray(ticks, float) - self._vec("offset")) * k

    def to_ticks(self, rad: NDArray[np.float64]) -> NDArray[np.int64]:
        k = self.ticks_per_rev / (2.0 * math.pi)
        raw = self._vec("offset") + self._vec("direction") * np.asarray(rad, float) * k
        return np.rint(raw).astype(np.int64)

    def speed_to_rad(self, ticks_per_s: NDArray[np.float64]) -> NDArray[np.float64]:
        k = 2.0 * math.pi / self.ticks_per_rev
        return self._vec("direction") * np.asarray(ticks_per_s, float) * k

    def velocity_ticks(self) -> NDArray[np.float64]:
        """Each joint's velocity limit as a servo speed (ticks/s, > 0)."""
        return self._vec("velocity") * self.ticks_per_rev / (2.0 * math.pi)

    def tick_range(self, j: JointCalibration) -> tuple[int, int]:
        """The joint's calibrated range as servo ticks (low, high), for the servo's own limits."""
        k = self.ticks_per_rev / (2.0 * math.pi)
        a, b = (j.offset + j.direction * v * k for v in (j.min, j.max))
        return int(math.floor(min(a, b))), int(math.ceil(max(a, b)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "robot": self.robot,
            "bus": self.bus,
            "ticks_per_rev": self.ticks_per_rev,
            "joints": [asdict(j) for j in self.joints],
        }

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        tmp.replace(path)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<memory>") -> ArmCalibration:
        """Validate and build; every error names `source` and the joint."""
        try:
            tpr = int(d.get("ticks_per_rev", 4096))
            raw_joints = d["joints"]
            robot, bus = str(d.get("robot", "servo arm")), str(d.get("bus", ""))
        except (KeyError, TypeError, ValueError) as exc:
            raise DeviceError(f"calibration {source}: missing or bad field ({exc})") from None
        if not isinstance(raw_joints, list) or not raw_joints:
            raise DeviceError(f"calibration {source}: 'joints' must be a non-empty list")
        joints = []
        for k, j in enumerate(raw_joints):
            where = f"calibration {source}, joint {k} ({j.get('name', '?') if isinstance(j, dict) else '?'})"
            try:
                jc = JointCalibration(
                    name=str(j["name"]),
                    id=int(j["id"]),
                    offset=float(j["offset"]),
                    direction=int(j.get("direction", 1)),
                    min=float(j["min"]),
                    max=float(j["max"]),
                    velocity=float(j.get("velocity", 3.0)),
                    effort=float(j.get("effort", 3.0)),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise DeviceError(f"{where}: missing or bad field ({exc})") from None
            if jc.direction not in (1, -1):
                raise DeviceError(f"{where}: direction must be 1 or -1, got {jc.direction}")
            vals = (jc.offset, jc.min, jc.max, jc.velocity, jc.effort)
            if not all(math.isfinite(v) for v in vals):
                raise DeviceError(f"{where}: offset, min, max, velocity, effort must be finite")
            if not jc.min < jc.max:
                raise DeviceError(f"{where}: min {jc.min} rad must be below max {jc.max} rad")
            if jc.velocity <= 0 or jc.effort <= 0:
                raise DeviceError(f"{where}: velocity and effort limits must be > 0")
            joints.append(jc)
        ids = [j.id for j in joints]
        if len(set(ids)) != len(ids) or len({j.name for j in joints}) != len(joints):
            raise DeviceError(f"calibration {source}: joint names and servo ids must be unique")
        cal = cls(robot, bus, tuple(joints), tpr, source)
        for j in joints:
            lo, hi = cal.tick_range(j)
            if lo < 0 or hi > tpr - 1:
                raise DeviceError(
                    f"calibration {source}, joint {j.name}: range [{j.min}, {j.max}] rad maps to "
                    f"ticks [{lo}, {hi}], outside the servo's 0..{tpr - 1}; check offset/direction"
                )
        return cal

    @classmethod
    def load(cls, path: Path) -> ArmCalibration:
        try:
            d = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise DeviceError(f"calibration {path}: file not found") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise DeviceError(f"calibration {path}: not readable JSON ({exc})") from None
        if not isinstance(d, dict):
            raise DeviceError(f"calibration {path}: expected a JSON object")
        return cls.from_dict(d, str(path))


def default_calibration(bus: str, robot: str | None = None) -> ArmCalibration:
    """A 6-joint arm (the joint names SO-101 and Koch arms share), servo ids 1..6,
    zero at the servo's mid position (2048), +/-1.5 rad; a starting point to edit."""
    names = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
    joints = tuple(
        JointCalibration(n, i + 1, 2048.0, 1 if i % 2 == 0 else -1, -1.5, 1.5, 3.0, 3.0)
        for i, n in enumerate(names)
    )
    return ArmCalibration(robot or ("so101" if bus == "feetech" else "koch"), bus, joints)
