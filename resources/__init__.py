"""Bundled resources: robot descriptions, icons, the demo project, small sample data.

`path("robots", "pendulum.urdf")` finds a bundled file; nothing else in the tree hard-codes
where resources live.
"""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parent


def path(*parts: str) -> Path:
    """Return the absolute path of a bundled resource (it need not exist)."""
    return _ROOT.joinpath(*parts)


def shared_data(*parts: str) -> Path:
    """Return a path in the shared real-hardware data folder (../shared/data next to the repo).

    The folder lives beside the repository, never inside it; `$TWINBENCH_SHARED_DATA` (the
    folder that holds `real/`) overrides. The one place that knows where it is: benchmarks and
    tests all ask here.
    """
    import os

    base = os.environ.get("TWINBENCH_SHARED_DATA")
    root = Path(base) if base else _ROOT.parent.parent / "shared" / "data"
    return root.joinpath(*parts)
