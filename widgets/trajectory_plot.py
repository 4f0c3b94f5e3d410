"""Trajectory plot, PlotJuggler style: one store of named series, stacked plots with linked
x-axes, one shared draggable time cursor.

Series names are `<source>/<channel>[<k>]`: `real/robot/joint_pos[0]`, `sim/robot/joint_pos[0]`,
`residual/robot/joint_pos[0]`. Series that differ only in source (real vs sim) share a plot —
real solid, sim dashed; residuals get their own plot. Tick a series in the list to show it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from numpy.typing import NDArray
from PySide6 import QtCore, QtWidgets

from devices.trajectory import Trajectory

COLORS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]
MAX_AUTO_PLOTS = 4
LEFT_AXIS_PX = 58


@dataclass(frozen=True)
class Series:
    """One named 1-D series: times (s), values, unit."""

    name: str
    t: NDArray[np.float64]
    y: NDArray[np.float64]
    unit: str = ""

    @property
    def source(self) -> str:
        """real / sim / residual (a label after '@' tells recordings apart)."""
        return self.name.split("/", 1)[0].split("@", 1)[0]

    @property
    def key(self) -> str:
        """The plot it belongs to: real and sim of one channel share; residuals are apart."""
        src, rest = self.name.split("/", 1) if "/" in self.name else ("", self.name)
        return self.name if src == "residual" else rest


def series_from_trajectory(
    traj: Trajectory,
    channels: Iterable[str] | None = None,
    label: str = "",
    t0: float | None = None,
) -> list[Series]:
    """Split a Trajectory into `<source>/<channel>[k]` series with the channel's unit
    (`<source>@<label>/…` when a label tells several recordings apart). Times are shifted
    by `t0` (default: the recording's first sample, so plots start at 0 s, not at the
    robot clock's 32 s)."""
    src = f"{traj.source}@{label}" if label else traj.source
    shift = float(traj.t[0]) if t0 is None and len(traj.t) else float(t0 or 0.0)
    t = traj.t - shift
    out = []
    for ch in channels or traj.channels:
        arr = traj[ch]
        for k in range(arr.shape[1]):
            out.append(Series(f"{src}/{ch}[{k}]", t, arr[:, k], traj.units.get(ch, "")))
    return out


def residual(a: Series, b: Series) -> Series:
    """`a - b` on a's timestamps (b linearly interpolated), named `residual/<channel>`."""
    rest = a.name.split("/", 1)[1] if "/" in a.name else a.name
    y = a.y - np.interp(a.t, b.t, b.y)
    return Series(f"residual/{rest}", a.t, y, a.unit)


class TrajectoryPlot(QtWidgets.QWidget):
    """Series list (tick to show) beside stacked linked plots with a shared time cursor."""

    sig_time_changed = QtCore.Signal(float)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._series: dict[str, Series] = {}
        self._plots: dict[str, pg.PlotItem] = {}
        self._curves: dict[str, pg.PlotDataItem] = {}
        self._cursors: list[pg.InfiniteLine] = []
        self._time = 0.0
        self._syncing = False
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        side = QtWidgets.QWidget()
        self.side_layout = QtWidgets.QVBoxLayout(side)  # pages may add widgets above the list
        self.side_layout.setContentsMargins(0, 0, 0, 0)
        self.side_layout.addWidget(QtWidgets.QLabel("<b>Series</b> (tick to show)"))
        self.list = QtWidgets.QListWidget()
        self.list.setMinimumWidth(170)
        self.list.itemChanged.connect(lambda _: self._rebuild())
        self.side_layout.addWidget(self.list, 1)
        self.layout_widget = pg.GraphicsLayoutWidget()
        self.layout_widget.setBackground("w")
        self.hint = QtWidgets.QLabel(
            "No series yet: load a trajectory to compare real and simulated motion."
        )
        self.hint.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)
        self.hint.setWordWrap(True)  # never widens the page beside other panels
        right = QtWidgets.QWidget()
        rl = QtWidgets.QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.hint)
        rl.addWidget(self.layout_widget)
        split.addWidget(side)
        split.addWidget(right)
        split.setStretchFactor(1, 4)
        split.setSizes([240, 800])
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)
        self._rebuild()

    # -- store ---------------------------------------------------------------------------
    def series(self) -> dict[str, Series]:
        return dict(self._series)

    def set_series(self, s: Series, visible: bool | None = None, redraw: bool = True) -> None:
        """Add or replace one series. New series are shown while few plots are visible."""
        if len(s.t) != len(s.y):
            raise ValueError(f"series '{s.name}': {len(s.t)} times but {len(s.y)} values")
        existing = self.list.findItems(s.name, QtCore.Qt.MatchFlag.MatchExactly)
        self._series[s.name] = s
        self.list.blockSignals(True)
        if existing:
            item = existing[0]
        else:
            item = QtWidgets.QListWidgetItem(s.name)
            item.setFlags(item.flags() | QtCore.Qt.ItemFlag.ItemIsUserCheckable)
            shown_keys = {self._series[n].key for n in self.visible_series() if n in self._series}
            auto = s.key in shown_keys or len(shown_keys) < MAX_AUTO_PLOTS
            item.setCheckState(
                QtCore.Qt.CheckState.Checked if auto else QtCore.Qt.CheckState.Unchecked
            )
            self.list.addItem(item)
        if visible is not None:
            item.setCheckState(
                QtCore.Qt.CheckState.Checked if visible else QtCore.Qt.CheckState.Unchecked
            )
        self.list.blockSignals(False)
        if redraw:
            self._rebuild()

    def add_trajectory(
        self,
        traj: Trajectory,
        channels: Iterable[str] | None = None,
        label: str = "",
        t0: float | None = None,
    ) -> list[str]:
        """Add every component of the trajectory's channels as series (time from `t0`,
        default the recording's start); returns their names."""
        names = []
        for s in series_from_trajectory(traj, channels, label, t0):
            self.set_series(s, redraw=False)
            names.append(s.name)
        self._rebuild()
        return names

    def update_data(self, series: Iterable[Series]) -> None:
        """Replace the data of existing series in place (their curves are re-fed, no plot
        is rebuilt: live re-simulation redraws at slider speed); new series are added."""
        new = False
        for s in series:
            if len(s.t) != len(s.y):
                raise ValueError(f"series '{s.name}': {len(s.t)} times but {len(s.y)} values")
            if s.name not in self._series:
                self.set_series(s, redraw=False)
                new = True
                continue
            self._series[s.name] = s
            curve = self._curves.get(s.name)
            if curve is not None:
                curve.setData(s.t, s.y)
        if new:
            self._rebuild()

    def add_residual(self, real_name: str, sim_name: str) -> str:
        """Add `residual/<channel>` = real - sim (sim interpolated onto the real times)."""
        r = residual(self._series[real_name], self._series[sim_name])
        self.set_series(r, visible=True)
        return r.name

    def remove_series(self, *names: str) -> None:
        for name in names:
            self._series.pop(name, None)
            for item in self.list.findItems(name, QtCore.Qt.MatchFlag.MatchExactly):
                self.list.takeItem(self.list.row(item))
        self._rebuild()

    def clear(self) -> None:
        self._series.clear()
        self.list.clear()
        self._rebuild()

    def visible_series(self) -> list[str]:
        out = []
        for i in range(self.list.count()):
            it = self.list.item(i)
            if it.checkState() == QtCore.Qt.CheckState.Checked:
                out.append(it.text())
        return out

    def set_visible(self, names: Iterable[str]) -> None:
        """Show exactly these series."""
        want = set(names)
        self.list.blockSignals(True)
        for i in range(self.list.count()):
            it = self.list.item(i)
            it.setCheckState(
                QtCore.Qt.CheckState.Checked
                if it.text() in want
                else QtCore.Qt.CheckState.Unchecked
            )
        self.list.blockSignals(False)
        self._rebuild()

    # -- drawing -------------------------------------------------------------------------
    def plots(self) -> dict[str, pg.PlotItem]:
        """Plot key -> PlotItem, top to bottom."""
        return dict(self._plots)

    def _rebuild(self) -> None:
        self.layout_widget.clear()
        self._plots, self._cursors, self._curves = {}, [], {}
        groups: dict[str, list[Series]] = {}
        for name in self.visible_series():
            s = self._series[name]
            groups.setdefault(s.key, []).append(s)
        self.hint.setVisible(not groups)
        self.layout_widget.setVisible(bool(groups))
        ts = [s.t for g in groups.values() for s in g if len(s.t)]
        if ts:  # keep the cursor on the data (recordings often start at t > 0)
            t_lo, t_hi = min(float(t[0]) for t in ts), max(float(t[-1]) for t in ts)
            if not t_lo <= self._time <= t_hi:
                self._time = t_lo
        first: pg.PlotItem | None = None
        for row, (key, members) in enumerate(groups.items()):
            p = self.layout_widget.addPlot(row=row, col=0)
            p.showGrid(x=True, y=True, alpha=0.25)
            p.setClipToView(True)
            p.setDownsampling(auto=True, mode="peak")
            legend = p.addLegend(offset=(-10, 5), labelTextSize="8pt")
            legend.setBrush(pg.mkBrush(255, 255, 255, 200))
            unit = members[0].unit
            p.setTitle(f"<span style='color:#333'>{key}</span>", size="9pt", justify="left")
            # One unit per channel kind: no automatic mrad/krad prefixes that would make two
            # joint plots read in different units.
            p.getAxis("left").enableAutoSIPrefix(False)
            p.getAxis("bottom").enableAutoSIPrefix(False)
            # a fixed axis width: stacked plots line up in time, and new tick labels
            # (live re-simulation) do not re-lay out and repaint the whole stack
            p.getAxis("left").setWidth(LEFT_AXIS_PX)
            # axes (with their grid lines, drawn over the whole plot) kept as pixmaps: a
            # curve re-fed at slider speed then repaints without replaying every tick label
            for ax in p.axes.values():
                ax["item"].setCacheMode(QtWidgets.QGraphicsItem.CacheMode.DeviceCoordinateCache)
            p.setLabel("left", units=_si(unit))
            for s in members:
                color = (
                    COLORS[zlib.crc32(s.key.encode()) % len(COLORS)]
                    if s.source != "residual"
                    else "#444"
                )
                style = {
                    "sim": QtCore.Qt.PenStyle.DashLine,
                    "residual": QtCore.Qt.PenStyle.DotLine,
                }.get(s.source, QtCore.Qt.PenStyle.SolidLine)
                pen = pg.mkPen(color, width=1.6, style=style)
                self._curves[s.name] = p.plot(
                    s.t, s.y, pen=pen, name=s.name.split("/", 1)[0], connect="finite"
                )
            if first is None:
                first = p
            else:
                p.setXLink(first)
            cur = pg.InfiniteLine(
                self._time,
                angle=90,
                movable=True,
                pen=pg.mkPen("#e53935", width=1.5),
                hoverPen=pg.mkPen("#ff1744", width=3),
            )
            cur.sigPositionChanged.connect(self._on_cursor_moved)
            p.addItem(cur, ignoreBounds=True)
            self._cursors.append(cur)
            self._plots[key] = p
        for i, p in enumerate(self._plots.values()):
            last = i == len(self._plots) - 1
            p.setLabel("bottom", "time" if last else None, units="s" if last else None)
            p.getAxis("bottom").setStyle(showValues=last)

    def _on_cursor_moved(self, line: pg.InfiniteLine) -> None:
        if self._syncing:
            return
        self.set_time(float(line.value()))

    def time(self) -> float:
        return self._time

    def set_time(self, t: float) -> None:
        """Move the shared cursor on every plot to `t` (s); emits sig_time_changed once."""
        if t == self._time and all(c.value() == t for c in self._cursors):
            return
        self._time = float(t)
        self._syncing = True
        try:
            for c in self._cursors:
                c.setValue(self._time)
        finally:
            self._syncing = False
        self.sig_time_changed.emit(self._time)

    def values_at(self, t: float | None = None) -> dict[str, float]:
        """Each visible series' value at time `t` (default: the cursor), interpolated."""
        t = self._time if t is None else t
        return {
            n: float(np.interp(t, self._series[n].t, self._series[n].y))
            for n in self.visible_series()
        }


def _si(unit: str) -> str | None:
    """pyqtgraph unit label (it adds SI prefixes itself, so keep only plain units)."""
    return unit or None


if __name__ == "__main__":  # preview: a real and a simulated joint trajectory
    import sys

    qapp = QtWidgets.QApplication(sys.argv)
    t = np.linspace(0, 4, 800)
    q = np.stack([np.sin(t * (1 + 0.3 * j)) for j in range(3)], 1)
    real = Trajectory(
        t,
        {"robot/joint_pos": q + np.random.default_rng(0).normal(0, 0.01, q.shape)},
        {"robot/joint_pos": "rad"},
        "real",
    )
    sim = Trajectory(t, {"robot/joint_pos": q * 0.95}, {"robot/joint_pos": "rad"}, "sim")
    w = TrajectoryPlot()
    w.add_trajectory(real)
    w.add_trajectory(sim)
    w.add_residual("real/robot/joint_pos[0]", "sim/robot/joint_pos[0]")
    w.sig_time_changed.connect(lambda x: w.setWindowTitle(f"t = {x:.3f} s"))
    w.resize(1000, 700)
    w.show()
    from widgets.pages import exec_preview

    sys.exit(exec_preview(qapp, w))
