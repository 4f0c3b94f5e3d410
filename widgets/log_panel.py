"""Log panel: the session's Python log records, newest at the bottom, errors in red.

Records arrive from any thread through `AppController.log_added`; a queued signal brings them
to the GUI thread. A level filter hides debug chatter; a traceback shows as a tooltip.
"""

from __future__ import annotations

import logging
import time

from PySide6 import QtCore, QtGui, QtWidgets

from app.controller import AppController, LogEntry

MAX_ROWS = 2000
LEVEL_COLORS = {
    logging.ERROR: QtGui.QColor("#c62828"),
    logging.CRITICAL: QtGui.QColor("#c62828"),
    logging.WARNING: QtGui.QColor("#b26a00"),
}


class LogPanel(QtWidgets.QWidget):
    """A read-only list of log entries with a minimum-level filter and Clear."""

    sig_entry_added = QtCore.Signal(object)  # LogEntry, re-emitted on the GUI thread

    def __init__(self, controller: AppController, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        bar = QtWidgets.QHBoxLayout()
        bar.addWidget(QtWidgets.QLabel("Show:"))
        self.level = QtWidgets.QComboBox()
        for name, lv in (
            ("Info and above", logging.INFO),
            ("Warnings and errors", logging.WARNING),
            ("Errors only", logging.ERROR),
            ("Everything (debug)", logging.DEBUG),
        ):
            self.level.addItem(name, lv)
        self.level.currentIndexChanged.connect(self._refilter)
        bar.addWidget(self.level)
        bar.addStretch(1)
        clear = QtWidgets.QPushButton("Clear")
        clear.clicked.connect(self.clear)
        bar.addWidget(clear)
        lay.addLayout(bar)
        self.view = QtWidgets.QListWidget()
        self.view.setUniformItemSizes(True)
        self.view.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont))
        lay.addWidget(self.view)
        self._entries: list[LogEntry] = []
        self.sig_entry_added.connect(self._append, QtCore.Qt.ConnectionType.QueuedConnection)
        for e in controller.log_entries():
            self._append(e)
        controller.log_added.connect(self._on_log)

    def _on_log(self, entry: LogEntry) -> None:
        try:
            self.sig_entry_added.emit(entry)
        except RuntimeError:  # panel already destroyed
            self.controller.log_added.disconnect(self._on_log)

    def detach(self) -> None:
        self.controller.log_added.disconnect(self._on_log)

    def _min_level(self) -> int:
        return int(self.level.currentData())

    def _append(self, e: LogEntry) -> None:
        self._entries.append(e)
        if len(self._entries) > MAX_ROWS:
            del self._entries[: len(self._entries) - MAX_ROWS]
        if e.level >= self._min_level():
            self._add_row(e)
            while self.view.count() > MAX_ROWS:
                self.view.takeItem(0)
            self.view.scrollToBottom()

    def _add_row(self, e: LogEntry) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(e.time))
        item = QtWidgets.QListWidgetItem(f"{stamp}  {e.level_name:<7} {e.message}")
        item.setData(QtCore.Qt.ItemDataRole.UserRole, e.level)
        color = LEVEL_COLORS.get(e.level)
        if color is not None:
            item.setForeground(color)
        item.setToolTip(f"{e.logger}\n{e.traceback}" if e.traceback else e.logger)
        self.view.addItem(item)

    def _refilter(self) -> None:
        self.view.clear()
        for e in self._entries:
            if e.level >= self._min_level():
                self._add_row(e)
        self.view.scrollToBottom()

    def clear(self) -> None:
        self._entries.clear()
        self.view.clear()

    def rows(self) -> list[tuple[str, QtGui.QColor]]:
        """Visible rows as (text, colour) — what a user sees, for tests."""
        return [
            (self.view.item(i).text(), self.view.item(i).foreground().color())
            for i in range(self.view.count())
        ]
