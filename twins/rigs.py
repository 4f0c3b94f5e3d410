"""Twins of the two real rigs in ../shared/data/real, with their authors' published values.

- Simple pendulum (DFKI, AK80-6 motor, torque control): the CAD URDF (its meshes are
  missing: drawn as inertia boxes, no collision — said in the twin's notes) with the
  authors' identification  tau = J qdd + m cx g sin q + Fv qd + Fc atan(100 qd) + offset:
  link mass m = (m cx) / d with d the CAD com distance from the axis (mass scales the CAD
  inertia), armature = J - (link inertia about the axis), joint damping Fv, joint friction
  Fc pi / 2 (where Fc atan(100 qd) saturates), actuator bias -offset.
- Qube-Servo 2 (Furuta): resources/robots/qube_servo2.urdf, a DC motor (8.4 ohm,
  0.042 V*s/rad) on the arm, the pendulum passive.
- Cube tosses (ContactNets): a free 0.1048 m cube over the table, no scan and no robot; its
  contact with the table is one contact pair (twins/contacts.py), so μ and e are the
  pair's as the authors identified them (μ 0.18, e 0.125), not PyBullet's products.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from devices.trajectory import Trajectory
from resources import path as resource_path
from twins.make import assemble, primitive_object, robot_from_urdf, sim_params, with_contact_pair
from twins.spec import TwinSpec, param
from twins.urdf import loadable_urdf, read_urdf

# authors' identification (results_..._system_identification.txt)
PENDULUM_ID = {
    "J": 6.259e-02,
    "m_cx": 1.022e-01,
    "Fv": 4.707e-02,
    "Fc": 1.839e-01,
    "offset": -7.586e-02,
}
# CAD values of Link_1 in data_urdf_dfki_simple_pendulum.urdf
_CAD_MASS, _CAD_COM_DIST, _CAD_IXX = 0.67531, 0.4338, 0.0033459


def pendulum_values(identified: dict[str, float] = PENDULUM_ID) -> dict[str, float]:
    """Twin parameter values equivalent to the authors' identified model."""
    m = identified["m_cx"] / _CAD_COM_DIST
    j_link = _CAD_IXX * m / _CAD_MASS + m * _CAD_COM_DIST**2
    return {
        "robot.links.Link_1.mass": m,
        "robot.joints.Joint_1.armature": identified["J"] - j_link,
        "robot.joints.Joint_1.damping": identified["Fv"],
        # Fc atan(100 qd) saturates at Fc * pi / 2: that is the Coulomb level
        "robot.joints.Joint_1.friction": identified["Fc"] * np.pi / 2,
        "robot.actuators.Joint_1.bias": -identified["offset"],
    }


def simple_pendulum_twin(
    urdf: Path, folder: Path | None = None, time_step: float = 1e-3
) -> TwinSpec:
    """The pendulum twin at the authors' values (nominals); `folder` receives the repaired
    URDF (default: a cache folder)."""
    loadable, notes = loadable_urdf(Path(urdf), folder)
    ref = str(loadable.relative_to(folder)) if folder else str(loadable)
    robot, params = robot_from_urdf(
        ref, loadable, actuator="torque", notes=notes, time_step=time_step
    )
    spec = assemble(
        "simple_pendulum",
        (robot, params),
        ground=False,
        sim=sim_params(time_step=time_step),
        base_dir=folder,
        meta={"source": str(Path(urdf).name), "notes": notes},
    )
    vals = pendulum_values()
    # the identified damping and friction lie above the CAD defaults' bounds; widen them
    widened = [
        param(n, spec.params[n].unit, spec.params[n].nominal, 0.0, 2.0)
        for n in ("robot.joints.Joint_1.damping", "robot.joints.Joint_1.friction")
    ]
    spec = spec.__class__(**{**spec.__dict__, "params": spec.params.replace(*widened)})
    return spec.with_values(vals)


def qube_twin(time_step: float = 1e-3) -> TwinSpec:
    """The Qube-Servo 2 at its published nominal values."""
    urdf = resource_path("robots", "qube_servo2.urdf")
    read_urdf(urdf)
    robot, params = robot_from_urdf(
        "resources:robots/qube_servo2.urdf",
        urdf,
        actuator="dc_motor",
        actuated=["arm"],
        time_step=time_step,
    )
    spec = assemble(
        "qube_servo2", (robot, params), ground=False, sim=sim_params(time_step=time_step)
    )
    return spec.with_values(
        {
            "robot.actuators.arm.resistance": 8.4,
            "robot.actuators.arm.k_emf": 0.042,
            "robot.actuators.arm.voltage_limit": 12.0,
        }
    )


# ContactNets' cube (Pfrommer et al., CoRL 2020): side and their identified contact
CUBE_SIDE_M = 0.1048
CUBE_ID = {"friction": 0.18, "restitution": 0.125}


def cube_toss_twin(
    table_z: float = -0.001,
    side: float = CUBE_SIDE_M,
    mass: float = 0.37,
    friction: float = 0.5,
    restitution: float = 0.1,
    time_step: float = 1.0 / 480,
) -> TwinSpec:
    """A free uniform cube `side` m wide over a table plane at height `table_z` (m), its
    contact with the table one pair (`contacts.cube.ground.friction|restitution`, nominal
    `friction` and `restitution`). The mass is not known from the data and does not change
    a toss with rigid contacts (every force scales with it); `mass` only makes the body
    dynamic. The cube starts in the air (each replay places it as its recording says) and
    never sleeps."""
    from dataclasses import replace

    h = side / 2
    cube = primitive_object("cube", "box", (h, h, h), (0, 0, table_z + 4 * h, 0, 0, 0, 1), mass)
    spec = assemble(
        "cube_toss",
        objects=[cube],
        ground_z=table_z,
        sim=sim_params(time_step=time_step),
        meta={"source": "ContactNets cube tosses (DAIRLab/contact-nets)"},
    )
    spec = replace(spec, object_sleeping=False)
    return with_contact_pair(spec, "cube", "ground", friction, restitution)


def cube_authors_values() -> dict[str, float]:
    """The authors' identified contact (μ, e) as the cube twin's parameter values."""
    return {f"contacts.cube.ground.{k}": v for k, v in CUBE_ID.items()}


def table_height(recordings: Sequence[Trajectory], side: float = CUBE_SIDE_M) -> float:
    """The table's height (m) from where tossed cubes come to rest: the median of each
    recording's last centre height, minus half the side."""
    z = [float(r["objects/cube/pose"][-1, 2]) for r in recordings]
    return float(np.median(z)) - side / 2
