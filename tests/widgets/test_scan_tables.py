"""The Scan page's calibration table: one row per view, wrist views then fixed ones, values
to 3 decimals, and the hand-eye summary (or why there is none)."""

from __future__ import annotations

from typing import Any

from PySide6 import QtWidgets

from widgets.scan_tables import fill_calibration


def test_calibration_rows_list_every_view_of_both_cameras(qtbot: Any) -> None:
    table, label = QtWidgets.QTableWidget(0, 4), QtWidgets.QLabel()
    qtbot.addWidget(table)
    qtbot.addWidget(label)
    cal = {
        "hand_eye": {"views": [3, 7], "residual_mm": [0.41, 0.25], "residual_deg": [0.05, 0.02],
                     "reproj_px": [0.8, 1.25], "method": "park", "mean_residual_mm": 0.33,
                     "max_reproj_px": 1.25, "warnings": ["few views"]},
        "fixed": {"views": [1], "residual_mm": [1.5], "residual_deg": [0.1], "reproj_px": [2.0]},
    }  # fmt: skip
    fill_calibration(table, label, cal)
    items = [[table.item(r, c) for c in range(4)] for r in range(table.rowCount())]
    cells = [[it.text() if it is not None else None for it in row] for row in items]
    assert cells == [
        ["wrist 3", "0.410", "0.050", "0.800"],
        ["wrist 7", "0.250", "0.020", "1.250"],
        ["fixed 1", "1.500", "0.100", "2.000"],
    ]
    assert label.text() == "Hand-eye (park): mean 0.33 mm, worst reprojection 1.25 px. few views"
    fill_calibration(table, label, {})
    assert table.rowCount() == 0 and label.text().startswith("No calibration in this scan")
