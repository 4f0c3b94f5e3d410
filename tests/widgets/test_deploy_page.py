"""The Deploy page through its widgets, against the robot agent (ideal driver) over
loopback: Predict draws the twin's curves from the robot's pose, Run streams the measured
joints over them and saves the run; the real final error matches the prediction; STOP
leaves the robot at rest and the run saved; a robot that does not fit is refused before
upload; Send to Real2Sim starts a refit with the run added."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.workflows.twin import build_twin, load_twin
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.ideal import IdealDriver, panda_like_info
from devices.robots.agent.server import RobotServer
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.client import RobotClient
from devices.robots.wire.auth import new_token
from devices.robots.wire.robot_types import RobotInfo, RobotState
from policies.export import to_onnx
from policies.motion_primitives import torch_module
from policies.policy import Policy
from policies.tasks import make_env
from resources.jobs import run_to_end
from widgets.deploy_page import DeployPage

# 2 shared cores under load: a policy output may come 20+ ms late (the agent's default
# deadline is 5 control periods); the deploy logic does not depend on it
LOADED = WatchdogConfig(policy_timeout_s=0.2)

pytestmark = [pytest.mark.gui, pytest.mark.slow]


class _Link:
    """A RobotLink over a RobotClient to an in-process agent (the ideal driver)."""

    def __init__(self, info: RobotInfo, home: np.ndarray) -> None:
        self.agent = Agent(watchdog=LOADED, driver=IdealDriver(info, initial=home))
        self.agent.start()
        token = new_token()
        self.server = RobotServer(self.agent, token)
        self.server.start()
        self.client = RobotClient("127.0.0.1", self.server.port, token, name="test-deploy")
        self.client.connect()
        self.client.latest_state(timeout_s=5.0)

    def info(self) -> RobotInfo:
        assert self.client.info is not None
        return self.client.info

    def latest_state(self) -> RobotState | None:
        return self.client.latest_state()

    def protocol_client(self) -> RobotClient | None:
        return self.client

    def close(self) -> None:
        self.client.close()
        self.server.close()
        self.agent.close()


def _policy_project(controller: Any, root: Path) -> tuple[str, tuple[str, ...], np.ndarray]:
    proj = controller.new_project(root)
    tid = run_to_end(build_twin(proj, None, procedural=True))
    _, twin = load_twin(proj, tid)
    env = make_env("reach", twin, {"episode_s": 1.5})
    spec, home, cfg = env.policy_spec, env.q_home.copy(), env.config.to_json()
    env.close()
    n = spec.n
    params = np.concatenate([np.full(n, np.log(1.0 / spec.action_scale)), np.full(n, np.log(0.01))])
    pol = Policy(
        to_onnx(torch_module("joint_pd", spec, params), spec.obs_dim),
        spec,
        {
            "task": "reach",
            "twin_id": tid,
            "task_config": cfg,
            # a tiny budget, so that retraining it (close the loop) takes seconds
            "training": {
                "trainer": "cem",
                "seed": 0,
                "cem": {"generations": 1, "population": 4, "episodes": 1},
            },
        },  # fmt: skip
    )
    with proj.new_artifact(
        "policy", inputs=[tid], settings={"task": "reach"}, summary="reach by cem"
    ) as f:
        pol.save(f)
    cfg_fit = {"params": ["robot.joints.panda_joint2.damping"], "budget": 4, "polish_rounds": 0}
    with proj.new_artifact("fit", inputs=[tid], settings={"twin": tid, "config": cfg_fit}) as f:
        (f / "fit.json").write_text(json.dumps({"status": "done"}))
    controller.notify_project_changed()
    return proj.artifacts("policy")[-1].id, spec.joints, home


@pytest.fixture
def setup(controller: Any, tmp_path: Path) -> Iterator[tuple[Any, tuple[str, ...], np.ndarray]]:
    pid, joints, home = _policy_project(controller, tmp_path / "p")
    yield controller, joints, home
    controller.detach_robot()


def _page(qtbot: Any, controller: Any) -> DeployPage:
    page = DeployPage(controller)
    qtbot.addWidget(page)
    page.resize(1200, 700)
    page.show()
    return page


@pytest.mark.realtime  # the agent's watchdog judges the policy's outputs on the wall clock
def test_predict_run_stop_and_send_to_real2sim(
    setup: Any, qtbot: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller, joints, home = setup
    info = dataclasses.replace(panda_like_info(250.0), joint_names=joints)
    controller.attach_robot(_Link(info, home), detail="ideal")
    page = _page(qtbot, controller)
    page.refresh()
    assert not page.showing_empty_state()
    assert "ideal" in page.robot_label.text()
    assert page.camera_pose.isHidden()  # a reach policy observes no object: no camera row
    assert not page.run_button.isEnabled()  # nothing runs before a prediction
    page.goal_seed.setValue(3)
    page.ramp.setValue(0.2)
    page.duration.setValue(4.0)  # margin for a loaded machine (the driver runs in real time)
    page.predict_button.click()
    qtbot.waitUntil(lambda: page.run_button.isEnabled(), timeout=20000)
    plan = page.plan
    assert "SUCCESS" in page.prediction.text()
    curves = page.curves()
    assert curves  # one per moving joint, dashed prediction from the robot's pose
    name = next(iter(curves))
    j = joints.index(name)
    t, y = curves[name]["predicted"]
    assert abs(y[0] - home[j]) < 1e-3 and abs(y[-1] - plan.goal[j]) < 0.05
    with qtbot.waitSignal(page.sig_run_saved, timeout=20000) as sig:
        page.run_button.click()
    res = sig.args[0]
    assert res.outcome["ended"] == "duration", res.outcome
    assert abs(res.outcome["final_error"] - plan.shadow.final_error) < 0.02, res.outcome
    assert "SUCCESS" in page.outcome.text() and res.run_id in page.outcome.text()
    t, q = page.curves()[name]["measured"]
    assert len(t) > 100 and abs(q[-1] - plan.goal[j]) < 0.05  # the live plot got the run
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)
    assert not page.run_button.isEnabled()  # the robot moved: predict again first
    qtbot.wait(600)  # past the progress throttle's interval: no late "running 2.3 / 2.5 s"
    assert "run saved" in page.status.text() and "running" not in page.status.text()

    # STOP during a long run: robot at rest, the run saved as what happened
    page.goal_seed.setValue(5)
    page.duration.setValue(20.0)
    page.predict_button.click()
    qtbot.waitUntil(lambda: page.run_button.isEnabled(), timeout=20000)
    with qtbot.waitSignal(page.sig_run_saved, timeout=20000) as sig:
        page.run_button.click()
        qtbot.waitUntil(lambda: page.progress.value() > 10, timeout=10000)
        page.stop_button.click()
    assert sig.args[0].outcome["ended"] == "operator stop"
    assert "FAILURE" in page.outcome.text()
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)
    st = controller.robot_state()
    assert float(np.max(np.abs(st.joint_vel))) < 0.01

    # Send to Real2Sim: the twin's fit job, with the stopped run added to its recordings
    # (the fit itself is tested in tests/twins and tests/app/test_fit_cli.py)
    import app.workflows.close_loop as close_loop  # the refit calls its own fit_job name

    calls: list[tuple[Any, ...]] = []

    def fake_fit_job(project: Any, twin_id: str, recs: list[str], config: Any, **_: Any) -> Any:
        calls.append((twin_id, list(recs), config))
        yield from ()
        name = "robot.joints.panda_joint2.damping"  # a fit artifact as twins.fit writes it
        with project.new_artifact("fit", inputs=[twin_id, *recs], settings={"twin": twin_id}) as f:
            (f / "fit.json").write_text(json.dumps({"status": "done", "twin": twin_id}))
            x = np.random.default_rng(0).uniform(0.05, 0.15, (40, 1))
            np.savez(f / "samples.npz", names=np.array([name]), x=x)
        return str(project.artifacts("fit")[-1].id)

    monkeypatch.setattr(close_loop, "fit_job", fake_fit_job)
    assert page.refit_button.isEnabled()
    with qtbot.waitSignal(page.sig_refit_done, timeout=20000) as sig:
        page.refit_button.click()
    fid = sig.args[0]
    assert fid in page.status.text()
    twin_id, recs, config = calls[0]
    assert recs[-1] == page.result.trajectory_id and config.params == (
        "robot.joints.panda_joint2.damping",
    )
    assert (
        twin_id
        == Policy.load(controller.project.path_of(page.policy_box.currentData())).record["twin_id"]
    )
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)

    # 4. Retrain from the refit: a training subprocess under the refit's posterior, the
    # stopped (failed) run's start and goal replayed in training; the new policy is picked
    old_pid = page.policy_box.currentData()
    assert page.retrain_button.isEnabled()
    with qtbot.waitSignal(page.sig_retrained, timeout=180000) as sig:
        page.retrain_button.click()
    new_pid = sig.args[0]
    proj = controller.project
    proj.refresh()  # written by the training process
    art = proj.artifact(new_pid)
    assert new_pid != old_pid and list(art.inputs) == [twin_id, fid]
    assert art.settings["dr"] == "posterior"
    cfg = Policy.load(proj.path_of(new_pid)).record["task_config"]
    run = json.loads((proj.path_of(page.result.run_id) / "run.json").read_text())
    assert cfg["replay_starts"] == [{"start": run["start"], "goal": run["goal"]}]
    assert page.policy_box.currentData() == new_pid and "Predict" in page.status.text()
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)
    page.detach()


def test_a_robot_that_does_not_fit_is_refused_before_upload(setup: Any, qtbot: Any) -> None:
    controller, _, _ = setup
    controller.attach_robot(
        _Link(panda_like_info(100.0), np.array(panda_like_info().limits.lower) * 0)
    )
    page = _page(qtbot, controller)
    page.refresh()
    page.predict_button.click()
    qtbot.waitUntil(lambda: "Refused" in page.prediction.text(), timeout=20000)
    text = page.prediction.text()
    assert "joints" in text and "100 Hz" in text
    assert not page.run_button.isEnabled()
    client = controller.robot_link.protocol_client()
    from devices.errors import DeviceError

    with pytest.raises(DeviceError, match="no policy uploaded"):
        client.run_policy()
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)
    page.detach()


def test_a_push_policy_takes_the_camera_pose_file_and_a_bad_one_is_refused(
    setup: Any, qtbot: Any, tmp_path: Path
) -> None:
    """Camera pose (a `calibrate --out` JSON) on the Deploy page: a push policy's object is
    seen by the camera at that pose; a file without a valid T_base_camera is refused before
    anything is uploaded, naming the file and what is wrong."""
    import torch

    controller, _, home = setup
    proj = controller.project
    tid = proj.artifacts("twin")[-1].id
    _, twin = load_twin(proj, tid)
    env = make_env("push", twin, {"episode_s": 1.5})
    spec, cfg = env.policy_spec, env.config.to_json()
    env.close()
    torch.manual_seed(0)
    pol = Policy(to_onnx(torch.nn.Linear(spec.obs_dim, spec.n), spec.obs_dim), spec,
                 {"task": "push", "twin_id": tid, "task_config": cfg})  # fmt: skip
    with proj.new_artifact("policy", inputs=[tid], settings={"task": "push"}) as f:
        pol.save(f)
    controller.notify_project_changed()
    controller.attach_robot(_Link(panda_like_info(), home))
    page = _page(qtbot, controller)
    page.refresh()
    page.policy_box.setCurrentIndex(page.policy_box.findData(proj.artifacts("policy")[-1].id))
    assert page.camera_pose.label.text() == "the scan's calibration"
    assert not page.camera_pose.isHidden()  # the push policy observes the object
    bad = tmp_path / "camera.json"
    bad.write_text(json.dumps({"T_base_camera": [[1, 0, 0], [0, 1, 0]]}))
    page.camera_pose.set_path(bad)
    assert page.camera_pose.label.text() == "camera.json"
    page.predict_button.click()
    qtbot.waitUntil(lambda: "Refused" in page.prediction.text(), timeout=20000)
    assert "camera.json: T_base_camera must be a finite 4x4 matrix" in page.prediction.text()
    assert not page.run_button.isEnabled()
    page.camera_pose.set_path(None)
    assert not page.camera_pose.clear_button.isEnabled()
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)
    page.detach()
