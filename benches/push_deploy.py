"""`python main.py bench push_deploy --json`: a push policy deployed on the virtual lab with
its object seen only through the lab's fixed camera and the workbench's object tracker.

Against a `lab serve` subprocess (424x240 at 15 fps) reached only through the protocol: a
small PPO push policy (trained in the procedural twin; not a training result) is planned
from the tracked cylinder (`track_start_err_mm` vs the lab config's true start pose,
read by this benchmark only) and deployed with the default 0.2 s age limit: how the run
ended, tracker time per frame, pose age at the agent (capture to arrival, robot clock),
frames skipped. Then the stale-tracking stop: an agent in front of the ideal driver runs a
policy observing a streamed object pose; the feed stops; `stale_stop_ms` is the time from
the age limit to the first stopped state (robot clock), over several runs.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.workflows.deploy import deploy_job
from app.workflows.deploy_plan import plan_deploy
from app.workflows.train import TrainRequest, load_policy, train_job
from app.workflows.twin import build_twin
from devices.lab.config import LabConfig
from devices.lab.scenes import default_config_path
from devices.lab.truth import truth_camera_pose
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.ideal import IdealDriver
from devices.robots.agent.launch import start_lab_process
from devices.robots.agent.server import RobotServer
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.client import RobotClient
from devices.robots.wire.auth import new_token
from policies.ppo import PpoSettings
from policies.train import TrainSettings
from reconstruction.pose_feeder import object_source
from resources.jobs import run_to_end
from resources.project import Project

DESCRIPTION = (
    "push deploy on the lab through the tracker: track_start_err_mm, pose age, tracker ms, "
    "run outcome at the 0.2 s age limit; stale_stop_ms after the age limit (agent)"
)
MAX_AGE = 0.2


def _stale_stop_ms(onnx: bytes, spec: dict[str, Any], runs: int) -> list[float]:
    """Age limit -> first stopped state (ms, robot clock) when the feed stops mid-run
    (the push policy on an agent in front of the ideal driver)."""

    name = str(spec["object"])
    out = []
    for _ in range(runs):
        agent = Agent(IdealDriver(), watchdog=WatchdogConfig(policy_timeout_s=0.2))
        agent.start()
        token = new_token()
        server = RobotServer(agent, token)
        server.start()
        try:
            with RobotClient("127.0.0.1", server.port, token) as c:
                c.take_control()
                c.upload_policy(onnx, spec)
                stop = threading.Event()

                def feed(c: RobotClient = c, stop: threading.Event = stop) -> None:
                    while not stop.wait(1 / 30):
                        c.send_object_pose(name, [0.5, 0, 0.05, 0, 0, 0, 1], c.latest_state().t)

                th = threading.Thread(target=feed, daemon=True)
                th.start()
                time.sleep(0.2)
                c.run_policy(ramp_s=0.0)
                time.sleep(0.3)
                with c.recording() as rec:
                    stop.set()
                    th.join()
                    end = time.monotonic() + 2.0
                    while time.monotonic() < end and not any(
                        m["mode"] == "stopped" for m in list(rec)
                    ):
                        time.sleep(0.005)
                first = next(m for m in list(rec) if m["mode"] == "stopped")
                good = agent.objects.good(name)
                assert good is not None
                out.append(1e3 * (first["t"] - (good.t + MAX_AGE)))
        finally:
            server.close()
            agent.close()
    return out


def run(quick: bool = False) -> dict[str, Any]:
    t0 = time.monotonic()
    config = LabConfig.load(default_config_path("panda_table"))
    true_start = np.asarray(next(o for o in config.objects if o.name == "cylinder").pose, float)
    with tempfile.TemporaryDirectory() as tmp:
        proj = Project.create(Path(tmp) / "p")
        tid = run_to_end(build_twin(proj, None, procedural=True))
        ppo = PpoSettings(timesteps=512, n_envs=1, n_steps=256, batch_size=64, chunk_steps=512)
        req = TrainRequest(
            "push",
            tid,
            overrides={"episode_s": 2.0, "object_max_age_s": MAX_AGE},
            settings=TrainSettings(trainer="ppo", ppo=ppo),
            eval_episodes=1,
        )
        pid = run_to_end(train_job(proj, req))
        pol = load_policy(proj, pid)
        spec = pol.spec.with_goal(object_goal=(0.6, 0.2)).to_dict()
        stale = _stale_stop_ms(pol.onnx, spec, 3 if quick else 10)
        with (
            start_lab_process("panda_table", camera_size="424x240", camera_fps=15) as lab,
            RobotClient(lab.host, lab.port, lab.token, name="bench-push") as c,
        ):
            assert c.info is not None
            T = truth_camera_pose(config, "fixed")  # a calibrated camera (bench scan's error)
            src = object_source(proj, tid, ["cylinder"], "fixed", T, c.info.description)
            t_plan = time.monotonic()
            plan = plan_deploy(proj, c, pid, objects=src)
            plan_s = time.monotonic() - t_plan
            assert plan.object_start is not None
            res = run_to_end(deploy_job(proj, c, plan))
    out = res.outcome
    feed = out.get("object_feed", {})
    return {
        "track_start_err_mm": 1e3 * float(np.linalg.norm(plan.object_start[:3] - true_start[:3])),
        "deploy_ended": out["ended"],
        "deploy_ran_to_end": out["ended"] == "duration",
        "pose_age_ms_median": feed.get("age_ms_median"),
        "pose_age_ms_p95": feed.get("age_ms_p95"),
        "track_ms_median": feed.get("track_ms_median"),
        "frames_tracked": feed.get("frames"),
        "frames_skipped": feed.get("skipped"),
        "plan_s": round(plan_s, 2),
        "max_age_s": MAX_AGE,
        "stale_stop_ms_median": float(np.median(stale)),
        "stale_stop_ms_max": float(np.max(stale)),
        "stale_stop_runs": len(stale),
        "wall_s": round(time.monotonic() - t0, 1),
    }
