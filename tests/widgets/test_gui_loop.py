"""The whole loop in the GUI, on the virtual lab, with small budgets (issue 12 part 8), as
`bench loop` runs it (benches/loop_run.py): scan (Scan page, virtual lab quick guided scan,
accept) -> twin (Twin page, from the scan) -> record (Record panel, a chirp on the connected
lab robot) -> fit (Fit window) -> train (Policies page, CEM under the fit's posterior) ->
deploy (Deploy page: predict, run) -> refit (Send to Real2Sim; first a NaN-tailed run and
one cut short on disk, which must fail on the page) -> retrain (from the refit). Every step
goes through the widgets a user clicks; at the end the artifacts and their lineage make one
chain."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.realtime]
# Issue 24's target for the longest event-loop stall of a step is 200 ms, a benchmark figure
# (`bench loop`); this test holds a regression bound the old code broke in every run.
STALL_BOUND_MS = 600.0


@pytest.mark.timeout(1500)
def test_demo_scan_twin_record_fit_train_deploy_refit(
    window, controller, qtbot, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from benches.loop_run import STEPS, GuiLoop

    shots = os.environ.get("TWINBENCH_LOOP_SHOTS")  # the README's walkthrough pictures
    loop = GuiLoop(
        window, controller, tmp_path / "loop", inject=True, shots=Path(shots) if shots else None
    )
    report = loop.run()
    (tmp_path / "loop.json").write_text(json.dumps(report, indent=1, default=str))
    print("worst event-loop stall per step (ms):", json.dumps(report["gui_stall_ms"]))
    failed = {k: v for k, v in report["steps"].items() if v["status"] != "ok"}
    assert not failed, json.dumps(failed, indent=1)
    assert report["steps_completed"] == len(STEPS)

    # the injected failures were reported as failures, naming why
    (nan_run, cut_run) = report["injected"]
    assert nan_run["reported"] and not nan_run["as_success"], nan_run
    assert f"{15} samples with NaN/inf in 'robot/command'" in nan_run["message"], nan_run
    assert cut_run["reported"] and not cut_run["as_success"], cut_run
    assert cut_run["trajectory"] in cut_run["message"], cut_run
    assert report["link_drops_unrecovered"] == 0, report["link_events"]

    # The GUI thread only draws (issue 24 part 4). Before, the Calibrate page closed its
    # replay world on the GUI thread and opened and drew the twin while out of view: deploy
    # 0.9-1.2 s, refit 0.9-1.6 s, train 0.36-0.86 s; after, on 2 cores: record 45-152,
    # train 15-39, deploy 107-204, refit 184-198, retrain 6-87 ms. Not fixed yet: scan ~300,
    # twin 75-396 (the Twin page's first 3D draw), fit 167-232 ms (the Fit window's plots).
    worst = report["gui_stall_ms"]
    fixed = ("record", "train", "deploy", "refit", "retrain")
    assert all(worst[k] <= STALL_BOUND_MS for k in fixed), worst

    # the chain: scan -> twin -> recordings -> fit -> policy -> run -> refit -> policy
    ids = report["ids"]
    proj = loop.proj
    proj.refresh()
    run = proj.artifact(ids["run"])
    assert list(run.inputs) == [ids["policy"], ids["run_trajectory"]]
    chain = [ids[k] for k in ("scan", "twin", "recording", "fit", "policy", "run", "refit")]
    chain.append(ids["policy2"])
    assert len(set(chain)) == len(chain)
