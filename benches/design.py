"""Design benchmark: recordings the identification loop needs when each next motion is the
D-optimal suggestion vs a random library motion (benches/design_loop.py), on the Panda twin
with known truth (servo bandwidths of some joints, started 30-50 % off). The library is the
design CLI's default one (a chirp and a multisine on all joints, a chirp and a step series on
each joint). Reports `suggested_vs_random_recordings` (target <= 0.6): the suggested loop's
count over the random loops' mean; a loop that does not get there in `max_recordings`
counts as max_recordings + 1."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benches.design_loop import recordings_needed
from twins.fit.design import default_candidates, robot_info_for, start_pose
from twins.from_scan import build_twin
from twins.scan_input import procedural_scan

DESCRIPTION = (
    "identification loop on the Panda twin: recordings needed with the D-optimal next motion "
    "vs a random library motion"
)


def run(quick: bool = False, executor: Any = None) -> dict[str, Any]:
    """`executor`: where the loops' fits and information rankings run (serial when None;
    bench fit passes its process pool)."""

    joints = (1, 4) if quick else (1, 2, 4)
    truth = {
        f"robot.actuators.panda_joint{j}.bandwidth": v
        for j, v in zip(joints, (40.0, 25.0, 55.0), strict=False)
    }
    start = {p: 20.0 for p in truth}
    seeds = range(3 if quick else 6)
    max_rec = 8
    out: dict[str, Any] = {"params": list(truth), "truth": truth, "start": start}
    with tempfile.TemporaryDirectory() as tmp:
        spec = build_twin(procedural_scan(), Path(tmp) / "twin", name="bench-design")
        t0 = time.perf_counter()
        info = robot_info_for(spec)
        cands = default_candidates(info, start_pose(spec, info), amplitude=0.1, duration=2.0)
        out["candidates"] = len(cands)
        sug = recordings_needed(
            spec, truth, start, cands, "suggested", max_recordings=max_rec, executor=executor
        )
        out["suggested"] = sug.to_json()
        t1 = time.perf_counter()
        rnd = [
            recordings_needed(
                spec,
                truth,
                start,
                cands,
                "random",
                seed=s,
                max_recordings=max_rec,
                executor=executor,
            )
            for s in seeds
        ]
        out["random"] = [r.to_json() for r in rnd]
        t2 = time.perf_counter()
    counts = [r.recordings or max_rec + 1 for r in rnd]
    n_sug = sug.recordings or max_rec + 1
    out["suggested_recordings"] = n_sug
    out["random_recordings_mean"] = round(sum(counts) / len(counts), 3)
    out["suggested_vs_random_recordings"] = round(n_sug / (sum(counts) / len(counts)), 3)
    out["suggested_loop_s"] = round(t1 - t0, 1)
    out["random_loops_s"] = round(t2 - t1, 1)
    return out
