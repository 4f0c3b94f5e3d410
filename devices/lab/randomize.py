"""New hidden truths for a scene: the default config with its physics perturbed.

Benchmarks use this to run a fit or a policy against several "realities" whose parameters
nobody has seen (MuJoCo-Playground's `domain_randomize`, done on the config so the result
is a plain JSON file the lab can be started with).

    cfg = randomized_config("panda_table", np.random.default_rng(7))
    cfg.save(tmp / "reality.json")
"""

from __future__ import annotations

import dataclasses

import numpy as np

from devices.lab.config import LabConfig
from devices.lab.scenes import get_scene


def _scale(values: tuple[float, ...], rng: np.random.Generator, rel: float) -> tuple[float, ...]:
    return tuple(float(v * rng.uniform(1 - rel, 1 + rel)) for v in values)


def _scale3(
    values: tuple[float, float, float], rng: np.random.Generator, rel: float
) -> tuple[float, float, float]:
    x, y, z = _scale(values, rng, rel)
    return (x, y, z)


def randomized_config(
    scene: str, rng: np.random.Generator, rel: float = 0.25, base: LabConfig | None = None
) -> LabConfig:
    """`base` (default: the scene's default) with masses, friction, restitution, COM
    offsets, joint damping/friction/armature, PD gains, force limits and latency each
    scaled by an independent factor in [1 - rel, 1 + rel]. Geometry, cameras and
    initial poses are kept, so objects still rest where the config says."""
    cfg = base or get_scene(scene).default_config()
    objects = tuple(
        dataclasses.replace(
            o,
            mass=o.mass * rng.uniform(1 - rel, 1 + rel),
            friction=o.friction * rng.uniform(1 - rel, 1 + rel),
            restitution=float(np.clip(o.restitution * rng.uniform(1 - rel, 1 + rel), 0, 0.85)),
            com_offset=_scale3(o.com_offset, rng, rel),
        )
        for o in cfg.objects
    )  # type: ignore[arg-type]
    joints = cfg.joints and dataclasses.replace(
        cfg.joints,
        damping=_scale(cfg.joints.damping, rng, rel),
        frictionloss=_scale(cfg.joints.frictionloss, rng, rel),
        armature=_scale(cfg.joints.armature, rng, rel),
    )
    act = cfg.actuators and dataclasses.replace(
        cfg.actuators,
        kp=_scale(cfg.actuators.kp, rng, rel),
        kv=_scale(cfg.actuators.kv, rng, rel),
        force_limit=_scale(cfg.actuators.force_limit, rng, rel),
    )
    out = dataclasses.replace(
        cfg,
        objects=objects,
        joints=joints,
        actuators=act,
        latency_s=cfg.latency_s * rng.uniform(1 - rel, 1 + rel),
        seed=int(rng.integers(2**31)),
    )
    out.validate()
    return out
