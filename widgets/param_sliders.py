"""A parameter panel generated from a twin's `ParamSet`: one slider + number per parameter,
grouped by the dotted names, with units and bounds; the slider is logarithmic where the
prior is (log-normal, log-uniform: masses, stiffness, damping that act multiplicatively).

Every move emits `sig_values_edited({name: value})` at once: the receiver coalesces (the
Calibrate page's worker keeps only the newest value of each parameter).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from PySide6 import QtCore, QtWidgets

STEPS = 1000  # slider resolution


class ParamRow(QtWidgets.QWidget):
    """Slider + spin box for one parameter (`param` from twins.params)."""

    sig_value_changed = QtCore.Signal(str, float)

    def __init__(self, param: Any, value: float, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.param = param
        self.log = param.prior in ("loguniform", "lognormal") and param.low > 0
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        self.slider = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
        self.slider.setRange(0, STEPS)
        self.slider.setMinimumWidth(40)
        self.slider.setToolTip(
            f"{param.name}: {param.low:g} … {param.high:g} {param.unit}"
            + (" (log scale)" if self.log else "")
        )
        self.spin = QtWidgets.QDoubleSpinBox()
        self.spin.setRange(param.low, param.high)
        span = max(abs(param.high), abs(param.low), 1e-12)
        decimals = 0 if param.integer else int(np.clip(4 - np.floor(np.log10(span)), 2, 9))
        self.spin.setDecimals(decimals)
        self.spin.setSingleStep((param.high - param.low) / 100 if param.high > param.low else 1.0)
        self.spin.setKeyboardTracking(False)
        self.spin.setMinimumWidth(84)
        self.spin.setButtonSymbols(QtWidgets.QAbstractSpinBox.ButtonSymbols.NoButtons)
        lay.addWidget(self.slider, 1)
        lay.addWidget(self.spin)
        self.set_value(value)
        self.slider.valueChanged.connect(self._slider_moved)
        self.spin.valueChanged.connect(self._spin_changed)

    # slider position <-> value
    def to_value(self, pos: int) -> float:
        p, u = self.param, pos / STEPS
        if p.high <= p.low:
            return float(p.low)
        if self.log:
            v = math.exp(math.log(p.low) + u * (math.log(p.high) - math.log(p.low)))
        else:
            v = p.low + u * (p.high - p.low)
        v = min(max(v, p.low), p.high)
        return float(round(v)) if p.integer else float(v)

    def to_pos(self, value: float) -> int:
        p = self.param
        if p.high <= p.low:
            return 0
        if self.log:
            u = (math.log(max(value, p.low)) - math.log(p.low)) / (
                math.log(p.high) - math.log(p.low)
            )
        else:
            u = (value - p.low) / (p.high - p.low)
        return int(round(min(max(u, 0.0), 1.0) * STEPS))

    def value(self) -> float:
        return float(self.spin.value())

    def set_value(self, value: float) -> None:
        """Show `value` without emitting."""
        for w in (self.slider, self.spin):
            w.blockSignals(True)
        self.spin.setValue(value)
        self.slider.setValue(self.to_pos(value))
        for w in (self.slider, self.spin):
            w.blockSignals(False)

    def _slider_moved(self, pos: int) -> None:
        v = self.to_value(pos)
        self.spin.blockSignals(True)
        self.spin.setValue(v)
        self.spin.blockSignals(False)
        self.sig_value_changed.emit(self.param.name, self.spin.value())

    def _spin_changed(self, v: float) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(self.to_pos(v))
        self.slider.blockSignals(False)
        self.sig_value_changed.emit(self.param.name, float(v))


class ParamSliders(QtWidgets.QWidget):
    """Filter box + tree of `ParamRow`s grouped by dotted name."""

    sig_values_edited = QtCore.Signal(dict)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.filter = QtWidgets.QLineEdit()
        self.filter.setPlaceholderText("filter parameters (e.g. friction, box)")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._apply_filter)
        lay.addWidget(self.filter)
        self.tree = QtWidgets.QTreeWidget()
        self.tree.setColumnCount(3)
        self.tree.setHeaderLabels(["parameter", "value", "unit"])
        self.tree.header().setSectionResizeMode(0, QtWidgets.QHeaderView.ResizeMode.Interactive)
        self.tree.header().setSectionResizeMode(1, QtWidgets.QHeaderView.ResizeMode.Stretch)
        self.tree.header().setSectionResizeMode(2, QtWidgets.QHeaderView.ResizeMode.Fixed)
        self.tree.header().setStretchLastSection(False)
        self.tree.setColumnWidth(0, 112)
        self.tree.setColumnWidth(2, 64)
        self.tree.setIndentation(10)
        lay.addWidget(self.tree, 1)
        self.rows: dict[str, ParamRow] = {}
        self._items: dict[str, QtWidgets.QTreeWidgetItem] = {}
        self.edited: set[str] = set()  # parameters the user moved (the fit dialog's default)

    def populate(self, params: Mapping[str, Any], values: Mapping[str, float]) -> None:
        self.tree.clear()
        self.rows.clear()
        self._items.clear()
        self.edited.clear()
        groups: dict[str, QtWidgets.QTreeWidgetItem] = {}
        for name, p in params.items():
            parts = name.split(".")
            parent: Any = self.tree.invisibleRootItem()
            for depth in range(1, len(parts)):
                key = ".".join(parts[:depth])
                if key not in groups:
                    groups[key] = QtWidgets.QTreeWidgetItem(parent, [parts[depth - 1]])
                    groups[key].setFirstColumnSpanned(True)
                parent = groups[key]
            unit = p.unit if p.unit not in ("", "1") else "–"
            item = QtWidgets.QTreeWidgetItem(parent, [parts[-1], "", unit])
            item.setToolTip(
                0,
                f"{name}\nbounds [{p.low:g}, {p.high:g}] {p.unit}\nprior: {p.prior}"
                + (f"\n{p.doc}" if p.doc else ""),
            )
            item.setToolTip(2, p.unit)
            row = ParamRow(p, values.get(name, p.nominal))
            row.sig_value_changed.connect(self._changed)
            self.tree.setItemWidget(item, 1, row)
            self.rows[name] = row
            self._items[name] = item
        for key, it in groups.items():
            # the physical parameters people tune first are open; solver settings closed
            it.setExpanded(key.startswith("objects") or key in ("robot", "robot.joints"))
        self._apply_filter(self.filter.text())

    def _changed(self, name: str, value: float) -> None:
        self.edited.add(name)
        self.sig_values_edited.emit({name: value})

    def set_values(self, values: Mapping[str, float]) -> None:
        for n, v in values.items():
            row = self.rows.get(n)
            if row is not None and row.value() != v:
                row.set_value(v)

    def values(self) -> dict[str, float]:
        return {n: r.value() for n, r in self.rows.items()}

    def _apply_filter(self, text: str) -> None:
        words = text.lower().split()
        for name, item in self._items.items():
            hide = bool(words) and not all(w in name.lower() for w in words)
            item.setHidden(hide)
            if words and not hide:
                parent = item.parent()
                while parent is not None:
                    parent.setExpanded(True)
                    parent = parent.parent()

        # a group with nothing visible below it is hidden too
        def visible(it: QtWidgets.QTreeWidgetItem | None) -> bool:
            if it is None:
                return False
            if it.childCount() == 0:
                return not it.isHidden()
            shown = [visible(it.child(i)) for i in range(it.childCount())]
            it.setHidden(not any(shown))
            return any(shown)

        root = self.tree.invisibleRootItem()
        for i in range(root.childCount()):
            visible(root.child(i))
