"""`python main.py project new PATH` / `project info PATH`."""

from __future__ import annotations

import argparse
from pathlib import Path

from resources.project import Project

HELP = "Create a project folder, or list its artifacts and their lineage."


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    new = sub.add_parser("new", help="create a new empty project folder")
    new.add_argument("path", type=Path)
    new.add_argument("--name", default=None, help="display name (default: folder name)")
    info = sub.add_parser("info", help="list artifacts and lineage")
    info.add_argument("path", type=Path)


def run(args: argparse.Namespace) -> int:
    if args.action == "new":
        proj = Project.create(args.path, args.name)
        print(f"created project '{proj.name}' at {proj.root}")
    else:
        print(Project.open(args.path).describe())
    return 0
