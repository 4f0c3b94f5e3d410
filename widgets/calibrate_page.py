"""Calibrate page (workflow step: calibrate): recorded trajectories of the project, drawn
PlotJuggler style (real solid, sim dashed, residuals), ready for the fit.

Shows its empty state until the project holds a trajectory. Fitting is not built yet and the
page says so; it plots recordings with time from their start, one unit per channel kind.
"""

from __future__ import annotations

import logging

from PySide6 import QtCore, QtWidgets

from app import workflows
from resources.errors import TwinbenchError
from widgets.pages import WorkflowPage, preview
from widgets.trajectory_plot import TrajectoryPlot

log = logging.getLogger(__name__)


class CalibratePage(WorkflowPage):
    """Trajectory list (tick to plot) + trajectory plot; constructed as
    `CalibratePage(controller, parent=None)`."""

    step = "calibrate"

    def build_body(self, layout: QtWidgets.QVBoxLayout) -> None:
        self.banner = QtWidgets.QLabel("")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet(
            "background: #fff3cd; color: #5c4400; padding: 8px; border-radius: 4px;"
        )
        layout.addWidget(self.banner)
        self.plot = TrajectoryPlot()
        self.traj_list = QtWidgets.QListWidget()
        self.traj_list.setMaximumHeight(140)
        self.traj_list.itemChanged.connect(self._on_ticked)
        self.plot.side_layout.insertWidget(0, QtWidgets.QLabel("<b>Recordings</b> (tick to plot)"))
        self.plot.side_layout.insertWidget(1, self.traj_list)
        layout.addWidget(self.plot, 1)
        self._loaded: dict[str, list[str]] = {}

    def has_content(self) -> bool:
        p = self.controller.project
        return p is not None and bool(p.artifacts("trajectory"))

    def refresh(self) -> None:
        super().refresh()
        if not hasattr(self, "traj_list"):
            return  # called by the base constructor before the body exists
        proj = self.controller.project
        arts = proj.artifacts("trajectory") if proj is not None else []
        ids = [a.id for a in arts]
        current = [
            self.traj_list.item(i).data(QtCore.Qt.ItemDataRole.UserRole)
            for i in range(self.traj_list.count())
        ]
        if ids != current:
            self.traj_list.blockSignals(True)
            self.traj_list.clear()
            self.plot.clear()
            self._loaded.clear()
            for a in arts:
                item = QtWidgets.QListWidgetItem(a.summary or a.id)
                item.setToolTip(f"{a.id}\n{a.settings.get('robot', '')}")
                item.setData(QtCore.Qt.ItemDataRole.UserRole, a.id)
                item.setFlags(item.flags() | QtCore.Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(QtCore.Qt.CheckState.Unchecked)
                self.traj_list.addItem(item)
            self.traj_list.blockSignals(False)
            if self.traj_list.count():
                self.traj_list.item(self.traj_list.count() - 1).setCheckState(
                    QtCore.Qt.CheckState.Checked
                )  # newest one plotted
        missing = [
            n.label
            for n, ok in workflows.needs_met(self.step_info, proj, self.connected())
            if not ok
        ]
        text = self.step_info.coming if not self.step_info.built else ""
        if missing:
            text += " Still missing for this step: " + "; ".join(missing) + "."
        self.banner.setVisible(bool(text))
        self.banner.setText(text.strip())

    def _on_ticked(self, item: QtWidgets.QListWidgetItem) -> None:
        aid = item.data(QtCore.Qt.ItemDataRole.UserRole)
        if item.checkState() == QtCore.Qt.CheckState.Checked:
            try:
                traj = self.controller.load_trajectory(aid)
            except TwinbenchError as exc:
                log.error("cannot plot %s: %s", aid, exc)
                item.setCheckState(QtCore.Qt.CheckState.Unchecked)
                return
            chans = [c for c in ("robot/joint_pos", "robot/command") if c in traj.channels]
            before = set(self.plot.series())
            label = "" if not self._loaded else aid.rsplit("-", 1)[-1]
            self.plot.add_trajectory(traj, chans or None, label=label)
            self._loaded[aid] = [n for n in self.plot.series() if n not in before]
        else:
            self.plot.remove_series(*self._loaded.pop(aid, []))


if __name__ == "__main__":
    raise SystemExit(preview(CalibratePage))
