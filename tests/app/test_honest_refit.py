"""Honest outcomes of closing the loop (issue 24, item 2): a deploy recording keeps only the
samples the policy commanded, so no NaN command reaches a fit; a refit of a run with NaN
commands is refused before anything is fitted; a refit whose replays fail ends as an error
naming how many failed and why, and saves no fit artifact (nothing can retrain from it);
`deploy --refit` exits non-zero with that message."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import twins.fit.objective as objective
from app.workflows.close_loop import refit_job
from devices.trajectory import COMMAND_DELAY, Trajectory
from resources.errors import TwinbenchError
from resources.project import Project
from tests.app.refit_rig import done_fits, fake_run, policy_project
from twins.errors import TwinError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, str, str, Any, Any]:
    proj = Project.create(Path(tmp_path_factory.mktemp("refit")) / "p")
    tid, pid, joints, home = policy_project(proj)
    return proj, tid, pid, joints, home


def _run_job(job: Any) -> Any:
    while True:
        try:
            next(job)
        except StopIteration as stop:
            return stop.value


def test_deploy_recording_keeps_only_the_commanded_part() -> None:
    """Before the policy's first tick and after the robot stopped nothing was commanded:
    those samples go; a late policy output inside the run (the actuators kept the previous
    command) is given that command. Nothing NaN is left for a fit."""
    from app.workflows.deploy import commanded_part

    n, k = 3, 60
    t = np.arange(k) * 0.004
    cmd = np.tile(np.linspace(0.0, 1.0, k)[:, None], (1, n))
    delay = np.full((k, 1), 0.001)
    cmd[:4] = delay[:4] = np.nan  # before the first tick
    cmd[30:32] = delay[30:32] = np.nan  # two late policy outputs
    cmd[-15:] = delay[-15:] = np.nan  # after the policy stopped
    traj = Trajectory(
        t,
        {"robot/joint_pos": np.zeros((k, n)), "robot/command": cmd, COMMAND_DELAY: delay},
        {"robot/joint_pos": "rad", "robot/command": "rad", COMMAND_DELAY: "s"},
    )
    modes = ["idle"] * 4 + ["policy"] * 41 + ["stopped"] * 15
    out, out_modes = commanded_part(traj, modes)
    assert len(out) == k - 4 - 15 == len(out_modes)
    assert out_modes[0] == "policy" and out_modes[-1] == "policy"
    out.check_finite("the saved run")  # nothing a replay would trip on
    assert np.allclose(out["robot/command"][30 - 4 : 32 - 4], cmd[29])  # held, as the robot did
    assert out.t[0] == pytest.approx(t[4]) and out.t[-1] == pytest.approx(t[k - 16])
    assert out.meta["command_trim"] == {"head": 4, "tail": 15, "held": 2}


def test_refit_of_a_nan_tailed_run_is_refused_and_saves_nothing(
    rig: tuple[Project, str, str, Any, Any],
) -> None:
    proj, _, pid, joints, home = rig
    traj_id, _ = fake_run(proj, pid, joints, home, nan_tail=15)
    before = done_fits(proj)
    with pytest.raises(TwinbenchError) as err:
        _run_job(refit_job(proj, traj_id))
    msg = str(err.value)
    assert traj_id in msg and "15 samples with NaN/inf in 'robot/command' at its end" in msg
    assert "Nothing was fitted" in msg
    proj.refresh()
    assert done_fits(proj) == before  # no fit artifact: nothing to retrain from


def test_a_refit_whose_replays_all_fail_stops_early_naming_the_error(
    rig: tuple[Project, str, str, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    proj, _, pid, joints, home = rig
    traj_id, _ = fake_run(proj, pid, joints, home, nan_tail=0)
    before = done_fits(proj)

    def explode(*_: Any, **__: Any) -> Any:
        raise TwinError("the twin exploded in the replay")

    monkeypatch.setattr(objective, "_replay_window", explode)
    with pytest.raises(TwinbenchError) as err:
        _run_job(refit_job(proj, traj_id))
    msg = str(err.value)
    failed, of = msg.split(" replays failed")[0].split(": ")[-1].split(" of ")
    assert int(failed) == int(of) > 0, msg  # e.g. "5 of 5 replays failed"
    assert "TwinError: the twin exploded in the replay" in msg and traj_id in msg
    proj.refresh()
    assert done_fits(proj) == before  # not saved, not even as a cancelled checkpoint


def test_a_refit_whose_replays_mostly_fail_is_not_saved_and_a_good_one_is(
    rig: tuple[Project, str, str, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start replays fine, every later candidate fails: the fit runs to its end, its
    result is judged before it is committed, and refused; the same refit without the
    failures is saved as before."""
    proj, _, pid, joints, home = rig
    traj_id, _ = fake_run(proj, pid, joints, home, nan_tail=0)
    before = done_fits(proj)
    real = objective._replay_window
    calls = {"n": 0}
    lock = threading.Lock()

    def flaky(worlds: Any, values: Any, w: Any) -> Any:
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n > 4:  # the start's windows (and only those) replay
            raise TwinError(f"unstable contact at candidate {n}")
        return real(worlds, values, w)

    monkeypatch.setattr(objective, "_replay_window", flaky)
    with pytest.raises(
        TwinbenchError, match=r"\d+ of \d+ replays failed: TwinError: unstable contact"
    ):
        _run_job(refit_job(proj, traj_id))
    proj.refresh()
    assert done_fits(proj) == before
    monkeypatch.setattr(objective, "_replay_window", real)
    fit_id = _run_job(refit_job(proj, traj_id))
    proj.refresh()
    assert done_fits(proj) == [*before, fit_id]


@pytest.fixture
def robot(rig: tuple[Project, str, str, Any, Any]) -> Iterator[tuple[int, str]]:
    from devices.robots.agent.control import Agent
    from devices.robots.agent.drivers.ideal import IdealDriver, panda_like_info
    from devices.robots.agent.server import RobotServer
    from devices.robots.agent.watchdog import WatchdogConfig
    from devices.robots.wire.auth import new_token

    _, _, _, joints, home = rig
    info = dataclasses.replace(panda_like_info(250.0), joint_names=joints)
    # a loaded 2-core machine: a policy output may come late; the deploy does not depend on it
    agent = Agent(
        watchdog=WatchdogConfig(policy_timeout_s=0.2), driver=IdealDriver(info, initial=home)
    )
    agent.start()
    token = new_token()
    server = RobotServer(agent, token)
    server.start()
    try:
        yield server.port, token
    finally:
        server.close()
        agent.close()


@pytest.mark.realtime  # a live deployment on the ideal driver
def test_cli_deploy_refit_exits_non_zero_naming_the_failed_replays(
    rig: tuple[Project, str, str, Any, Any],
    robot: tuple[int, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from app.cli import main
    from devices.robots.wire.auth import write_token_file

    proj, _, pid, _, _ = rig
    port, token = robot
    token_file = tmp_path / "token"
    write_token_file(token_file, token)
    before = done_fits(proj)
    runs = len(proj.artifacts("run"))

    def explode(*_: Any, **__: Any) -> Any:
        raise TwinError("the twin exploded in the replay")

    monkeypatch.setattr(objective, "_replay_window", explode)
    code = main(
        ["deploy", "--project", str(proj.root), "--policy", pid, "--port", str(port),
         "--token-file", str(token_file), "--duration", "1.5", "--ramp", "0.2", "--refit",
         "--quiet"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "replays failed: TwinError: the twin exploded in the replay" in err
    assert "nothing saved" in err
    proj.refresh()
    assert done_fits(proj) == before  # no refit saved
    assert len(proj.artifacts("run")) == runs + 1  # the run itself is saved, and reported
    run = proj.artifacts("run")[-1]
    assert run.id in out
    saved = Trajectory.load(proj.path_of(run.inputs[1]))
    saved.check_finite("the deployed run")  # only its commanded part: replayable
