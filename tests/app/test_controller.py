"""AppController (Qt-free): projects, recent list, log, devices, jobs; workflow needs; demo
project."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from app import demo, workflows
from app.controller import MAX_RECENT, AppController, DeviceStatus
from devices.errors import DeviceError
from devices.robots.wire.robot_types import JointLimits, RobotInfo, RobotState
from resources.jobs import Job, Progress
from resources.project import MANIFEST, Project, ProjectError


@pytest.fixture
def ctl(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = AppController(config=tmp_path / "cfg")
    yield c
    c.shutdown()


def test_new_open_and_recent_order(ctl: AppController, tmp_path: Path) -> None:
    seen: list[Project | None] = []
    ctl.project_changed.connect(seen.append)
    a = ctl.new_project(tmp_path / "a")
    b_root = tmp_path / "b"
    Project.create(b_root)
    ctl.open_project(b_root)
    assert [p.root for p in seen if p] == [a.root, b_root.resolve()]
    assert ctl.recent_projects() == [b_root.resolve(), a.root]
    ctl.open_project(a.root)
    assert ctl.recent_projects() == [a.root, b_root.resolve()]
    data = json.loads((tmp_path / "cfg" / "recent.json").read_text())
    assert data == {"version": 1, "recent": [str(a.root), str(b_root.resolve())]}
    # a fresh session (next app start) reopens the last project
    again = AppController(config=tmp_path / "cfg")
    assert again.open_last().root == a.root


def test_recent_is_capped_and_tolerates_corruption(
    ctl: AppController, tmp_path: Path, caplog
) -> None:
    for i in range(MAX_RECENT + 3):
        ctl.new_project(tmp_path / f"p{i}")
    rec = ctl.recent_projects()
    assert len(rec) == MAX_RECENT and rec[0].name == f"p{MAX_RECENT + 2}"
    ctl.recent_file.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert ctl.recent_projects() == []
    assert str(ctl.recent_file) in caplog.text


def test_open_last_skips_broken_projects(ctl: AppController, tmp_path: Path) -> None:
    good = ctl.new_project(tmp_path / "good").root
    broken = ctl.new_project(tmp_path / "broken").root
    (broken / MANIFEST).write_text("garbage")
    fresh = AppController(config=tmp_path / "cfg")
    assert fresh.open_last().root == good


def test_failed_open_keeps_current_project_and_recent(ctl: AppController, tmp_path: Path) -> None:
    cur = ctl.new_project(tmp_path / "cur")
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(ProjectError, match=str(bad)):
        ctl.open_project(bad)
    assert ctl.project is cur
    assert ctl.recent_projects() == [cur.root]
    assert list(bad.iterdir()) == []
    with pytest.raises(ProjectError, match="no project is open"):
        AppController(config=tmp_path / "x").save_project()


def test_log_handler_collects_records_from_threads(ctl: AppController) -> None:
    lg = logging.getLogger("tests.session")
    got = []
    ctl.log_added.connect(got.append)
    ctl.install_log_handler(lg)
    lg.info("hello %s", "world")

    def worker() -> None:
        try:
            raise ValueError("bad frame")
        except ValueError:
            lg.exception("camera thread failed")

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    ctl.remove_log_handler(lg)
    lg.info("not seen")
    msgs = [e.message for e in ctl.log_entries()]
    assert msgs == ["hello world", "camera thread failed"]
    assert got[1].level == logging.ERROR and "ValueError: bad frame" in got[1].traceback


class FakeLink:
    """Stands in for the robot protocol client at the session boundary."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.closed = False
        self.n = 0
        self.fail_after = fail_after

    def info(self) -> RobotInfo:
        lim = JointLimits(-np.ones(2), np.ones(2), np.ones(2), np.ones(2))
        return RobotInfo("arm2", ("j1", "j2"), lim, 250.0)

    def latest_state(self) -> RobotState | None:
        self.n += 1
        if self.fail_after is not None and self.n > self.fail_after:
            raise DeviceError("robot 'arm2': no state for 0.5 s (connection lost)")
        z = np.zeros(2)
        return RobotState(0.004 * self.n, self.n, z + 0.1, z, z, np.array([0.3, 0.0, 0.5]))

    def close(self) -> None:
        self.closed = True


def test_robot_attach_state_and_detach(ctl: AppController) -> None:
    events: list[dict[str, DeviceStatus]] = []
    ctl.devices_changed.connect(events.append)
    link = FakeLink()
    ctl.attach_robot(link, "arm2 @ 127.0.0.1:7001")
    assert ctl.devices()["robot"] == DeviceStatus("robot", "connected", "arm2 @ 127.0.0.1:7001")
    assert ctl.robot_info.joint_names == ("j1", "j2")
    st = ctl.robot_state()
    assert st is not None and st.seq == 1 and np.allclose(st.joint_pos, 0.1)
    ctl.detach_robot()
    assert link.closed and ctl.robot_state() is None
    assert [e["robot"].state for e in events] == ["connected", "disconnected"]


def test_lost_robot_link_reported_once(ctl: AppController) -> None:
    link = FakeLink(fail_after=1)
    ctl.attach_robot(link)
    assert ctl.robot_state() is not None
    assert ctl.robot_state() is None
    st = ctl.devices()["robot"]
    assert st.state == "error" and "connection lost" in st.detail and "arm2" in st.detail
    assert link.closed
    assert ctl.robot_state() is None  # no repeated errors


def test_submit_job_without_gui_runs_synchronously(ctl: AppController) -> None:
    def job(fail: bool) -> Job[int]:
        yield Progress(0.5, "half")
        if fail:
            raise DeviceError("lab not reachable")
        return 7

    done: list[int] = []
    failed: list[str] = []
    ctl.submit_job("ok", job(False), on_done=done.append, on_failed=failed.append)
    ctl.submit_job("bad", job(True), on_done=done.append, on_failed=failed.append)
    assert done == [7] and failed == ["lab not reachable"]


def test_needs_met_follow_project_and_devices(tmp_path: Path) -> None:
    proj = Project.create(tmp_path / "p")
    cal = workflows.step("calibrate")
    assert [ok for _, ok in workflows.needs_met(cal, None)] == [False, False]
    with proj.new_artifact("twin") as f:
        (f / "twin.json").write_text("{}")
    assert [ok for _, ok in workflows.needs_met(cal, proj)] == [True, False]
    dep = workflows.step("deploy")
    assert [ok for _, ok in workflows.needs_met(dep, proj, frozenset({"robot"}))] == [False, True]
    with pytest.raises(KeyError, match="no workflow step 'fly'"):
        workflows.step("fly")


def test_demo_project_created_once_and_never_overwritten(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TWINBENCH_DATA_DIR", str(tmp_path / "data"))
    p = demo.ensure_demo_project()
    assert p.root == tmp_path / "data" / "demo" and p.settings["demo"] is True
    # a new demo project comes with the procedural scan and a twin built from it
    (scan,) = p.artifacts("scan")
    (twin,) = p.artifacts("twin")
    assert twin.inputs == (scan.id,)
    assert (p.path_of(twin.id) / "twin.json").is_file()
    with p.new_artifact("scan") as f:
        (f / "scan.json").write_text("{}")
    again = demo.ensure_demo_project()
    assert len(again.artifacts("scan")) == 2 and len(again.artifacts("twin")) == 1
    (p.root / MANIFEST).write_text("{broken")
    with pytest.raises(ProjectError, match="corrupt manifest"):
        demo.ensure_demo_project()
    assert (p.root / MANIFEST).read_text() == "{broken"
