"""`python main.py import --project P FILE... --mapping MAP [--twin T]`: logs from any lab
(CSV, Parquet or NPZ) through a column-mapping file into trajectory artifacts.
`import --project P --rig qube_servo2|simple_pendulum|cube_toss [--urdf FILE]`: a twin of a
real rig.

Mappings for the shared real recordings ship in resources/mappings/ and can be named by
their stem (`--mapping simple_pendulum`); see devices/mapping.py for the format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devices.errors import DataFileError
from resources import path
from resources.project import Project

HELP = (
    "Import recordings (CSV/Parquet/NPZ + a column-mapping JSON) as trajectory artifacts, "
    "or a twin of a real rig (--rig). Bundled mappings: simple_pendulum, furuta_pendulum, "
    "cube_tosses, lerobot_export."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    p.add_argument("files", type=Path, nargs="*", help="recording files")
    p.add_argument("--mapping", default=None, help="mapping JSON file, or a bundled mapping name")
    p.add_argument("--twin", default=None, help="check the recordings against this twin")
    p.add_argument("--name", default=None, help="recording name (one file only)")
    p.add_argument(
        "--rig", default=None, help="import a rig twin: qube_servo2 | simple_pendulum | cube_toss"
    )
    p.add_argument("--urdf", type=Path, default=None, help="the rig's URDF (simple_pendulum)")


def mapping_path(name: str) -> Path:
    """A mapping file path, or a bundled mapping by name (resources/mappings/NAME.json)."""

    p = Path(name)
    if p.suffix == ".json" or p.exists():
        return p
    return path("mappings", f"{name}.json")


def run(args: argparse.Namespace) -> int:
    # pybullet + trimesh (0.6 s): `import --help` and usage errors answer without them (app/cli.py)
    from app.workflows.fit import import_recording, import_rig_twin

    project = Project.open(args.project)
    if args.rig:
        tid = import_rig_twin(project, args.rig, args.urdf)
        print(f"twin {tid}: rig {args.rig}")
        return 0
    if not args.files or not args.mapping:
        raise DataFileError("import: give recording FILE(s) and --mapping MAP (or --rig NAME)")
    if args.name and len(args.files) > 1:
        raise DataFileError("import: --name is for a single file")
    mapping = mapping_path(args.mapping)
    for f in args.files:
        tid = import_recording(project, f, mapping, args.twin, args.name)
        art = project.artifact(tid)
        print(f"trajectory {tid}: {art.summary}")
        for w in art.settings.get("warnings") or ():
            print(f"warning: {w}", file=sys.stderr)
    return 0
