"""The Scan page's result tables: the scanned objects and the calibration's views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets


def fill_objects(table: QtWidgets.QTableWidget, objects: Sequence[Any]) -> None:
    """One row per scanned object: name (editable), size in cm, watertight, colour."""
    table.blockSignals(True)
    table.setRowCount(0)
    for o in objects:
        r = table.rowCount()
        table.insertRow(r)
        name = QtWidgets.QTableWidgetItem(o.name)
        name.setData(QtCore.Qt.ItemDataRole.UserRole, o.name)
        table.setItem(r, 0, name)
        size = " × ".join(f"{e * 100:.1f}" for e in o.mesh.extents)
        for c, text in ((1, size), (2, "yes" if o.watertight else "no")):
            it = QtWidgets.QTableWidgetItem(text)
            it.setFlags(it.flags() & ~QtCore.Qt.ItemFlag.ItemIsEditable)
            table.setItem(r, c, it)
        sw = QtWidgets.QTableWidgetItem("")
        sw.setFlags(sw.flags() & ~QtCore.Qt.ItemFlag.ItemIsEditable)
        sw.setBackground(QtGui.QColor(*o.color))
        table.setItem(r, 3, sw)
    table.blockSignals(False)


def fill_calibration(
    table: QtWidgets.QTableWidget, summary: QtWidgets.QLabel, calibration: dict[str, Any]
) -> None:
    """One row per calibration view (residual mm, deg, reprojection px) and a summary."""
    he = calibration.get("hand_eye") or {}
    fx = calibration.get("fixed") or {}
    rows = [
        (f"{label} {v}", mm, deg, px)
        for label, cal in (("wrist", he), ("fixed", fx))
        for v, mm, deg, px in zip(
            cal.get("views", []),
            cal.get("residual_mm", []),
            cal.get("residual_deg", []),
            cal.get("reproj_px", []),
            strict=False,
        )
    ]
    table.setRowCount(len(rows))
    for r, vals in enumerate(rows):
        for c, v in enumerate(vals):
            table.setItem(r, c, QtWidgets.QTableWidgetItem(v if isinstance(v, str) else f"{v:.3f}"))
    if he:
        summary.setText(
            f"Hand-eye ({he.get('method', '')}): mean {he.get('mean_residual_mm', 0):.2f} mm,"
            f" worst reprojection {he.get('max_reproj_px', 0):.2f} px. "
            + " ".join(he.get("warnings", []))
        )
    else:
        summary.setText("No calibration in this scan (recording or handheld).")
