"""bench gui: the real window, soaked.

Runs `python -m benches.soak` (the main window at 1366x768 on the demo project, the virtual
lab connected, the twin playing, the devices panel live, pages switched every 20 s) in its
own process under Xvfb (started here when there is no display), and reports what it
measured. A window that dies (e.g. "Fatal Python error: none_dealloc") is `crashed: 1` with
the end of its stderr, not a crash of the bench.

Targets (issue 8): crashed 0 over 10 minutes, rss_growth_mb <= 50, idle_cpu_pct <= 10,
gui_tick_ms_p99 <= 50, none_refcount_drift 0: None's count must not fall (it moves up and
down by a few hundred with whatever else holds None at the moment; the binding bug loses tens
of thousands per minute).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from resources.errors import TwinbenchError

DESCRIPTION = "the real window with the lab connected and the twin playing, soaked for --minutes"
DEFAULT_MINUTES = 10.0
QUICK_MINUTES = 1.5
SCREEN = "1366x768x24"


def start_xvfb() -> tuple[subprocess.Popen[bytes] | None, str]:
    """(Xvfb process or None, DISPLAY to use): an existing display is used as it is."""
    if os.environ.get("DISPLAY"):
        return None, os.environ["DISPLAY"]
    if shutil.which("Xvfb") is None:
        raise TwinbenchError(
            "bench gui needs a display or Xvfb to open the real window; install xvfb "
            "(scripts/setup.sh does) or run it on a desktop"
        )
    for n in range(90, 130):
        if Path(f"/tmp/.X{n}-lock").exists():
            continue
        proc = subprocess.Popen(
            ["Xvfb", f":{n}", "-screen", "0", SCREEN, "-nolisten", "tcp"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if Path(f"/tmp/.X11-unix/X{n}").exists():
                return proc, f":{n}"
            time.sleep(0.1)
        proc.kill()
        proc.wait()
    raise TwinbenchError("bench gui: could not start Xvfb on displays :90-:129")


def run_in_window(
    module: str,
    args: Callable[[Path], list[str]],
    timeout_s: float,
    beside: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> dict[str, Any]:
    """Run `python -m MODULE ARGS --out REPORT` (ARGS from `args(tmp folder)`) under Xvfb
    (or the display there is), with its own config and data folders, while `beside()` is
    entered (e.g. busy processes); returns its JSON report plus `display`, `crashed`,
    `exit_code` and, when it crashed, the end of its stderr."""
    xvfb, display = start_xvfb()
    tmp = Path(tempfile.mkdtemp(prefix=f"twinbench-{module.split('.')[-1]}-"))
    report_path = tmp / "report.json"
    env = {
        **os.environ,
        "DISPLAY": display,
        "QT_QPA_PLATFORM": "xcb",
        "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"),
        "TWINBENCH_DATA_DIR": str(tmp / "data"),
        "TWINBENCH_CONFIG_DIR": str(tmp / "config"),
        "PYTHONFAULTHANDLER": "1",  # a crash prints every thread's Python stack
    }
    cmd = [sys.executable, "-m", module, *args(tmp), "--out", str(report_path)]
    repo = Path(__file__).resolve().parents[2]
    try:
        with beside():
            proc = subprocess.run(
                cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s
            )
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, err = -9, f"{module} did not finish in {timeout_s:g} s: {exc}"
    finally:
        if xvfb is not None:
            xvfb.terminate()
            xvfb.wait(10)
    out: dict[str, Any] = {"display": display}
    if report_path.is_file():
        out.update(json.loads(report_path.read_text()))
    crashed = rc != 0 or not report_path.is_file()
    out["crashed"] = int(crashed)
    out["exit_code"] = rc
    if crashed:
        out["stderr_tail"] = _tail(err, 6000)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def run(quick: bool = False, minutes: float | None = None) -> dict[str, Any]:
    minutes = float(
        minutes if minutes is not None else (QUICK_MINUTES if quick else DEFAULT_MINUTES)
    )
    out: dict[str, Any] = {"minutes_requested": minutes}
    out.update(
        run_in_window(
            "benches.soak", lambda _: ["--minutes", str(minutes)], timeout_s=minutes * 60 + 300
        )
    )
    out["targets_met"] = bool(
        not out["crashed"]
        and out.get("rss_growth_mb", 1e9) <= 50
        and out.get("idle_cpu_pct", 1e9) <= 10
        and out.get("gui_tick_ms_p99", 1e9) <= 50
        and out.get("none_refcount_drift", -1e9) >= -300
    )
    return out


def _tail(text: str, n: int) -> str:
    """The last `n` characters of `text` with runs of one repeated line collapsed (Qt's
    warnings repeat by the hundred and pushed a crash's stacks out of the tail)."""
    lines: list[str] = []
    repeats = 0
    for line in text.splitlines():
        if lines and line == lines[-1]:
            repeats += 1
            continue
        if repeats:
            lines.append(f"  [the line above {repeats} more times]")
            repeats = 0
        lines.append(line)
    if repeats:
        lines.append(f"  [the line above {repeats} more times]")
    return "\n".join(lines)[-n:]
