"""Real windows under Xvfb (the xcb platform with Mesa OpenGL): the app's main window and the
demo with the lab open and save screenshots; the 3D view really draws. Each runs the app in
a subprocess on an Xvfb server this module starts (and stops)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from resources.project import Project

pytestmark = [pytest.mark.xvfb, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "screenshots"


@pytest.fixture(scope="module")
def xdisplay() -> Iterator[str]:
    """Start Xvfb on a display number it picks itself (-displayfd: no races between
    parallel test workers)."""
    exe = shutil.which("Xvfb")
    if exe is None:
        pytest.skip("Xvfb is not installed (scripts/setup.sh installs package xvfb)")
    r, w = os.pipe()
    proc = subprocess.Popen(
        [exe, "-displayfd", str(w), "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
        pass_fds=(w,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    os.close(w)
    try:
        with os.fdopen(r) as fh:
            num = fh.readline().strip()
        if not num:
            raise RuntimeError(
                "Xvfb did not report a display: "
                + (proc.stderr.read().decode() if proc.stderr else "")
            )
        yield f":{num}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def gui_env(display: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYOPENGL_PLATFORM"}
    env.update(
        DISPLAY=display,
        QT_QPA_PLATFORM="xcb",
        MUJOCO_GL="egl",
        TWINBENCH_CONFIG_DIR=str(tmp / "config"),
        TWINBENCH_DATA_DIR=str(tmp / "data"),
    )
    return env


def keep(png: Path, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    shutil.copy(png, SHOTS / name)


def png_size(png: Path) -> tuple[int, int]:
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_main_window_screenshot(xdisplay: str, tmp_path: Path) -> None:
    proj = Project.create(tmp_path / "workspace")
    shot = tmp_path / "main_window.png"
    res = subprocess.run(
        [
            sys.executable,
            "main.py",
            "gui",
            str(proj.root),
            "--screenshot",
            str(shot),
            "--screenshot-delay",
            "1.5",
        ],
        cwd=REPO,
        env=gui_env(xdisplay, tmp_path),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert res.returncode == 0, res.stderr
    assert "screenshot saved" in res.stderr
    w, h = png_size(shot)
    assert w >= 1000 and h >= 600
    keep(shot, "main_window.png")
    recent = json.loads((tmp_path / "config" / "recent.json").read_text())
    assert recent["recent"] == [str(proj.root.resolve())]


@pytest.mark.parametrize("native", [False, True], ids=["widget", "native-window"])
def test_scene_view_draws_with_opengl(xdisplay: str, tmp_path: Path, native: bool) -> None:
    out = tmp_path / "scene.json"
    res = subprocess.run(
        [sys.executable, "-m", "tests.widgets.scene_render", str(out)]
        + (["--native"] if native else []),
        cwd=REPO,
        env=gui_env(xdisplay, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(out.read_text())
    assert got["platform"] == "xcb" and got["has_gl"] and got["native"] == native, got
    drawn, removed = got["with_items"], got["after_remove"]
    assert drawn["red"] > 1000, got  # the red box
    assert drawn["green"] > 500, got  # the green point cloud
    # what stays red/green after removing them is the axes of the frames
    assert removed["red"] < 0.1 * drawn["red"], got
    assert removed["green"] < 0.25 * drawn["green"], got
    assert removed["non_background"] > 500, got  # the ground grid and origin triad remain
    if not native:
        keep(out.with_suffix(".png"), "scene_view.png")


def test_demo_with_lab_screenshot_and_lab_stopped(xdisplay: str, tmp_path: Path) -> None:
    shot = tmp_path / "demo.png"
    res = subprocess.run(
        [sys.executable, "main.py", "demo", "--screenshot", str(shot), "--screenshot-delay", "2"],
        cwd=REPO,
        env=gui_env(xdisplay, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "robot connected" in res.stderr, res.stderr
    assert "virtual lab stopped" in res.stderr, (
        res.stderr
    )  # (exit code 0 unless it had to be killed)
    assert (tmp_path / "data" / "demo" / "twinbench.json").is_file()
    png_size(shot)
    keep(shot, "demo_lab.png")
