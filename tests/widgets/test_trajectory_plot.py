"""Trajectory plot: named series from Trajectory values, real solid / sim dashed, residuals,
linked x-axes, one shared time cursor."""

from __future__ import annotations

import numpy as np
import pytest

from devices.trajectory import Trajectory

pytestmark = pytest.mark.gui


def make(source: str, scale: float = 1.0, n_joints: int = 2) -> Trajectory:
    t = np.linspace(0.0, 2.0, 201)
    q = np.stack([scale * np.sin((j + 1) * t) for j in range(n_joints)], 1)
    return Trajectory(t, {"robot/joint_pos": q}, {"robot/joint_pos": "rad"}, source)


@pytest.fixture
def plot(qtbot):  # type: ignore[no-untyped-def]
    from widgets.trajectory_plot import TrajectoryPlot

    w = TrajectoryPlot()
    qtbot.addWidget(w)
    w.resize(900, 600)
    w.show()
    return w


def test_series_grouped_real_solid_sim_dashed(plot) -> None:
    from PySide6 import QtCore

    names = plot.add_trajectory(make("real"))
    names += plot.add_trajectory(make("sim", 0.9))
    assert names == [
        "real/robot/joint_pos[0]",
        "real/robot/joint_pos[1]",
        "sim/robot/joint_pos[0]",
        "sim/robot/joint_pos[1]",
    ]
    plots = plot.plots()
    assert list(plots) == ["robot/joint_pos[0]", "robot/joint_pos[1]"]
    curves = plots["robot/joint_pos[0]"].listDataItems()
    styles = {c.name(): c.opts["pen"].style() for c in curves}
    assert styles == {"real": QtCore.Qt.PenStyle.SolidLine, "sim": QtCore.Qt.PenStyle.DashLine}
    x, y = curves[1].getOriginalDataset()
    assert np.allclose(y, 0.9 * np.sin(x))
    axis = plots["robot/joint_pos[0]"].getAxis("left")
    assert axis.labelUnits == "rad"
    assert plots["robot/joint_pos[1]"].getAxis("bottom").labelUnits == "s"
    assert not plot.hint.isVisible()


def test_residual_is_real_minus_sim(plot) -> None:
    plot.add_trajectory(make("real"))
    plot.add_trajectory(make("sim", 0.9))
    name = plot.add_residual("real/robot/joint_pos[1]", "sim/robot/joint_pos[1]")
    assert name == "residual/robot/joint_pos[1]"
    s = plot.series()[name]
    assert np.allclose(s.y, 0.1 * np.sin(2 * s.t), atol=1e-12)
    assert name in plot.plots()  # its own plot
    plot.set_time(0.75)
    assert plot.values_at()[name] == pytest.approx(0.1 * np.sin(1.5), abs=2e-4)


def test_x_axes_linked(plot, qtbot) -> None:
    plot.add_trajectory(make("real"))
    p0, p1 = plot.plots().values()
    p0.setXRange(0.5, 1.0, padding=0)
    qtbot.waitUntil(lambda: np.allclose(p1.viewRange()[0], [0.5, 1.0], atol=1e-6))


def test_shared_time_cursor(plot, qtbot) -> None:
    plot.add_trajectory(make("real"))
    plot.add_trajectory(make("sim"))
    got: list[float] = []
    plot.sig_time_changed.connect(got.append)
    plot.set_time(1.25)
    assert got == [1.25]
    assert all(c.value() == 1.25 for c in plot._cursors)
    plot._cursors[1].setValue(0.4)  # as when the user drags the cursor in the second plot
    assert got == [1.25, 0.4]
    assert all(c.value() == pytest.approx(0.4) for c in plot._cursors)
    vals = plot.values_at()
    assert vals["real/robot/joint_pos[1]"] == pytest.approx(np.sin(0.8), abs=2e-4)


def test_many_channels_show_few_plots_until_ticked(plot) -> None:
    plot.add_trajectory(make("real", n_joints=7))
    assert len(plot.plots()) == 4
    assert len(plot.series()) == 7
    plot.set_visible(["real/robot/joint_pos[6]"])
    assert list(plot.plots()) == ["robot/joint_pos[6]"]
    plot.remove_series("real/robot/joint_pos[6]")
    assert plot.plots() == {} and plot.hint.isVisibleTo(plot)


def test_bad_series_rejected(plot) -> None:
    from widgets.trajectory_plot import Series

    with pytest.raises(ValueError, match="series 'x': 3 times but 2 values"):
        plot.set_series(Series("x", np.arange(3.0), np.arange(2.0)))


def test_cursor_starts_on_the_data_and_empty_series_are_fine(plot) -> None:
    from widgets.trajectory_plot import Series

    t = np.linspace(3.0, 5.0, 21)
    plot.set_series(Series("real/x[0]", t, t * 2, "m"))
    assert plot.time() == pytest.approx(3.0)
    plot.set_series(Series("sim/x[0]", np.zeros(0), np.zeros(0), "m"))
    assert list(plot.plots()) == ["x[0]"]
