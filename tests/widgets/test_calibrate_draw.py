"""What the Calibrate page draws: a plot keeps its y range while re-fed curves fit it
(its axes and grid are not drawn again) and fits it again when they leave it or shrink."""

from __future__ import annotations

import numpy as np
import pytest

from widgets.calibrate_draw import keep_y_range
from widgets.trajectory_plot import Series, TrajectoryPlot

pytestmark = [pytest.mark.gui]


def test_y_range_kept_while_the_curves_fit(qtbot) -> None:  # type: ignore[no-untyped-def]
    plot = TrajectoryPlot()
    qtbot.addWidget(plot)
    t = np.linspace(0.0, 5.0, 501)
    for src in ("real", "sim"):
        plot.set_series(Series(f"{src}/joint_pos/j", t, np.sin(t), "rad"), visible=True)
    p = plot.plots()["joint_pos/j"]
    keep_y_range(p)
    y0, y1 = p.vb.viewRange()[1]
    assert y0 < -1.0 and y1 > 1.0 and y1 - y0 < 2.5  # fitted, with a little room
    plot.update_data([Series("sim/joint_pos/j", t, 0.95 * np.sin(t), "rad")])
    keep_y_range(p)
    assert p.vb.viewRange()[1] == [y0, y1]  # fits: the same range
    plot.update_data([Series("sim/joint_pos/j", t, 1.5 * np.sin(t), "rad")])
    keep_y_range(p)
    lo, hi = p.vb.viewRange()[1]
    assert lo <= -1.5 and hi >= 1.5  # out of range: fitted again
    for src in ("real", "sim"):  # both curves shrink to a tenth: fitted again, tighter
        plot.update_data([Series(f"{src}/joint_pos/j", t, 0.1 * np.sin(t), "rad")])
    keep_y_range(p)
    lo, hi = p.vb.viewRange()[1]
    assert -0.15 < lo <= -0.1 and 0.1 <= hi < 0.15
