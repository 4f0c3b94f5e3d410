"""TwinSpec <-> JSON (versioned). Kept apart from spec.py so the types stay readable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from twins.errors import TwinError
from twins.params import ParamSet
from twins.spec import (
    FORMAT,
    FORMAT_VERSION,
    ActuatorSpec,
    EnvironmentSpec,
    JointSpec,
    ObjectSpec,
    RobotSpec,
    Shape,
    TwinSpec,
)


def _obj_to_json(o: ObjectSpec) -> dict[str, Any]:
    d = asdict(o)
    d["shape"] = asdict(o.shape)
    return d


def _obj_from_json(d: Mapping[str, Any]) -> ObjectSpec:
    s = d["shape"]
    shape = Shape(
        s["kind"],
        tuple(s.get("size", ())),
        s.get("mesh"),
        tuple(s.get("hulls", ())),
        tuple(s.get("collision_pose", (0, 0, 0, 0, 0, 0, 1))),
    )
    return ObjectSpec(
        name=str(d["name"]),
        shape=shape,
        pose=tuple(d["pose"]),
        static=bool(d.get("static")),
        mass_from=str(d.get("mass_from", "mass")),
        volume=float(d.get("volume", 0.0)),
        com=tuple(d.get("com", (0, 0, 0))),
        inertia_per_kg=tuple(d["inertia_per_kg"]),
        rgba=tuple(d.get("rgba", (0.8, 0.5, 0.2, 1.0))),
        source=str(d.get("source", "")),
    )


def spec_to_json(spec: TwinSpec) -> dict[str, Any]:
    """A JSON-ready dict with `format` and `format_version`."""
    robot = None
    if spec.robot is not None:
        r = spec.robot
        robot = {
            "urdf": r.urdf,
            "name": r.name,
            "base_pose": list(r.base_pose),
            "fixed_base": r.fixed_base,
            "joints": [asdict(j) for j in r.joints],
            "actuators": [asdict(a) for a in r.actuators],
            "links": list(r.links),
            "initial_joint_pos": list(r.initial_joint_pos),
            "notes": list(r.notes),
        }
    env = spec.environment
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": spec.name,
        "contact_model": spec.contact_model,
        "object_sleeping": spec.object_sleeping,
        "meta": dict(spec.meta),
        "params": spec.params.to_json(),
        "robot": robot,
        "environment": {
            "ground": env.ground,
            "ground_z": env.ground_z,
            "table": _obj_to_json(env.table) if env.table else None,
        },
        "objects": [_obj_to_json(o) for o in spec.objects],
    }


def spec_from_json(d: Mapping[str, Any], base_dir: Path | None = None) -> TwinSpec:
    """Inverse of `spec_to_json`; refuses other formats and newer versions clearly."""
    if not isinstance(d, Mapping) or d.get("format") != FORMAT:
        raise TwinError("not a Twinbench twin (format field missing)")
    version = d.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise TwinError(
            f"twin format version {version!r} is not supported (this Twinbench "
            f"reads up to {FORMAT_VERSION})"
        )
    try:
        robot = None
        if d.get("robot"):
            r = d["robot"]
            robot = RobotSpec(
                urdf=str(r["urdf"]),
                name=str(r.get("name", "robot")),
                base_pose=tuple(r["base_pose"]),
                fixed_base=bool(r.get("fixed_base", True)),
                joints=tuple(JointSpec(**j) for j in r.get("joints", [])),
                actuators=tuple(ActuatorSpec(**a) for a in r.get("actuators", [])),
                links=tuple(r.get("links", [])),
                initial_joint_pos=tuple(r.get("initial_joint_pos", [])),
                notes=tuple(r.get("notes", [])),
            )
        env_d = d.get("environment") or {}
        env = EnvironmentSpec(
            bool(env_d.get("ground", True)),
            _obj_from_json(env_d["table"]) if env_d.get("table") else None,
            float(env_d.get("ground_z", 0.0)),
        )
        return TwinSpec(
            name=str(d["name"]),
            params=ParamSet.from_json(d["params"]),
            robot=robot,
            environment=env,
            objects=tuple(_obj_from_json(o) for o in d.get("objects", [])),
            meta=dict(d.get("meta", {})),
            base_dir=base_dir,
            contact_model=str(d.get("contact_model", "rigid")),
            object_sleeping=bool(d.get("object_sleeping", True)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TwinError(f"corrupt twin description ({exc!r})") from exc
