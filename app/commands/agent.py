"""`python main.py agent serve --driver franka|dynamixel|feetech|lab …`: run the robot agent
on the robot's computer (the same code as `python -m devices.robots.agent.serve`, which needs no
checkout of the workbench's entry point). The agent is the robot's own process, not the
app's: main.py runs devices/robots/agent/serve.py for it directly, and `serve` is listed here only
so `agent --help` shows it (docs/ARCHITECTURE.md §2).

`python main.py agent describe --host H --port P --token-file F --out DIR`: connect to an
agent and save the robot description it sends (URDF, limits, calibration) into DIR, ready
for `twin build --robot DIR/<robot>.urdf`."""

from __future__ import annotations

import argparse
from pathlib import Path

from devices.robots.wire.auth import load_token
from resources.errors import TwinbenchError

HELP = "Run the robot agent in front of a driver, or save a connected robot's description."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("serve", help="serve a robot over the robot protocol until Ctrl-C")
    d = sub.add_parser("describe", help="save a connected robot's URDF, limits, calibration")
    d.add_argument("--host", default="127.0.0.1", help="the agent's address")
    d.add_argument("--port", type=int, default=7700, help="the agent's port")
    d.add_argument("--token-file", type=Path, default=None, help="access token file")
    d.add_argument("--tls-fingerprint", default=None, help="pinned certificate (sha256:…)")
    d.add_argument("--out", type=Path, required=True, help="folder to write the bundle into")


def run(args: argparse.Namespace) -> int:
    if args.action == "describe":
        # pybullet + numpy (0.1-0.15 s, importtime): `agent --help` and usage errors answer without them (app/cli.py)
        from app.robot_check import save_bundle
        from app.robot_link import connect_agent

        link = connect_agent(
            f"{args.host}:{args.port}", load_token(args.token_file), args.tls_fingerprint
        )
        try:
            urdf = save_bundle(link.info(), args.out)
        finally:
            link.close()
        info = link.info()
        print(f"{info.name}: {len(info.joint_names)} joints; robot description in {urdf.parent}")
        print(f"build its twin: python main.py twin build --robot {urdf} …")
        return 0
    raise robot_process("agent")


def robot_process(command: str) -> TwinbenchError:
    """`agent serve` / `lab serve` reached through app's CLI instead of main.py."""
    return TwinbenchError(
        f"`{command} serve` runs as the robot's own process: start it with "
        f"`python main.py {command} serve …` (or `python -m devices.robots.agent.serve …`)"
    )
