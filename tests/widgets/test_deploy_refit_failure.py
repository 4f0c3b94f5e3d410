"""The Deploy page is honest about a refit that did not fit (issue 24, item 2): a refit of
a deploy run whose recording ends in NaN commands (as runs were saved before) fails with the
reason shown in red under "3. Send to Real2Sim", nothing is saved, and "4. Retrain from the
refit" is (and stays) disabled, also after an earlier refit had enabled it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.workflows.deploy import DeployResult
from tests.app.refit_rig import done_fits, fake_run, record_only_project
from widgets.deploy_page import DeployPage

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_a_failed_refit_is_shown_and_retrain_stays_disabled(
    controller: Any, qtbot: Any, tmp_path: Path
) -> None:
    proj = controller.new_project(tmp_path / "p")
    _, pid, joints, home = record_only_project(proj)
    bad = fake_run(proj, pid, joints, home, nan_tail=15)
    controller.notify_project_changed()
    page = DeployPage(controller)
    qtbot.addWidget(page)
    page.resize(1200, 700)
    page.show()
    page.refresh()
    assert not page.showing_empty_state()

    # an earlier refit that fitted had offered 4. Retrain
    page.refit_id = proj.artifacts("fit")[-1].id
    page.retrain_button.setEnabled(True)
    fits = done_fits(proj)

    # a run that ends in 15 samples without a command: the refit fails, naming why
    page.result = DeployResult(*bad, {})
    page.refit_button.setEnabled(True)  # as a new run's end does
    assert page.retrain_button.isEnabled()  # still offered from the earlier refit
    with qtbot.waitSignal(page.sig_refit_failed, timeout=60000) as sig:
        page.refit_button.click()
        assert not page.retrain_button.isEnabled()  # off from the moment the refit starts
    msg = sig.args[0]
    assert "15 samples with NaN/inf in 'robot/command'" in msg and bad[0] in msg
    note = page.refit_note.text()
    assert "Refit failed" in note and "15 samples with NaN/inf" in note
    assert "Nothing was saved" in note and "Retrain stays off" in note
    assert "refit failed" in page.status.text() and "saved" not in page.status.text()
    assert "#c62828" in page.status.styleSheet()  # in red
    assert not page.retrain_button.isEnabled() and page.refit_id is None
    qtbot.wait(100)  # let the layout give the note its lines
    shot = tmp_path / "deploy-refit-failed.png"
    assert page.grab().save(str(shot)) and shot.stat().st_size > 0  # for a person to look at
    qtbot.waitUntil(lambda: not page.runner.running(), timeout=5000)
    assert not page.retrain_button.isEnabled()
    proj.refresh()
    assert done_fits(proj) == fits  # no fit artifact was written for it
    page.detach()
