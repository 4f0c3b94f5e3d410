"""`python main.py agent serve --driver franka|dynamixel|feetech|lab …`: run the robot agent
on the robot's computer (the same code as `python -m devices.robots.serve`, which needs no
checkout of the workbench's entry point)."""

from __future__ import annotations

import argparse

HELP = "Run the robot agent (safety envelope, watchdog, policy runner) in front of a driver."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from devices.robots.serve import add_arguments as serve_arguments

    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("serve", help="serve a robot over the robot protocol until Ctrl-C")
    serve_arguments(s)


def run(args: argparse.Namespace) -> int:
    from devices.robots.serve import run as serve

    return serve(args)
