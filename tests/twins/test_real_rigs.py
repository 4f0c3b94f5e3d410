"""Replay of real hardware recordings in the nominal twins (../shared/data/real).

Tolerances come from the authors' own published models integrated open loop on the same
data (computed in these tests): a twin cannot be expected to beat the model it implements,
so each assertion allows the reference model's error plus a margin the twin's friction and
time discretisation explain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from devices.errors import DataFileError
from devices.importers import load_furuta_npz, load_pendulum_csv
from resources import shared_data
from twins.rigs import PENDULUM_ID, qube_twin, simple_pendulum_twin
from twins.simulate import replay

PEND = shared_data("real", "simple_pendulum")
QUBE = shared_data("real", "furuta_pendulum")
needs_data = pytest.mark.skipif(not PEND.is_dir(), reason="shared real data not present")


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


def _authors_ode(real, p=PENDULUM_ID) -> np.ndarray:  # type: ignore[no-untyped-def]
    """tau = J qdd + m cx g sin q + Fv qd + Fc atan(100 qd) + offset, integrated open loop."""
    t, tau = real.t, real["robot/command"][:, 0]
    q, v = real["robot/joint_pos"][0, 0], real["robot/joint_vel"][0, 0]
    out, tt = [q], t[0]
    for k in range(1, len(t)):
        while tt < t[k] - 1e-12:
            h = min(2e-4, t[k] - tt)
            a = (
                tau[k - 1]
                - p["m_cx"] * 9.81 * np.sin(q)
                - p["Fv"] * v
                - p["Fc"] * np.arctan(100 * v)
                - p["offset"]
            ) / p["J"]
            v += a * h
            q += v * h
            tt += h
        out.append(q)
    return np.array(out)


@needs_data
def test_simple_pendulum_urdf_falls_back_and_says_so(tmp_path: Path) -> None:
    spec = simple_pendulum_twin(PEND / "data_urdf_dfki_simple_pendulum.urdf", tmp_path)
    notes = " ".join(spec.robot.notes)  # type: ignore[union-attr]
    assert "Link_1.STL' not found" in notes and "inertia" in notes
    assert "treated as continuous" in notes
    assert (tmp_path / "data_urdf_dfki_simple_pendulum.urdf").is_file()


@needs_data
def test_simple_pendulum_replay_tracks_the_first_second() -> None:
    real = load_pendulum_csv(
        PEND / "results_control_method_pd_system_identification_data_measured.csv",
        PEND / "results_control_method_pd_system_identification_data_desired.csv",
        command="desired",
    ).slice_time(0.0, 1.0)
    spec = simple_pendulum_twin(PEND / "data_urdf_dfki_simple_pendulum.urdf")
    sim = replay(spec, None, real)
    assert np.array_equal(sim.t, real.t) and sim.source == "sim"
    q_real, q_sim = real["robot/joint_pos"][:, 0], sim["robot/joint_pos"][:, 0]
    ref = _authors_ode(real)
    err_ref, err_twin = _rmse(ref, q_real), _rmse(q_sim, q_real)
    # measured here: reference 0.063 rad, twin ~0.10 rad, over a 0.94 rad swing. The twin's
    # Coulomb friction sticks at rest where atan(100 qd) creeps; allow 2.5x the reference.
    assert err_ref < 0.08
    assert err_twin < 2.5 * err_ref
    assert _rmse(q_sim, ref) < 0.08
    # and it is not trivially right: without the motor torque the pendulum stays put
    still = replay(
        spec,
        None,
        real.with_channels(channels={**real.channels, "robot/command": np.zeros((len(real), 1))}),
    )
    assert _rmse(still["robot/joint_pos"][:, 0], q_real) > 3 * err_twin


@needs_data
def test_qube_chirp_replay_matches_the_pendulum_angle() -> None:
    f = sorted((QUBE / "qq_chrip_10to0Hz_p1.5V_250Hz_10s").glob("*.npz"))[0]
    real = load_furuta_npz(f).slice_time(0.0, 2.0)
    sim = replay(qube_twin(), None, real)
    alpha_err = _rmse(sim["robot/joint_pos"][:, 1], real["robot/joint_pos"][:, 1])
    # measured: 0.010 rad (the published ODE gets the same), pendulum swings +-0.035 rad
    assert alpha_err < 0.02
    # the arm drifts on the real rig under a zero-mean chirp (cable, asymmetric friction):
    # not in the published model either; report-only bound
    assert _rmse(sim["robot/joint_pos"][:, 0], real["robot/joint_pos"][:, 0]) < 0.6


def test_importers_refuse_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time,position,velocity\n0,0,0\n1,0,0\n")
    with pytest.raises(DataFileError, match="bad.csv: missing columns \\['torque'\\]"):
        load_pendulum_csv(bad)
    back = tmp_path / "back.csv"
    back.write_text("time,position,velocity,torque\n0,0,0,0\n1,0,0,0\n0.5,0,0,0\n")
    with pytest.raises(DataFileError, match="back.csv: time is not strictly increasing"):
        load_pendulum_csv(back)
    npz = tmp_path / "x.npz"
    np.savez(npz, time=np.arange(3.0), states=np.zeros((3, 4)))
    with pytest.raises(DataFileError, match="x.npz: array 'actions_applied' missing"):
        load_furuta_npz(npz)
