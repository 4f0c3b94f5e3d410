"""The Calibrate page's tool bar: twin, replay window, Reset values, Save as twin, Fit…

A widget of its own that says what the user asked for through signals; the page
(widgets/calibrate_page.py) wires them to its slots."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from widgets.artifact_combo import ArtifactCombo

WINDOWS = (("1 s windows (as the fit)", 1.0), ("whole recording", None))


class CalibrateToolbar(QtWidgets.QWidget):
    """`sig_twin_chosen`: a twin was picked; `sig_window_changed`: the replay window (s, or
    None for the whole recording); `sig_reset`, `sig_save`, `sig_fit`: the buttons."""

    sig_twin_chosen = QtCore.Signal()
    sig_window_changed = QtCore.Signal(object)
    sig_reset = QtCore.Signal()
    sig_save = QtCore.Signal()
    sig_fit = QtCore.Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        bar = QtWidgets.QHBoxLayout(self)
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(QtWidgets.QLabel("Twin:"))
        self.twin_combo = ArtifactCombo(min_chars=12)  # the newest twin unless one was chosen
        self.twin_combo.activated.connect(lambda _i: self.sig_twin_chosen.emit())
        bar.addWidget(self.twin_combo, 1)
        self.reset_btn = QtWidgets.QPushButton("Reset values")
        self.reset_btn.setToolTip("back to the twin's own values")
        self.reset_btn.clicked.connect(lambda _c=False: self.sig_reset.emit())
        self.fit_btn = QtWidgets.QPushButton("Fit…")
        self.fit_btn.setToolTip(
            "fit chosen parameters to the ticked recordings (CMA-ES + least squares), with a "
            "live convergence plot, the posterior and Apply"
        )
        self.fit_btn.clicked.connect(lambda _c=False: self.sig_fit.emit())
        bar.addWidget(QtWidgets.QLabel("Replay:"))
        self.window_combo = QtWidgets.QComboBox()
        for text, w in WINDOWS:
            self.window_combo.addItem(text, w)
        self.window_combo.setToolTip(
            "open loop over the whole recording, or restarted from the recorded state at "
            "every window start (what the fit compares: its residuals)"
        )
        self.window_combo.currentIndexChanged.connect(
            lambda _i: self.sig_window_changed.emit(self.window_combo.currentData())
        )
        bar.addWidget(self.window_combo)
        self.save_btn = QtWidgets.QPushButton("Save as twin")
        self.save_btn.setToolTip(
            "keep the values tuned here: a new twin whose parent is this twin and whose "
            "inputs add the ticked recordings"
        )
        self.save_btn.clicked.connect(lambda _c=False: self.sig_save.emit())
        bar.addWidget(self.reset_btn)
        bar.addWidget(self.save_btn)
        bar.addWidget(self.fit_btn)
