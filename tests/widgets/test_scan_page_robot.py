"""Scan page: the connected-robot source appears only while a robot client is connected; the
page asks the app layer (AppController) for the scan, never for the client."""

from __future__ import annotations

from typing import Any

import pytest

from app.controller import AppController

pytestmark = [pytest.mark.gui, pytest.mark.slow]


class _Link:
    """The RobotLink the GUI holds (like app.robot_link.AgentLink): info, state, close, client."""

    def protocol_client(self) -> Any:
        return self.client if self.client.connected else None

    def __init__(self, client: Any) -> None:
        self.client = client

    def info(self) -> Any:
        return self.client.info

    def latest_state(self) -> Any:
        return self.client.latest_state()

    def close(self) -> None:
        self.client.close()


def test_robot_source_follows_the_connection(qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from devices.robots.agent.launch import start_lab_process
    from devices.robots.client import RobotClient
    from widgets.scan_page import ScanPage

    c = AppController()
    c.new_project(tmp_path / "proj")
    page = ScanPage(c)
    qtbot.addWidget(page)
    keys = lambda: [page.source.itemData(i) for i in range(page.source.count())]  # noqa: E731
    assert "robot" not in keys()
    assert not page.start_scan("robot")  # no robot: refused with a message
    assert "no robot connected" in page.status.text()
    with start_lab_process("panda_table", extra_args=["--no-cameras"]) as lab:
        client = RobotClient(lab.host, lab.port, lab.token)
        client.connect()
        c.attach_robot(_Link(client))
        qtbot.waitUntil(lambda: "robot" in keys(), timeout=3000)
        assert c.can_scan_robot
        assert page.source.itemText(keys().index("robot")) == "Connected robot (guided wrist scan)"
        c.detach_robot()
        qtbot.waitUntil(lambda: "robot" not in keys(), timeout=3000)
        assert not c.can_scan_robot
    page.detach()
    c.shutdown()
