"""`python main.py export --project P --trajectory ID --out FILE.parquet`: a trajectory
artifact as one LeRobot-style Parquet episode (columns timestamp, frame_index,
episode_index, index, task_index, observation.state, observation.velocity,
observation.effort, action, observation.objects.<name>.pose; channel names and units in the
file's `twinbench` metadata). `resources/mappings/lerobot_export.json` imports it back."""

from __future__ import annotations

import argparse
from pathlib import Path

from resources.project import Project

HELP = "Export a trajectory artifact to LeRobot-style Parquet."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    p.add_argument("--trajectory", required=True, help="trajectory artifact id")
    p.add_argument("--out", type=Path, required=True, help="output .parquet file")


def run(args: argparse.Namespace) -> int:
    # pybullet + trimesh (0.58 s): `export --help` and usage errors answer without them (app/cli.py)
    from app.workflows.fit import export_recording

    out = export_recording(Project.open(args.project), args.trajectory, args.out)
    print(f"wrote {out}")
    return 0
