"""The Calibrate page's tool bar: twin, replay window, Reset values, Save as twin, Fit…"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6 import QtWidgets

from widgets.artifact_combo import ArtifactCombo

if TYPE_CHECKING:
    from widgets.calibrate_page import CalibratePage

WINDOWS = (("1 s windows (as the fit)", 1.0), ("whole recording", None))


def toolbar(page: CalibratePage) -> QtWidgets.QHBoxLayout:
    """The bar's widgets, made as the page's attributes and wired to its slots."""
    bar = QtWidgets.QHBoxLayout()
    bar.addWidget(QtWidgets.QLabel("Twin:"))
    page.twin_combo = ArtifactCombo(min_chars=12)  # the newest twin unless one was chosen
    page.twin_combo.activated.connect(lambda _i: page.reload())
    bar.addWidget(page.twin_combo, 1)
    page.reset_btn = QtWidgets.QPushButton("Reset values")
    page.reset_btn.setToolTip("back to the twin's own values")
    page.reset_btn.clicked.connect(page.reset_values)
    page.fit_btn = QtWidgets.QPushButton("Fit…")
    page.fit_btn.setToolTip(
        "fit chosen parameters to the ticked recordings (CMA-ES + least squares), with a "
        "live convergence plot, the posterior and Apply"
    )
    page.fit_btn.clicked.connect(page.open_fit)
    bar.addWidget(QtWidgets.QLabel("Replay:"))
    page.window_combo = QtWidgets.QComboBox()
    for text, w in WINDOWS:
        page.window_combo.addItem(text, w)
    page.window_combo.setToolTip(
        "open loop over the whole recording, or restarted from the recorded state at "
        "every window start (what the fit compares: its residuals)"
    )
    page.window_combo.currentIndexChanged.connect(page._window_changed)
    bar.addWidget(page.window_combo)
    page.save_btn = QtWidgets.QPushButton("Save as twin")
    page.save_btn.setToolTip(
        "keep the values tuned here: a new twin whose parent is this twin and whose "
        "inputs add the ticked recordings"
    )
    page.save_btn.clicked.connect(page.save_twin)
    bar.addWidget(page.reset_btn)
    bar.addWidget(page.save_btn)
    bar.addWidget(page.fit_btn)
    return bar
