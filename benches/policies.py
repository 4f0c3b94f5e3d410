"""Policies benchmark: task step rates, CEM reach training time and its twin success rate
(nominal and under randomization, Wilson 95 % intervals), PPO training throughput, and
the ONNX export check. All in the procedural demo twin; no lab (that is `sim2real`)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from policies.cem import CemSettings
from policies.evaluate import evaluate
from policies.ppo import PpoSettings
from policies.randomization import TYPICAL_NOISE, Randomization, manual
from policies.tasks import make_env
from policies.train import TrainSettings, train_steps
from twins.executor import LocalExecutor
from twins.from_scan import build_twin
from twins.scan_input import procedural_scan

DESCRIPTION = (
    "reach/push env steps/s; CEM reach: train wall time, twin success nominal and randomized "
    "(95 % CI); PPO steps/s; ONNX vs torch max error"
)
DR_PARAMS = [
    "robot.joints.panda_joint2.damping=uniform:0:2",
    "robot.joints.panda_joint4.damping=uniform:0:2",
    "robot.actuators.panda_joint2.latency=uniform:0:0.02",
    "robot.actuators.panda_joint4.latency=uniform:0:0.02",
]


def _steps_per_s(task: str, spec: Any, steps: int) -> float:
    env = make_env(task, spec, seed=0)
    try:
        env.reset(seed=0)
        t0 = time.perf_counter()
        for k in range(steps):
            *_, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                env.reset(seed=k)
        return steps / (time.perf_counter() - t0)
    finally:
        env.close()


def run(quick: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    episodes = 10 if quick else 50
    with tempfile.TemporaryDirectory() as tmp:
        spec = build_twin(procedural_scan(), Path(tmp) / "twin", name="bench")
        n = 500 if quick else 3000
        out["reach_env_steps_per_s"] = round(_steps_per_s("reach", spec, n), 1)
        out["push_env_steps_per_s"] = round(_steps_per_s("push", spec, n), 1)
        dr = manual(DR_PARAMS, TYPICAL_NOISE)
        cem = CemSettings(population=8 if quick else 12, generations=2 if quick else 6, episodes=3)
        with LocalExecutor(2) as ex:
            for label, rand in (("nominal", Randomization()), ("dr", dr)):
                t0 = time.perf_counter()
                gen = train_steps(
                    "reach", spec, {}, rand, TrainSettings("cem", cem=cem), Path(tmp) / label, ex
                )
                try:
                    while True:
                        next(gen)
                except StopIteration as stop:
                    res = stop.value
                out[f"cem_{label}_train_s"] = round(time.perf_counter() - t0, 1)
                out[f"cem_{label}_onnx_max_err"] = res.policy.record["onnx_check"]["max_abs_err"]
                for where, r in (("nominal", Randomization()), ("dr", dr)):
                    ev = evaluate(res.policy, "reach", spec, {}, r, episodes, executor=ex)
                    key = f"cem_{label}_success_{where}"
                    out[key] = round(ev["success_rate"], 3)
                    out[f"{key}_ci95"] = [round(x, 3) for x in ev["ci95"]]
        t0 = time.perf_counter()
        steps = 1024 if quick else 8192
        ppo = PpoSettings(timesteps=steps, n_envs=2, n_steps=256, chunk_steps=steps)
        gen = train_steps(
            "reach", spec, {}, Randomization(), TrainSettings("ppo", ppo=ppo), Path(tmp) / "ppo"
        )
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            pres = stop.value
        out["ppo_steps_per_s"] = round(steps / (time.perf_counter() - t0), 1)
        out["ppo_onnx_max_err"] = pres.policy.record["onnx_check"]["max_abs_err"]
        out["episodes_per_eval"] = episodes
    return out
