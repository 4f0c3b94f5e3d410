"""PySide6's import hook must not read the source of modules imported after it (widgets/
__init__: ~0.3 ms of GIL-held Python per module, paid by every lazy import in the window's
thread), and Qt keeps working for the modules it now calls "ignored"."""

from __future__ import annotations

import linecache
import sys
from pathlib import Path

import pytest


def test_a_module_imported_after_qt_is_not_read_for_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import widgets  # noqa: F401  (installs the hook and its patch)

    src = tmp_path / "twinbench_probe_mod.py"
    src.write_text("from PySide6 import QtCore\n\nVALUE = QtCore.QPointF(1.5, 2.0).x()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    linecache.clearcache()
    try:
        import twinbench_probe_mod as mod  # type: ignore[import-not-found]  # (the hook sees `import`)

        assert mod.VALUE == pytest.approx(1.5)  # Qt types work from an "ignored" module
        assert str(src) not in linecache.cache, "PySide6's hook read the module's source"
    finally:
        sys.modules.pop("twinbench_probe_mod", None)


def test_qt_properties_and_signals_work_in_widgets(qtbot) -> None:  # type: ignore[no-untyped-def]
    from PySide6 import QtWidgets

    box = QtWidgets.QSpinBox()
    qtbot.addWidget(box)
    seen: list[int] = []
    box.valueChanged.connect(seen.append)
    box.setRange(0, 10)
    box.setValue(7)
    assert box.value() == 7 and seen == [7]
