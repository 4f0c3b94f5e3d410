"""Command line: `python main.py CMD ...`. Never imports Qt.

Commands are registered by module path and imported only when used, so `--help` stays fast
and a broken optional dependency only affects its own command. Each command module has
`HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.

Commands that live above app/ (the benchmarks) are passed in by main.py as `extra`
(name -> (module, summary)): app never imports, nor names, a higher floor
(docs/ARCHITECTURE.md §2).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence

from resources.errors import TwinbenchError

# name -> module. GUI entries (no module) are handled by main.py before the CLI is reached.
COMMANDS: dict[str, str] = {
    "project": "app.commands.project",
    "lab": "app.commands.lab",
    "agent": "app.commands.agent",
    "scan": "app.commands.scan",
    "twin": "app.commands.twin",
    "calibrate": "app.commands.calibrate",
    "import": "app.commands.import_",
    "export": "app.commands.export",
    "fit": "app.commands.fit",
    "record": "app.commands.record",
    "track": "app.commands.track",
    "design": "app.commands.design",
    "train": "app.commands.train",
    "evaluate": "app.commands.evaluate",
    "deploy": "app.commands.deploy",
}
GUI_COMMANDS: dict[str, str] = {
    "gui": "open the desktop app (the default when no command is given)",
    "demo": "open the desktop app with the virtual lab started and the demo project",
}

# Short help shown in `--help` without importing each module.
SUMMARIES: dict[str, str] = {
    "project": "create a project folder or list its artifacts and lineage",
    "lab": "run the virtual lab as a robot + camera server",
    "agent": "run the robot agent on a robot's computer (franka, dynamixel, feetech, lab)",
    "scan": "record/reconstruct a workspace from a camera source into a project",
    "twin": "build a digital twin from a scan (+ robot description), show it, set its values",
    "calibrate": "camera-robot (hand-eye) calibration from board images + robot poses",
    "import": "recordings (CSV/Parquet/NPZ + column mapping) into a project, or a rig twin",
    "export": "a trajectory artifact to LeRobot-style Parquet",
    "fit": "fit twin parameters to recorded trajectories; --apply makes a new twin version",
    "record": "play an excitation motion on a connected robot and record it into a project",
    "track": "object poses from a recording's camera stream (model-based tracking of the scan)",
    "design": "which recording to make next: library motions ranked by information gain",
    "train": "train a policy (reach, push) in the (randomized) twin into an ONNX policy artifact",
    "evaluate": "success rate of a policy in a twin, nominal or randomized, with a 95 %% interval",
    "deploy": "a policy onto a connected robot: spec check, twin prediction, run, record",
}

# A command registered from outside app/: (module, one-line summary for `--help`).
Extra = Mapping[str, tuple[str, str]]


def build_parser(load: str | None = None, extra: Extra | None = None) -> argparse.ArgumentParser:
    """Parser with every command (`extra` after app's own); only `load`'s module is imported
    for its arguments."""
    modules = {**COMMANDS, **{n: m for n, (m, _) in (extra or {}).items()}}
    summaries = {**SUMMARIES, **{n: h for n, (_, h) in (extra or {}).items()}}
    gui = "\n".join(f"  {n:<10} {d}" for n, d in GUI_COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="python main.py",
        description="Twinbench: scan a workspace, build and fit a digital twin, train and "
        "deploy policies.",
        epilog=f"desktop app:\n{gui}\n\n`python main.py COMMAND --help` explains a command.",
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
            prog, max_help_position=16, width=100
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in modules:
        p = sub.add_parser(name, help=summaries.get(name, ""))
        if name == load:
            mod = importlib.import_module(modules[name])
            p.description = getattr(mod, "HELP", summaries.get(name, ""))
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None, extra: Extra | None = None) -> int:
    """Run the CLI; returns the process exit code. TwinbenchError -> message, exit 2.
    `extra`: commands registered by the caller (main.py: `bench`)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    known = {*COMMANDS, *(extra or {})}
    load = args_list[0] if args_list and args_list[0] in known else None
    parser = build_parser(load, extra)
    args = parser.parse_args(args_list)
    if not getattr(args, "command", None) or not hasattr(args, "_run"):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except TwinbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cancelled", file=sys.stderr)
        return 130
