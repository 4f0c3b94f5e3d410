"""The Policies page's "Sim vs real" tab: per policy and twin version, what the twin said and
what the robot did (app/workflows/sim_real.py) — a scatter of twin success against real
success (the diagonal is a twin that is never wrong; error bars the real runs' 95 %
intervals) beside the table, with the correlation across policies."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from app.workflows.sim_real import SimRealTable

COLUMNS = ("policy", "twin", "robot", "real runs", "real success (95 %)", "twin said", "error gap")


class SimRealView(QtWidgets.QWidget):
    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QtWidgets.QHBoxLayout(self)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setLabel("bottom", "twin success")
        self.plot.setLabel("left", "real success")
        self.plot.setXRange(0, 1, padding=0.05)
        self.plot.setYRange(0, 1, padding=0.05)
        self.plot.setAspectLocked(True)
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        grey = pg.mkPen("#999999", width=1, style=QtCore.Qt.PenStyle.DashLine)
        self.plot.plot([0, 1], [0, 1], pen=grey)
        none = np.zeros(0)
        self.bars = pg.ErrorBarItem(x=none, y=none, top=none, bottom=none, pen=pg.mkPen("#1f77b4"))
        self.plot.addItem(self.bars)
        self.points = self.plot.plot([], [], pen=None, symbol="o", symbolBrush="#1f77b4")
        self.plot.setMinimumWidth(220)
        lay.addWidget(self.plot, 2)
        right = QtWidgets.QVBoxLayout()
        self.summary = QtWidgets.QLabel("")
        self.summary.setWordWrap(True)
        right.addWidget(self.summary)
        self.table = QtWidgets.QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setTextElideMode(QtCore.Qt.TextElideMode.ElideMiddle)
        self.table.setWordWrap(False)
        right.addWidget(self.table, 1)
        lay.addLayout(right, 3)
        self.show_table(SimRealTable((), None, None))

    def show_table(self, table: SimRealTable) -> None:
        self.table.setRowCount(0)
        xs, ys, top, bottom = [], [], [], []
        for r in table.rows:
            lo, hi = r.real_ci95
            src = "evaluation" if r.twin_eval_success is not None else "shadow runs"
            gap = "—" if math.isnan(r.mean_error_gap) else f"{r.mean_error_gap:.3f} {r.unit}"
            cells = (
                r.policy,
                r.twin,
                r.robot,
                str(r.runs),
                f"{100 * r.real_success:.0f} % ({100 * lo:.0f}–{100 * hi:.0f} %)",
                f"{100 * r.twin_success:.0f} % ({src})",
                gap,
            )
            row = self.table.rowCount()
            self.table.insertRow(row)
            for c, text in enumerate(cells):
                item = QtWidgets.QTableWidgetItem(text)
                item.setToolTip(text)
                self.table.setItem(row, c, item)
            xs.append(r.twin_success)
            ys.append(r.real_success)
            top.append(hi - r.real_success)
            bottom.append(r.real_success - lo)
        self.table.resizeColumnsToContents()
        for c in (0, 1):  # artifact ids: the tooltip has them whole
            self.table.setColumnWidth(c, min(self.table.columnWidth(c), 120))
        self.points.setData(xs, ys)
        self.bars.setData(
            x=np.array(xs), y=np.array(ys), top=np.array(top), bottom=np.array(bottom), beam=0.02
        )
        if not table.rows:
            self.summary.setText(
                "No real runs yet. Deploy a policy (Deploy page) and its runs appear here "
                "beside what the twin predicted."
            )
            return
        corr = (
            "needs 3 policies with different results"
            if table.pearson is None
            else f"{table.pearson:+.2f}"
        )
        self.summary.setText(
            f"<b>{len(table.rows)}</b> policy × twin versions. Twin vs real success across "
            f"them: correlation <b>{corr}</b>, mean gap <b>{100 * (table.abs_gap or 0):.0f} %"
            "</b> (on the diagonal the twin is right)."
        )
