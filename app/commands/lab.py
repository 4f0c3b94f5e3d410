"""`python main.py lab serve --scene NAME --config FILE --port P --token-file F`.

Runs the virtual lab exactly like a robot: it is `python -m devices.robots.serve --driver lab`
(devices/robots/serve.py) — the MuJoCo lab driver, the robot agent (safety envelope,
watchdog, policy runner) and the protocol server, plus the lab cameras streamed at the
requested resolution and rate. Runs until Ctrl-C / SIGTERM and leaves the robot held.
"""

from __future__ import annotations

import argparse

from devices.robots import serve

HELP = "Run the virtual lab (MuJoCo) as a robot + camera server speaking the robot protocol."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("serve", help="serve a lab scene until Ctrl-C / SIGTERM")
    serve.add_arguments(s, driver="lab")


def run(args: argparse.Namespace) -> int:
    return serve.run(args)
