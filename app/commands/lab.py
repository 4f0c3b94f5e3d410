"""`python main.py lab serve --scene NAME --config FILE --port P --token-file F`.

Runs the virtual lab exactly like a robot: it is `python -m devices.robots.agent.serve --driver lab`
(devices/robots/agent/serve.py) — the MuJoCo lab driver, the robot agent (safety envelope,
watchdog, policy runner) and the protocol server, plus the lab cameras streamed at the
requested resolution and rate. Runs until Ctrl-C / SIGTERM and leaves the robot held.
The lab is its own process, never the app's: main.py runs devices/robots/agent/serve.py for it
directly, and `serve` is listed here only so `lab --help` shows it (docs/ARCHITECTURE.md §2).
"""

from __future__ import annotations

import argparse

from app.commands.agent import robot_process

HELP = "Run the virtual lab (MuJoCo) as a robot + camera server speaking the robot protocol."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("serve", help="serve a lab scene until Ctrl-C / SIGTERM")


def run(args: argparse.Namespace) -> int:
    raise robot_process("lab")
