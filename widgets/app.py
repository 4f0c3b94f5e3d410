"""`run_gui`: start the desktop app (called by main.py; the only way Qt gets loaded)."""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import logging
import os
import sys
import time
from pathlib import Path

from resources.errors import TwinbenchError

log = logging.getLogger(__name__)

# Qt platforms that need no display server.
SCREENSHOT_MAX_WAIT_S = 60.0
HEADLESS_PLATFORMS = ("offscreen", "minimal", "vnc", "eglfs", "linuxfb", "vkkhrdisplay")


def display_problem() -> str | None:
    """Why no window can be opened here, or None if a display looks usable.

    Checked before QApplication exists, because Qt aborts the process when its platform
    plugin cannot connect.
    """
    platform = os.environ.get("QT_QPA_PLATFORM", "").split(":")[0]
    if platform in HEADLESS_PLATFORMS or sys.platform in ("darwin", "win32"):
        return None
    if os.environ.get("WAYLAND_DISPLAY") and platform in ("", "wayland", "wayland-egl"):
        return None
    display = os.environ.get("DISPLAY")
    if not display:
        return (
            "Twinbench needs a display to open its window, and none is set (DISPLAY is "
            "empty). Run it on a desktop session, or use the command line: "
            "python main.py --help"
        )
    libname = ctypes.util.find_library("X11")
    if libname:
        try:
            x11 = ctypes.CDLL(libname)
            x11.XOpenDisplay.restype = ctypes.c_void_p
            x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
            x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
            handle = x11.XOpenDisplay(display.encode())
            if not handle:
                return (
                    f"Twinbench cannot connect to the display '{display}' (is the X server "
                    "running and are you allowed to use it?). The command line works "
                    "without one: python main.py --help"
                )
            x11.XCloseDisplay(handle)
        except OSError:
            pass  # no usable libX11: let Qt try
    return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python main.py [gui|demo]", description="Open the Twinbench desktop app."
    )
    p.add_argument(
        "project",
        nargs="?",
        type=Path,
        help="project folder to open (default: the last one; with 'demo', the demo project)",
    )
    p.add_argument("--no-lab", action="store_true", help="demo: do not start the virtual lab")
    p.add_argument(
        "--screenshot",
        type=Path,
        default=None,
        help="save a screenshot of the window to this PNG once --screenshot-delay "
        "seconds have passed and no job is running, then quit (docs and tests)",
    )
    p.add_argument("--screenshot-delay", type=float, default=2.0)
    p.add_argument("--page", default=None, help="workflow page to show first (scan, twin, …)")
    return p.parse_known_args(argv)[0]


def run_gui(demo: bool, argv: list[str]) -> int:
    """Open the main window on a project (given, last, or the demo); returns the exit code."""
    args = parse_args(argv)
    problem = display_problem()
    if problem is not None:
        sys.stderr.write(problem + "\n")
        return 1

    import faulthandler

    from PySide6 import QtCore, QtWidgets

    # after display_problem(): with no display, `main.py` fails at once, not after the 2 s
    # these take (Qt, every page, Open3D, PyBullet)
    from app import demo as demo_mod
    from app.controller import AppController
    from widgets.main_window import MainWindow
    from widgets.scene_view import grab_widget, share_gl_contexts

    if not faulthandler.is_enabled():  # a crash in Qt, OpenGL or a native library: the
        faulthandler.enable()  # Python stacks of every thread on stderr, where it happened
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("OpenGL").setLevel(logging.WARNING)  # "no OpenGL_accelerate" chatter
    share_gl_contexts()
    qapp = QtWidgets.QApplication.instance() or QtWidgets.QApplication([sys.argv[0]])
    qapp.setApplicationName("Twinbench")
    qapp.setOrganizationName("Twinbench")
    controller = AppController()
    controller.install_log_handler()
    win = MainWindow(controller)
    previous_hook = sys.excepthook
    sys.excepthook = win.report_unexpected  # a slot that raises: dialog + log, app lives on
    try:
        if args.project is not None:
            win.open_project(args.project)
        elif demo:
            proj = demo_mod.ensure_demo_project()
            controller.open_project(proj.root)
        elif controller.open_last() is None:
            proj = demo_mod.ensure_demo_project()
            controller.open_project(proj.root)
            log.info("no recent project: opened the demo project")
    except TwinbenchError as exc:
        win.show_error("Cannot open project", str(exc))
    if demo:
        if args.no_lab:
            controller.set_device_status("robot", "unavailable", "lab not started (--no-lab)")
        else:
            demo_mod.start_lab(controller)
    if args.page:
        win.show_step(args.page)
    win.show()
    if args.screenshot is not None:
        # Shoot once the delay has passed and no job (e.g. the lab start) is still running,
        # or after SCREENSHOT_MAX_WAIT_S whatever happens.
        t_start = time.monotonic()
        poll = QtCore.QTimer(win)
        idle_polls = [0]  # a job's results reach the views one event-loop pass later

        def _maybe_shoot() -> None:
            waited = time.monotonic() - t_start
            idle_polls[0] = 0 if win.runner.running() else idle_polls[0] + 1
            if waited < args.screenshot_delay or (
                idle_polls[0] < 3 and waited < SCREENSHOT_MAX_WAIT_S
            ):
                return
            poll.stop()
            args.screenshot.parent.mkdir(parents=True, exist_ok=True)
            ok = grab_widget(win).save(str(args.screenshot))
            log.info("screenshot %s: %s", "saved" if ok else "FAILED", args.screenshot)
            win.close()

        poll.timeout.connect(_maybe_shoot)
        poll.start(100)
    try:
        code = int(qapp.exec())
    finally:
        sys.excepthook = previous_hook
    win.shutdown()
    return code
