"""The Policies page's Sim vs real tab draws the table of a project's real runs: one point
per policy and twin version at (twin success, real success) with the real runs' interval,
the table's rows, and the correlation in words; an empty project says what to do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.workflows.sim_real import SimRealTable, sim_real_table
from tests.app.test_sim_real import _project
from widgets.sim_real_view import SimRealView

pytestmark = [pytest.mark.gui]


def test_points_rows_and_correlation(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p, pid, _ = _project(tmp_path)
    table = sim_real_table(p)
    view = SimRealView()
    qtbot.addWidget(view)
    view.show_table(table)
    x, y = view.points.getData()
    assert np.allclose(x, [r.twin_success for r in table.rows])
    assert np.allclose(y, [r.real_success for r in table.rows])
    assert view.table.rowCount() == len(table.rows) == 5
    cells = {view.table.item(r, 0).text(): r for r in range(view.table.rowCount())}
    good = cells[pid["good"]]
    assert view.table.item(good, 4).text().startswith("100 %")
    assert f"{table.pearson:+.2f}" in view.summary.text()
    view.show_table(SimRealTable((), None, None))
    assert view.table.rowCount() == 0 and "No real runs yet" in view.summary.text()
