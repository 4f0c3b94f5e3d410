"""Fixtures for GUI tests: per-test config/data folders, a controller, and a check that no
test leaves a worker thread, pool thread or process behind."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.controller import AppController  # noqa: E402


@pytest.fixture(autouse=True)
def _user_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the real ~/.config/twinbench or ~/.local/share/twinbench."""
    monkeypatch.setenv("TWINBENCH_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("TWINBENCH_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves Python threads or global-pool Qt threads running."""
    before = set(threading.enumerate())
    yield
    if "qapp" in request.fixturenames or "qtbot" in request.fixturenames:
        from PySide6 import QtCore

        pool = QtCore.QThreadPool.globalInstance()
        assert pool.activeThreadCount() == 0, "a job is still running on the global pool"
    deadline = 50
    # _DummyThread entries are Qt pool threads Python has seen; the pool checks cover them.
    leaked = [
        t
        for t in threading.enumerate()
        if t not in before and t.is_alive() and not isinstance(t, threading._DummyThread)
    ]
    while leaked and deadline:
        threading.Event().wait(0.1)
        deadline -= 1
        leaked = [t for t in leaked if t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[AppController]:
    c = AppController(config=tmp_path / "config")
    c.install_log_handler()
    yield c
    c.shutdown()


@pytest.fixture
def window(qtbot, controller: AppController):  # type: ignore[no-untyped-def]
    from widgets.main_window import MainWindow

    w = MainWindow(controller)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.shutdown()
    assert w.runner.pool.activeThreadCount() == 0
    assert not w.devices_panel.timer.isActive()
