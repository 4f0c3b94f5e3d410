"""Which drivers the agent can serve, and how each is built from command-line options
(`python -m devices.robots.agent.serve --driver NAME`, `python main.py agent serve …`).

Each entry returns a `Served`: the (not yet started) driver, the safety config it starts
with, camera feeds, and whatever must be closed after the driver (an emulated bus). Vendor
SDKs are imported only by the entry that needs them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import DeviceError
from devices.robots.agent.drivers import DRIVER_NAMES, dynamixel, feetech
from devices.robots.agent.drivers.arm_calibration import ArmCalibration, default_calibration
from devices.robots.agent.drivers.franka import FrankaDriver
from devices.robots.agent.drivers.ideal import IdealDriver
from devices.robots.agent.drivers.interface import RobotDriver
from devices.robots.agent.drivers.lab import LAB_WORKSPACE, lab_cameras
from devices.robots.agent.emulators.dynamixel_bus import DynamixelBus
from devices.robots.agent.emulators.feetech_bus import FeetechBus
from devices.robots.agent.safety_config import SafetyConfig, default_config
from devices.robots.agent.server import CameraFeed


@dataclass
class Served:
    driver: RobotDriver
    safety: SafetyConfig
    cameras: dict[str, CameraFeed] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)
    label: str = ""
    realtime_ok: bool = True  # False: a peer (emulated bus) shares the process; no SCHED_FIFO


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of every driver (each help line says whose)."""
    g = p.add_argument_group("lab (--driver lab)")
    g.add_argument("--scene", default="panda_table", help="lab scene name (devices.lab.scenes)")
    g.add_argument("--config", type=Path, default=None, help="lab config JSON (hidden truth)")
    g.add_argument("--camera-size", default="424x240", help="lab camera resolution WxH")
    g.add_argument("--camera-fps", type=int, default=15, help="lab camera frame rate")
    g.add_argument("--no-cameras", action="store_true", help="serve no cameras")
    g = p.add_argument_group("servo arms (--driver dynamixel | feetech)")
    g.add_argument("--device", default=None, help="serial port of the bus, e.g. /dev/ttyUSB0")
    g.add_argument("--calibration", type=Path, default=None, help="per-joint calibration JSON")
    g.add_argument("--urdf", type=Path, default=None, help="the arm's URDF (default: generated)")
    g.add_argument("--baud", type=int, default=1_000_000, help="bus baud rate")
    g.add_argument("--rate", type=float, default=100.0, help="control rate, Hz (servo arms)")
    g.add_argument(
        "--emulate",
        action="store_true",
        help="serve an emulated bus on a pseudo-terminal instead of --device (demos, tests)",
    )
    g = p.add_argument_group("Franka (--driver franka)")
    g.add_argument("--robot-ip", default=None, help="the arm's FCI address (or franky-sim's)")
    g.add_argument(
        "--dynamics-factor",
        type=float,
        default=0.1,
        help="franky relative dynamics factor for its own motion generator (0-1]",
    )


def _servo(vendor: str, args: argparse.Namespace) -> Served:
    closers: list[Callable[[], None]] = []
    if args.calibration is not None:
        cal = ArmCalibration.load(args.calibration)
    elif args.emulate:
        cal = default_calibration(vendor)
    else:
        raise DeviceError(
            f"--driver {vendor}: give the arm's --calibration JSON (offset, direction and range "
            "per joint); without it the driver cannot know where the joints' limits are"
        )
    device = args.device
    if args.emulate:
        Bus = DynamixelBus if vendor == "dynamixel" else FeetechBus
        mid = [(j.min + j.max) / 2 for j in cal.joints]
        bus = Bus(
            cal.ids, positions=[float(t) for t in cal.to_ticks(np.array(mid))], baud=args.baud
        )
        bus.start()
        closers.append(bus.close)
        device = bus.port
    if not device:
        raise DeviceError(f"--driver {vendor}: give --device (the bus's serial port) or --emulate")
    make_driver = dynamixel.make_driver if vendor == "dynamixel" else feetech.make_driver
    driver = make_driver(device, cal, rate_hz=args.rate, baud=args.baud, urdf=args.urdf)
    return Served(
        driver,
        default_config(driver.info()),
        closers=closers,
        label=f"{vendor} {device}" + (" (emulated)" if args.emulate else ""),
        realtime_ok=not args.emulate,
    )


def _dynamixel(args: argparse.Namespace) -> Served:
    return _servo("dynamixel", args)


def _feetech(args: argparse.Namespace) -> Served:
    return _servo("feetech", args)


def _franka(args: argparse.Namespace) -> Served:
    if not args.robot_ip:
        raise DeviceError("--driver franka: give --robot-ip (the arm's FCI address)")
    driver = FrankaDriver(args.robot_ip, rate_hz=args.rate, dynamics_factor=args.dynamics_factor)
    return Served(driver, default_config(driver.info()), label=f"franka {args.robot_ip}")


def _lab(args: argparse.Namespace) -> Served:
    from devices.lab.driver import make_driver  # MuJoCo is imported only here

    driver = make_driver(args.scene, args.config, start=False)
    info = driver.info()
    safety = default_config(info)
    if safety.workspace_lower is None and len(info.joint_names) == 7:
        safety = SafetyConfig(
            workspace_lower=LAB_WORKSPACE["lower"], workspace_upper=LAB_WORKSPACE["upper"]
        )
    cams: dict[str, CameraFeed] = {}
    if not args.no_cameras and info.cameras:
        cams = lab_cameras(driver, args.scene, args.config, args.camera_size, args.camera_fps)
        for name in cams:  # clients size their frame waits from it (the driver's own info)
            info.meta[f"camera/{name}/fps"] = float(args.camera_fps)
    return Served(driver, safety, cams, label=f"lab {args.scene}")


def _ideal(args: argparse.Namespace) -> Served:
    driver = IdealDriver()
    return Served(driver, default_config(driver.info()), label="ideal")


# one builder per name in DRIVER_NAMES (devices/robots/agent/drivers/__init__.py), named `_<name>`
DRIVERS: dict[str, Callable[[argparse.Namespace], Served]] = {
    name: globals()[f"_{name}"] for name in DRIVER_NAMES
}


def build(name: str, args: Any) -> Served:
    if name not in DRIVERS:
        raise DeviceError(f"unknown driver {name!r} (known: {', '.join(DRIVERS)})")
    return DRIVERS[name](args)
