"""The command line: lists its commands, never loads Qt, reports errors as messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import sys, runpy
sys.argv = ["main.py"] + sys.argv[1:]
try:
    runpy.run_path("main.py", run_name="__main__")
except SystemExit as e:
    code = e.code
else:
    code = 0
qt = sorted(m for m in sys.modules if m.split(".")[0] in ("PySide6", "pyqtgraph", "shiboken6", "widgets"))
print("QTMODULES=" + ",".join(qt))
sys.exit(code)
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("QT_QPA_PLATFORM", None)
    return subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_lists_design_commands_without_qt() -> None:
    res = _cli("--help")
    assert res.returncode == 0, res.stderr
    for cmd in ("demo", "project", "bench", "lab", "scan", "twin"):
        lines = [ln for ln in res.stdout.splitlines() if ln.strip().split(" ")[0] == cmd]
        assert len(lines) == 1, f"'{cmd}' listed {len(lines)} times in --help"
    assert "QTMODULES=\n" in res.stdout


def test_twin_build_output_is_clean(tmp_path: Path) -> None:
    """No vendor banner on stdout, each twin note printed once."""
    assert _cli("project", "new", str(tmp_path / "p")).returncode == 0
    res = _cli("twin", "build", "--project", str(tmp_path / "p"), "--procedural")
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "pybullet build time" not in out
    notes = [ln.strip() for ln in out.splitlines() if "collides as a box" in ln]
    assert len(notes) == 1, notes


def test_project_new_and_info_without_qt(tmp_path: Path) -> None:
    res = _cli("project", "new", str(tmp_path / "p"))
    assert res.returncode == 0, res.stderr
    res = _cli("project", "info", str(tmp_path / "p"))
    assert res.returncode == 0, res.stderr
    assert "0 artifacts" in res.stdout
    assert "QTMODULES=\n" in res.stdout


def test_cli_error_names_the_path(tmp_path: Path) -> None:
    res = _cli("project", "info", str(tmp_path / "missing"))
    assert res.returncode == 2
    assert str(tmp_path / "missing") in res.stderr and "no such folder" in res.stderr
    assert "Traceback" not in res.stderr


def test_bench_project_prints_json_last_line() -> None:
    res = _cli("bench", "project", "--json", "--quick")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if not ln.startswith("QTMODULES=")]
    result = json.loads(lines[-1])
    assert result["artifacts"] == 100 and result["roundtrip_ok"] is True
    assert result["save_ms"] > 0 and result["open_ms"] > 0
