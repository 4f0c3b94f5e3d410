"""The robot-description bundle a driver puts in `RobotInfo.meta["bundle"]`, so the workbench
can build the twin of whatever it is connected to: URDF text, joint limits, calibration.

For a servo arm without a URDF file of its own, `servo_arm_urdf` writes a plain serial chain
(SO-101 / Koch proportions: pan about z, then pitch joints about y, a roll about x) whose
joint names and limits are the calibration's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from devices.errors import DeviceError
from devices.robots.agent.drivers.arm_calibration import ArmCalibration

BUNDLE_FORMAT = 1
# (axis, offset of the joint from the previous one in m) for up to 6 joints of a desk arm
CHAIN = (
    ("0 0 1", "0 0 0.05"),
    ("0 1 0", "0 0 0.06"),
    ("0 1 0", "0.11 0 0"),
    ("0 1 0", "0.13 0 0"),
    ("1 0 0", "0.06 0 0"),
    ("0 1 0", "0.04 0 0"),
)


def servo_arm_urdf(cal: ArmCalibration) -> str:
    """A URDF serial chain with the calibration's joint names and ranges."""
    # the base has an inertial too: without one PyBullet warns on every load and invents 1 kg
    links = [
        '  <link name="base_link"><inertial><mass value="0.5"/>'
        '<inertia ixx="1e-3" iyy="1e-3" izz="1e-3" ixy="0" ixz="0" iyz="0"/></inertial></link>'
    ]
    joints = []
    parent = "base_link"
    for k, j in enumerate(cal.joints):
        axis, xyz = CHAIN[min(k, len(CHAIN) - 1)]
        child = f"link{k + 1}"
        links.append(
            f'  <link name="{child}"><inertial><mass value="0.1"/>'
            '<inertia ixx="1e-4" iyy="1e-4" izz="1e-4" ixy="0" ixz="0" iyz="0"/></inertial>'
            f'<visual><geometry><cylinder radius="0.015" length="0.05"/></geometry></visual>'
            "</link>"
        )
        joints.append(
            f'  <joint name={quoteattr(j.name)} type="revolute">'
            f'<parent link="{parent}"/><child link="{child}"/>'
            f'<origin xyz="{xyz}" rpy="0 0 0"/><axis xyz="{axis}"/>'
            f'<limit lower="{j.min}" upper="{j.max}" velocity="{j.velocity}" '
            f'effort="{j.effort}"/></joint>'
        )
        parent = child
    body = "\n".join(links + joints)
    return f'<?xml version="1.0"?>\n<robot name={quoteattr(cal.robot)}>\n{body}\n</robot>\n'


def bundle(cal: ArmCalibration, urdf: Path | None = None) -> dict[str, Any]:
    """URDF (from `urdf`, or generated), limits and calibration of a servo arm."""
    if urdf is not None:
        try:
            text = Path(urdf).read_text()
        except OSError as exc:
            raise DeviceError(f"robot description {urdf}: not readable ({exc})") from None
        if "<robot" not in text:
            raise DeviceError(f"robot description {urdf}: not a URDF (no <robot> element)")
    else:
        text = servo_arm_urdf(cal)
    return {
        "format": BUNDLE_FORMAT,
        "urdf": text,
        "urdf_name": Path(urdf).name if urdf is not None else f"{cal.robot}.urdf",
        "limits": {
            "lower": [j.min for j in cal.joints],
            "upper": [j.max for j in cal.joints],
            "velocity": [j.velocity for j in cal.joints],
            "effort": [j.effort for j in cal.joints],
        },
        "calibration": cal.to_dict(),
    }
