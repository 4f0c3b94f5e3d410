"""The window fits a 1366x768 laptop: every page's main controls are on screen, at least
their minimum size (no cut text), and not on top of each other; the devices dock and the
status bar's Cancel stay inside the window."""

from __future__ import annotations

import pytest
from PySide6 import QtCore, QtWidgets

from app.controller import idle_job
from app.workflows import twin as twin_flow
from resources.jobs import run_to_end

pytestmark = [pytest.mark.gui, pytest.mark.slow]

W, H = 1366, 768
CONTROL_TYPES = (QtWidgets.QAbstractButton, QtWidgets.QComboBox, QtWidgets.QAbstractItemView)


def _rect_in(window: QtWidgets.QWidget, w: QtWidgets.QWidget) -> QtCore.QRect:
    return QtCore.QRect(w.mapTo(window, QtCore.QPoint(0, 0)), w.size())


def _inside_item_view(w: QtWidgets.QWidget) -> bool:
    p = w.parentWidget()
    while p is not None:
        if isinstance(p, QtWidgets.QAbstractItemView):
            return True
        p = p.parentWidget()
    return False


def _controls(root: QtWidgets.QWidget) -> list[QtWidgets.QWidget]:
    from widgets.scene_view import SceneView

    out = []
    for w in root.findChildren(QtWidgets.QWidget):
        if not w.isVisible() or _inside_item_view(w):
            continue
        if (
            isinstance(w, CONTROL_TYPES + (SceneView,))
            and not isinstance(w, QtWidgets.QTabBar | QtWidgets.QAbstractScrollArea)
            or isinstance(w, QtWidgets.QAbstractItemView)
        ):
            if (
                isinstance(w, QtWidgets.QAbstractButton)
                and w.parentWidget() is not None
                and (
                    isinstance(w.parentWidget(), QtWidgets.QDockWidget)  # dock float/close glyphs
                    or type(w).__name__ == "QToolButton"
                )
            ):
                continue
            out.append(w)
    return out


def _check(window: QtWidgets.QWidget, controls: list[QtWidgets.QWidget], where: str) -> None:
    bounds = window.rect()
    rects = {w: _rect_in(window, w) for w in controls}
    for w, r in rects.items():
        name = f"{where}: {type(w).__name__} '{getattr(w, 'text', lambda: '')()}'"
        assert bounds.contains(r), f"{name} at {r} is off the {W}x{H} window"
        hint = w.minimumSizeHint()
        if isinstance(w, QtWidgets.QAbstractButton | QtWidgets.QComboBox):
            assert w.width() >= hint.width() - 1, f"{name} squashed: {w.width()} < {hint.width()}"
        # not hidden behind the page's scroll area edge
        area = w.parentWidget()
        while area is not None and not isinstance(area, QtWidgets.QScrollArea):
            area = area.parentWidget()
        if area is not None:
            view = _rect_in(window, area.viewport())
            assert view.contains(r), f"{name} at {r} needs scrolling (viewport {view})"
    items = list(rects.items())
    for i, (a, ra) in enumerate(items):
        for b, rb in items[i + 1 :]:
            if a.isAncestorOf(b) or b.isAncestorOf(a):
                continue
            assert not ra.intersected(rb).isValid() or ra.intersected(rb).isEmpty(), (
                f"{where}: {type(a).__name__} '{getattr(a, 'text', lambda: '')()}' {ra} overlaps "
                f"{type(b).__name__} '{getattr(b, 'text', lambda: '')()}' {rb}"
            )


def test_every_page_fits_1366x768(window, controller, qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proj = controller.new_project(tmp_path / "laptop")
    run_to_end(twin_flow.build_twin(proj, None, procedural=True))
    controller.notify_project_changed()
    window.resize(W, H)
    qtbot.wait(100)
    assert (window.width(), window.height()) == (W, H), "the window snapped to a larger size"
    assert window.minimumSizeHint().width() <= W and window.minimumSizeHint().height() <= H
    assert window.devices_dock.isVisible()
    dock_rect = _rect_in(window, window.devices_dock)
    assert window.rect().contains(dock_rect), f"devices dock off screen at {dock_rect}"
    for key in window.pages:
        page = window.show_step(key)
        if key == "twin":
            qtbot.waitUntil(lambda p=page: p._last_frame is not None, timeout=30000)
        qtbot.wait(50)
        controls = _controls(page)
        assert controls or page.showing_empty_state(), f"page {key} shows nothing"
        _check(window, controls + _controls(window.devices_panel), f"page {key}")
    # a running job's progress and Cancel button sit inside the status bar, on screen
    task = window.runner.start("Waiting", idle_job(1.0, steps=20))
    qtbot.waitUntil(lambda: window.job_widget.cancel_button.isVisible(), timeout=5000)
    _check(window, [window.job_widget.cancel_button], "status bar")
    with qtbot.waitSignal(task.sig_done, timeout=10000):
        task.cancel()


def test_docks_collapse_and_come_back(window, qtbot) -> None:  # type: ignore[no-untyped-def]
    window.resize(W, H)
    for dock in (window.devices_dock, window.log_dock):
        action = dock.toggleViewAction()
        action.trigger()
        assert not dock.isVisible()
        action.trigger()
        assert dock.isVisible()
