"""Views of the Policies page: the training distribution next to a fit's posterior
(`DistributionView`), the project's policies with their twin success (`PolicyTable`), and
the task settings the page offers, with units (`knob_rows`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from app.workflows import train as train_flow
from policies.tasks import task_config
from resources.project import Project

log = logging.getLogger(__name__)
MAX_HIST = 4  # parameters drawn (the rest are named in a line below)
COLS = 2

# the task settings the page offers: label, unit (per task where it differs), explanation
KNOBS: dict[str, tuple[str, Mapping[str, str], str]] = {
    "episode_s": ("episode length", {"*": "s"}, "how long the policy has in each episode"),
    "success_tol": (
        "success within",
        {"reach": "rad", "push": "m", "*": ""},
        "reach: every joint this close to the goal at the end; push: object this close",
    ),
    "start_range": ("start spread", {"*": "rad"}, "random start, per joint around home"),
    "goal_range": ("goal spread", {"*": "rad"}, "random goal, per joint around home"),
    "object_jitter": ("object spread", {"*": "m"}, "random object placement around its scan"),
}


def knob_rows(task: str) -> list[tuple[str, str, str, float, str]]:
    """(key, label, unit, default, tooltip) of the task's main settings."""
    cfg = task_config(task).to_json()
    out = []
    for key, (label, units, tip) in KNOBS.items():
        if isinstance(cfg.get(key), (int, float)) and not isinstance(cfg.get(key), bool):
            out.append((key, label, units.get(task, units["*"]), float(cfg[key]), tip))
    return out


def _short(name: str) -> str:
    return ".".join(name.split(".")[-2:])


class DistributionView(pg.GraphicsLayoutWidget):
    """One small histogram per randomized parameter: training draws (blue bars) and, when
    a fit is chosen, its posterior samples (orange outline), as densities on one axis."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setBackground("w")
        self.shown: list[str] = []
        self.last: tuple[list[str], np.ndarray] = ([], np.zeros((0, 0)))  # training draws
        self.message = ""
        self.show_message("No randomization: every episode uses the twin's own values.")

    def show_message(self, text: str) -> None:
        self.message = text
        self.clear()
        self.shown = []
        self.addLabel(text, row=0, col=0, color="#444", size="10pt")

    def show(  # type: ignore[override]
        self,
        names: Sequence[str],
        draws: np.ndarray,
        posterior: tuple[list[str], np.ndarray] | None,
        units: Mapping[str, str],
        mode: str,
    ) -> None:
        pnames, px = posterior if posterior is not None else ([], np.zeros((0, 0)))
        names = list(names)
        self.last = (names, np.asarray(draws, float))
        self.message = ""
        if not names and not pnames:
            self.show_message("No randomization: every episode uses the twin's own values.")
            return
        every = names + [n for n in pnames if n not in names]
        self.clear()
        self.shown = every[:MAX_HIST]
        head = {"none": "no randomization", "manual": "set by hand", "posterior": "fit's posterior"}
        legend = f"blue: training draws ({head[mode]})" + (
            " · orange: the fit's posterior" if pnames else ""
        )
        self.addLabel(legend, row=0, col=0, colspan=COLS, size="9pt", color="#333")
        for k, name in enumerate(self.shown):
            p = self.addPlot(row=1 + k // COLS, col=k % COLS)
            unit = units.get(name, "")
            p.setTitle(f"{_short(name)}" + (f" ({unit})" if unit else ""), size="8pt")
            p.getAxis("left").setStyle(showValues=False)
            p.getAxis("bottom").enableAutoSIPrefix(False)
            p.setMouseEnabled(x=False, y=False)
            cols = [a[:, names.index(name)] if name in names else None for a in (draws,)]
            vals = [c for c in cols if c is not None]
            if name in pnames:
                vals.append(px[:, pnames.index(name)])
            allv = np.concatenate(vals) if vals else np.zeros(0)
            lo, hi = (float(allv.min()), float(allv.max())) if allv.size else (0.0, 1.0)
            if not hi > lo:
                lo, hi = lo - 0.5 * abs(lo or 1) * 0.1, hi + 0.5 * abs(hi or 1) * 0.1
            edges = np.linspace(lo, hi, 21)
            if cols[0] is not None:
                y, _ = np.histogram(cols[0], bins=edges, density=True)
                p.plot(edges, y, stepMode="center", fillLevel=0, brush=(31, 119, 180, 110))
            if name in pnames:
                y, _ = np.histogram(px[:, pnames.index(name)], bins=edges, density=True)
                p.plot(edges, y, stepMode="center", pen=pg.mkPen("#ff7f0e", width=2))
        if len(every) > MAX_HIST:
            more = every[MAX_HIST:]
            rest = ", ".join(_short(n) for n in more[:2]) + (", …" if len(more) > 2 else "")
            self.addLabel(
                f"{len(more)} more: {rest}", row=3, col=0, colspan=COLS, size="8pt", color="#555"
            )


def _rate(ev: Mapping[str, Any] | None) -> str:
    if not ev or ev.get("success_rate") is None:
        return "not evaluated"
    lo, hi = ev.get("ci95", [math.nan, math.nan])
    n = ev.get("episodes", "?")
    return f"{100 * ev['success_rate']:.0f} % ({100 * lo:.0f}–{100 * hi:.0f} %, n={n})"


class PolicyTable(QtWidgets.QTableWidget):
    """The project's policies, newest first: task and trainer, twin success with its 95 %
    interval (nominal twin; under the training randomization), lineage."""

    NOMINAL = "twin success (95 % interval)"
    RANDOMIZED = "under randomization"
    COLUMNS = (
        "policy",
        "task · trainer",
        NOMINAL,
        RANDOMIZED,
        "randomization",
        "twin · fit",
        "trained",
    )

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(0, len(self.COLUMNS), parent)
        self.setHorizontalHeaderLabels(list(self.COLUMNS))
        self.setSelectionBehavior(QtWidgets.QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().setVisible(False)
        self.horizontalHeader().setStretchLastSection(True)
        self.setTextElideMode(QtCore.Qt.TextElideMode.ElideMiddle)
        self.setWordWrap(False)
        self.rows: dict[str, dict[str, str]] = {}

    def show_policies(self, project: Project) -> None:
        keep = self.selected()
        self.blockSignals(True)
        self.setRowCount(0)
        self.rows = {}
        for art in reversed(project.artifacts("policy")):
            try:
                rec = train_flow.policy_overview(project, art.id)
            except Exception as exc:  # one unreadable policy must not hide the others
                log.warning("policy %s: %s", art.id, exc)
                rec = {}
            ev = rec.get("evaluation", {})
            dr = str(art.settings.get("dr", "none"))
            twin = str(rec.get("twin_id") or (art.inputs[0] if art.inputs else "?"))
            fit = rec.get("fit_id")
            cells = {
                "policy": art.id,
                "task · trainer": f"{art.settings.get('task', '?')} · {art.settings.get('trainer', '?')}",
                "twin · fit": twin + (f" · {fit}" if fit else ""),
                "randomization": {
                    "none": "none",
                    "manual": "by hand",
                    "posterior": "posterior",
                }.get(dr, dr)
                + (" + sensor noise" if art.settings.get("noise") == "typical" else ""),
                self.NOMINAL: _rate(ev.get("nominal")),
                self.RANDOMIZED: _rate(ev.get(dr)) if dr != "none" else "— (trained without)",
                "trained": time.strftime("%Y-%m-%d %H:%M", time.localtime(art.created)),
            }
            self.rows[art.id] = cells
            r = self.rowCount()
            self.insertRow(r)
            for c, col in enumerate(self.COLUMNS):
                it = QtWidgets.QTableWidgetItem(cells[col])
                it.setData(QtCore.Qt.ItemDataRole.UserRole, art.id)
                it.setToolTip(f"{art.id}: {art.summary}" if col == "policy" else cells[col])
                self.setItem(r, c, it)
        self.resizeColumnsToContents()
        self.setColumnWidth(0, min(self.columnWidth(0), 150))  # ids: the tooltip has them whole
        self.blockSignals(False)
        if keep is not None:
            self.select(keep)
        elif self.rowCount():
            self.selectRow(0)  # the newest
            self.itemSelectionChanged.emit()

    def selected(self) -> str | None:
        items = self.selectedItems()
        return str(items[0].data(QtCore.Qt.ItemDataRole.UserRole)) if items else None

    def select(self, pid: str) -> None:
        for r in range(self.rowCount()):
            it = self.item(r, 0)
            if it is not None and it.text() == pid:
                self.selectRow(r)
                self.itemSelectionChanged.emit()
                return
