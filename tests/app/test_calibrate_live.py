"""LiveCalibration: parameter edits coalesce (newest wins, results overtaken by a newer edit
are never published), what it publishes is the twin's replay at the published values, and
the process pool gives the same numbers as the in-thread replay."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from app.workflows.calibrate_live import CalibFrame, LiveCalibration
from devices.trajectory import Trajectory
from twins.fit.objective import windows
from twins.rigs import qube_twin
from twins.simulate import replay

pytestmark = pytest.mark.slow
DAMPING = "robot.joints.pendulum.damping"


def released_pendulum(spec, damping: float = 2e-4, seconds: float = 3.0) -> Trajectory:  # type: ignore[no-untyped-def]
    """The Qube's pendulum let go at 0.4 rad with no motor command, simulated at `damping`
    (N m s/rad) and kept as the 'real' recording."""
    t = np.arange(0.0, seconds, 0.002)
    q = np.zeros((len(t), 2))
    q[0, 1] = 0.4
    start = Trajectory(
        t,
        {"robot/joint_pos": q},
        {"robot/joint_pos": "rad"},
        meta={"joint_names": ["arm", "pendulum"]},
    )
    sim = replay(spec, {DAMPING: damping}, start)
    return Trajectory(
        sim.t,
        {"robot/joint_pos": sim["robot/joint_pos"], "robot/joint_vel": sim["robot/joint_vel"]},
        dict(sim.units),
        "real",
        {"joint_names": ["arm", "pendulum"], "name": "release"},
    )


def _wait(cond, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_newest_edit_wins_and_matches_a_direct_replay() -> None:
    spec = qube_twin()
    rec = released_pendulum(spec)
    published: list[tuple[int, float]] = []
    lock = threading.Lock()
    live: LiveCalibration | None = None

    def on_frame() -> None:
        assert live is not None
        f = live.take_frame()
        if f is not None:
            with lock:
                published.append((f.request, f.values[DAMPING]))

    live = LiveCalibration(spec, {"r": rec}, on_frame)
    try:
        _wait(lambda: live.latest_frame() is not None)
        edits = np.linspace(1e-4, 6e-4, 25)
        last = 0
        for v in edits:  # a slider storm: far faster than one replay
            last = live.set_values({DAMPING: float(v)})
        _wait(lambda: (f := live.latest_frame()) is not None and f.request == last)
        final = live.latest_frame()
        assert final is not None
        assert final.values[DAMPING] == pytest.approx(edits[-1])
        # coalesced: far fewer re-simulations than edits, and nothing older published later
        assert live.simulated < len(edits) / 2
        with lock:
            reqs = [r for r, _ in published]
        assert reqs == sorted(reqs)
        # the curve drawn is the twin's replay at exactly those values (world retuned in
        # place, never rebuilt for a damping change)
        direct = replay(spec, {DAMPING: float(edits[-1])}, rec)
        np.testing.assert_allclose(
            final.sims["r"]["robot/joint_pos"], direct["robot/joint_pos"], rtol=0, atol=1e-12
        )
        assert not final.rebuilt
    finally:
        live.close()
    assert not live.alive


def test_worker_processes_give_the_in_thread_numbers() -> None:
    spec = qube_twin()
    rec = released_pendulum(spec)
    out = {}
    ghosts = {}
    firsts = {}
    for procs in (0, 2):
        seen: list[CalibFrame | None] = []
        box: list[LiveCalibration] = []

        def take(s: list[CalibFrame | None] = seen, b: list[LiveCalibration] = box) -> None:
            while not b:  # the first frame can come before the constructor returns
                time.sleep(0.001)
            s.append(b[0].take_frame())  # on the worker thread: every frame, in order

        live = LiveCalibration(spec, {"r": rec}, take, window_s=1.0, processes=procs)
        box.append(live)
        try:
            live.set_cursor(1.3)
            req = live.set_values({DAMPING: 3e-4})
            _wait(lambda lv=live, r=req: (f := lv.latest_frame()) is not None and f.request == r)
            _wait(lambda lv=live: (f := lv.latest_frame()) is not None and f.full_ghost)
            mine = [f for f in seen if f is not None and f.request == req]
            # worker processes: the ghost at the cursor first, over the recording after
            assert [f.full_ghost for f in mine] == ([True] if procs == 0 else [False, True])
            assert mine[0].sims is mine[-1].sims
            firsts[procs] = mine[0].ghost["r"]
            f = live.latest_frame()
            assert f is not None and not f.error
            out[procs] = f.sims["r"]["robot/joint_pos"]
            ghosts[procs] = f.ghost["r"]
        finally:
            live.close()
    np.testing.assert_array_equal(out[0], out[2])
    # the ghost (body poses over the recording) too, and it follows the simulated joints:
    # the pendulum link turns with the simulated pendulum angle
    g0, g2 = ghosts[0], ghosts[2]
    assert set(g0.poses) == set(g2.poses) and len(g0.t) == len(g2.t) == 75  # 25 per second
    for body in g0.poses:
        np.testing.assert_allclose(g0.poses[body], g2.poses[body], atol=1e-12)
    # a first frame with only the cursor's sample holds the same poses as the full ghost
    first = firsts[2]
    k = int(np.argmin(np.abs(g0.t - 1.3)))
    assert len(first.t) == 1 and first.t[0] == pytest.approx(g0.t[k])
    for body in g0.poses:
        np.testing.assert_allclose(first.poses[body][0], g0.poses[body][k], atol=1e-9)
    link = next(b for b in g0.poses if "pendulum" in b)
    arm = next(b for b in g0.poses if "arm" in b)
    # the pendulum link relative to the arm link it hangs from
    R = np.einsum("kji,kjl->kil", g0.poses[arm][:, :3, :3], g0.poses[link][:, :3, :3])
    k = np.clip(np.rint(g0.t / 0.002).astype(int), 0, len(out[0]) - 1)
    angle = out[0][k, 1]
    rel = np.einsum("ji,kjl->kil", R[0], R)  # rotation since the start
    turned = np.arccos(np.clip((np.trace(rel, axis1=1, axis2=2) - 1) / 2, -1, 1))
    np.testing.assert_allclose(turned, np.abs(angle - angle[0]), atol=2e-3)
    # windowed: each 1 s window restarts from the recording (the fit's view); the real
    # recording was made at 2e-4, so just after each restart the sim sits on the real curve
    # (open loop it has drifted away by then)
    starts = [int(round(w.meta["window_start_s"] / 0.002)) for w in windows(rec, 1.0)]
    assert len(starts) == 3
    real = rec["robot/joint_pos"][:, 1]
    whole = replay(spec, {DAMPING: 3e-4}, rec)["robot/joint_pos"][:, 1]
    for i in starts[1:]:
        assert abs(out[0][i + 1, 1] - real[i + 1]) < 2e-3
        assert abs(whole[i + 1] - real[i + 1]) > 5 * abs(out[0][i + 1, 1] - real[i + 1])


def test_a_state_only_recording_is_refused_with_a_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from app.workflows import fit as fit_flow
    from app.workflows.calibrate_open import open_job
    from resources.jobs import run_to_end
    from resources.project import Project

    proj = Project.create(tmp_path / "p")
    tid = fit_flow.import_rig_twin(proj, "qube_servo2")
    good = released_pendulum(qube_twin(), seconds=0.5)
    cmd = np.full((len(good), 1), np.nan)  # the lab's state stream: nothing was commanded
    state_only = good.with_channels(
        channels={**dict(good.channels), "robot/command": cmd},
        units={**dict(good.units), "robot/command": "V"},
        meta={**dict(good.meta), "command_joints": ["arm"]},
    )
    ids = []
    for traj in (good, state_only):
        with proj.new_artifact("trajectory") as folder:
            traj.save(folder)
        ids.append(proj.artifacts("trajectory")[-1].id)
    inputs = run_to_end(open_job(proj, tid, ids))
    assert list(inputs.recordings) == [ids[0]]
    assert (
        "no complete commands" in inputs.refused[ids[1]]
        and "Record panel" in inputs.refused[ids[1]]
    )
