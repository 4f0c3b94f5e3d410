"""`python main.py lab serve --scene NAME --config FILE --port P --token-file F`.

Runs the virtual lab exactly like a robot: the MuJoCo lab driver, the robot agent (safety
envelope, watchdog, policy runner) and the protocol server, plus the lab cameras streamed at
the requested resolution and rate. Runs until Ctrl-C / SIGTERM and leaves the robot held.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from devices.errors import DeviceError
from devices.robots.agent import Agent
from devices.robots.auth import TOKEN_ENV, load_token
from devices.robots.drivers.lab import LAB_WORKSPACE, lab_cameras
from devices.robots.safety import SafetyConfig, default_config
from devices.robots.server import CameraFeed, RobotServer
from devices.robots.timing import set_realtime
from devices.robots.watchdog import WatchdogConfig

HELP = "Run the virtual lab (MuJoCo) as a robot + camera server speaking the robot protocol."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("serve", help="serve a lab scene until Ctrl-C / SIGTERM")
    s.add_argument("--scene", default="panda_table", help="lab scene name (devices.lab.scenes)")
    s.add_argument(
        "--config",
        type=Path,
        default=None,
        help="lab config JSON with the hidden truth (default: the scene's)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default loopback; any other address needs --allow-remote)",
    )
    s.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host; turns TLS on (clients pin the certificate)",
    )
    s.add_argument(
        "--tls",
        action="store_true",
        help="serve TLS even on loopback (always on with --allow-remote)",
    )
    s.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        help="folder of the TLS certificate and key, made on first use "
        "(default ~/.config/twinbench/tls)",
    )
    s.add_argument("--port", type=int, default=7700, help="TCP port (0: any free port)")
    s.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"file holding the access token (default: ${TOKEN_ENV})",
    )
    s.add_argument("--camera-size", default="424x240", help="lab camera resolution WxH")
    s.add_argument("--camera-fps", type=int, default=15, help="lab camera frame rate")
    s.add_argument("--no-cameras", action="store_true", help="serve no cameras")
    s.add_argument(
        "--rt-priority",
        type=int,
        default=20,
        help="SCHED_FIFO priority for the control and physics threads where the OS "
        "allows it (0: normal scheduling)",
    )
    s.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when stdin closes (the launching process ended or crashed)",
    )
    s.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=0.25,
        help="watchdog: stop when the controlling client is silent this long (s)",
    )


def build(args: argparse.Namespace) -> tuple[Agent, RobotServer]:
    """The lab driver, agent and server described by `args` (not yet started)."""
    from devices.lab.driver import make_driver  # MuJoCo is imported only here
    from devices.robots.server import is_loopback

    token = load_token(args.token_file)
    if not is_loopback(args.host) and not args.allow_remote:
        raise DeviceError(
            f"lab serve: refusing --host {args.host}: that exposes the robot to the network. "
            "Add --allow-remote (TLS is then on; clients pin the certificate fingerprint "
            "printed at start) or bind 127.0.0.1"
        )
    driver = make_driver(args.scene, args.config, start=False)
    info = driver.info()
    safety = default_config(info)
    if safety.workspace_lower is None and len(info.joint_names) == 7:
        safety = SafetyConfig(
            workspace_lower=LAB_WORKSPACE["lower"], workspace_upper=LAB_WORKSPACE["upper"]
        )
    agent = Agent(
        driver,
        safety=safety,
        watchdog=WatchdogConfig(heartbeat_timeout_s=args.heartbeat_timeout),
        realtime_priority=args.rt_priority or None,
    )
    cameras: dict[str, CameraFeed] = {}
    if not args.no_cameras and info.cameras:
        cameras = lab_cameras(driver, args.scene, args.config, args.camera_size, args.camera_fps)
    tls_ctx = None
    if args.allow_remote or args.tls:
        from devices.robots.tls import (
            default_tls_dir,
            ensure_certificate,
            fingerprint,
            server_context,
        )

        cert, key = ensure_certificate(args.tls_dir or default_tls_dir())
        tls_ctx = server_context(cert, key)
        print(f"lab serve: TLS certificate {cert}, fingerprint {fingerprint(cert)}", flush=True)
    server = RobotServer(
        agent,
        token,
        host=args.host,
        port=args.port,
        cameras=cameras,
        tls=tls_ctx,
        allow_remote=args.allow_remote,
    )
    return agent, server


def run(args: argparse.Namespace) -> int:
    # Short GIL switch interval: the 250 Hz control thread must not wait 5 ms behind the
    # physics, camera and network threads.
    sys.setswitchinterval(0.0005)
    agent, server = build(args)
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.exit_with_parent:

        def watch_parent() -> None:
            while sys.stdin.buffer.read(4096):
                pass
            done.set()

        threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="lab serve: %(message)s")
    # Everything imported and built so far lives for the whole run: keep it out of the
    # cyclic GC's full collections, which otherwise stall every thread for tens of ms.
    gc.freeze()
    agent.add_event_listener(
        lambda kind, message, data: print(
            f"lab serve: {message if message.startswith(kind) else f'{kind}: {message}'}",
            flush=True,
        )
    )
    agent.start()
    try:
        if args.rt_priority:  # the lab's physics thread is as time-critical as the agent's
            for t in threading.enumerate():
                if t.name.startswith("lab-") and t.native_id is not None:
                    set_realtime(args.rt_priority, t.native_id)
        server.start()
        info = agent.info
        print(
            f"lab {args.scene}: {info.name}, {len(info.joint_names)} joints at "
            f"{info.control_rate_hz:g} Hz, cameras: {', '.join(server.cameras) or 'none'}",
            flush=True,
        )
        time.sleep(0.05)
        rt = "SCHED_FIFO" if agent.realtime else "normal scheduling"
        print(f"lab serve: control loop {rt}; listening on {server.host}:{server.port}", flush=True)
        while not done.wait(0.5):
            pass
    finally:
        server.close()
        agent.close()
        print("lab serve: stopped (robot held)", flush=True)
    return 0
