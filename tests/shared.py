"""The shared real recordings for tests: `real_data(name, must_have)` is the folder, or the
test is skipped naming where it looked (resources.shared_data decides where that is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources import shared_data

REPO = Path(__file__).resolve().parents[1]
# the project's own packages, top floor first (docs/ARCHITECTURE.md §2)
PROJECT_PACKAGES = (
    "benches",
    "widgets",
    "app",
    "policies",
    "twins",
    "reconstruction",
    "devices",
    "resources",
)


def real_data(name: str, must_have: str = "") -> Path:
    folder = shared_data("real", name)
    if not (folder / must_have).exists():
        pytest.skip(f"shared data {folder / must_have} not found (set TWINBENCH_SHARED_DATA)")
    return folder
