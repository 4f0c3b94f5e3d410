"""A form field holding one optional file: its name, Choose… and Clear (Qt only here)."""

from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets


class FileField(QtWidgets.QWidget):
    """Shows `default_text` until a file is chosen (filter e.g. "JSON (*.json)")."""

    sig_changed = QtCore.Signal()

    def __init__(
        self,
        title: str,
        file_filter: str,
        default_text: str,
        parent: QtWidgets.QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.title, self.file_filter, self.default_text = title, file_filter, default_text
        self.path: Path | None = None
        row = QtWidgets.QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.label = QtWidgets.QLabel(default_text)
        self.label.setWordWrap(True)
        self.choose_button = QtWidgets.QPushButton("Choose…")
        self.choose_button.clicked.connect(self.choose)
        self.clear_button = QtWidgets.QPushButton("Clear")
        self.clear_button.clicked.connect(lambda: self.set_path(None))
        row.addWidget(self.label, 1)
        row.addWidget(self.choose_button)
        row.addWidget(self.clear_button)
        self.set_path(None)

    def choose(self) -> None:
        name, _ = QtWidgets.QFileDialog.getOpenFileName(self, self.title, "", self.file_filter)
        if name:
            self.set_path(Path(name))

    def set_path(self, path: Path | None) -> None:
        self.path = path
        self.label.setText(self.default_text if path is None else path.name)
        self.label.setToolTip("" if path is None else str(path))
        self.clear_button.setEnabled(path is not None)
        self.sig_changed.emit()
