"""Shared fixtures: the procedural demo twin (Panda + table objects), built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from twins.from_scan import build_twin
from twins.scan_input import procedural_scan
from twins.spec import TwinSpec


@pytest.fixture(scope="session")
def demo_twin(tmp_path_factory: pytest.TempPathFactory) -> TwinSpec:
    folder = Path(tmp_path_factory.mktemp("twin")) / "demo"
    return build_twin(procedural_scan(), folder, name="demo")
