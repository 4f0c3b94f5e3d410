"""Scan page: a recorded scan played through the page, objects edited, accepted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6 import QtCore, QtWidgets

from app.controller import AppController
from devices.cameras.software import DB3Writer
from resources.project import Project

pytestmark = pytest.mark.gui


@pytest.fixture()
def recording(tmp_path: Path) -> Path:
    """A .db3 of ray-cast frames with known poses (two objects on a table)."""
    from tests.reconstruction.synth import orbit, render, scene

    sc = scene()
    path = tmp_path / "synthetic.db3"
    with DB3Writer(path) as w:
        for i, T in enumerate(orbit(10, span=3.0)):
            w.write(render(sc, T, noise_m=0.001, index=i + 1))
    return path


def test_scan_page_reconstructs_edits_and_accepts(qtbot, tmp_path: Path, recording: Path) -> None:  # type: ignore[no-untyped-def]
    from widgets.scan_live import depth_colormap
    from widgets.scan_page import ScanPage

    c = AppController()
    c.install_log_handler()
    c.new_project(tmp_path / "proj")
    page = ScanPage(c)
    qtbot.addWidget(page)
    assert not page.showing_empty_state()
    assert page.start_scan("file", recording)  # runs synchronously without a window
    assert page.result is not None and len(page.result.objects) == 2
    assert page.objects.rowCount() == 2 and page.accept_btn.isEnabled()
    items = page.scene.items()
    assert "scan/scene" in items and sum(k.startswith("scan/object/") for k in items) == 2
    assert page.color_view.pixmap() is not None and not page.color_view.pixmap().isNull()
    # rename through the table's own editor, as a user does (double-click, type, Enter)
    page.show()
    page.objects.editItem(page.objects.item(0, 0))
    editor = page.objects.findChild(QtWidgets.QLineEdit)
    assert editor is not None
    editor.setText("mug")
    qtbot.keyClick(editor, QtCore.Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: page.result.objects[0].name == "mug", timeout=3000)
    page.objects.item(1, 0).setText("mug")  # duplicate: refused, kept
    qtbot.waitUntil(lambda: "already used" in page.warn.text(), timeout=3000)
    assert page.result.objects[1].name == "object_2"
    page.objects.selectRow(1)
    page._drop()
    assert [o.name for o in page.result.objects] == ["mug"]
    with qtbot.waitSignal(page.sig_scan_accepted, timeout=10000) as sig:
        page.accept_scan()
    aid = sig.args[0]
    folder = tmp_path / "proj" / "scans" / str(aid)
    assert (folder / "objects" / "mug.obj").is_file()
    assert Project.open(tmp_path / "proj").latest("scan").id == aid
    assert any(f"saved scan {aid}" in e.message for e in c.log_entries())
    assert any("scan finished" in e.message for e in c.log_entries())
    # after a restart: the saved scan is listed, opens, and an edit of it names it as parent
    page.detach()
    page2 = ScanPage(c)
    qtbot.addWidget(page2)
    assert page2.saved.findData(aid) > 0
    page2.open_saved(aid)
    qtbot.waitUntil(lambda: page2.result is not None, timeout=10000)
    assert [o.name for o in page2.result.objects] == ["mug"]
    assert not page2.accept_btn.isEnabled()  # nothing to save until it is edited
    page2.objects.item(0, 0).setText("cup")
    qtbot.waitUntil(lambda: page2.accept_btn.isEnabled(), timeout=3000)
    with qtbot.waitSignal(page2.sig_scan_accepted, timeout=10000) as sig2:
        page2.accept_scan()
    edited = Project.open(tmp_path / "proj").artifact(sig2.args[0])
    assert edited.parent == aid
    page2.detach()
    c.shutdown()
    rgb = depth_colormap(np.array([[0.0, 0.2, 1.2]], np.float32))
    assert rgb[0, 0].tolist() == [0, 0, 0] and rgb[0, 1, 0] == 255 and rgb[0, 2, 2] == 255


def test_scan_page_shows_empty_state_without_project(qtbot) -> None:  # type: ignore[no-untyped-def]
    from widgets.scan_page import ScanPage

    c = AppController()
    page = ScanPage(c)
    qtbot.addWidget(page)
    assert page.showing_empty_state()
    page.detach()
    c.shutdown()
