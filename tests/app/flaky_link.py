"""A loopback TCP relay between a robot client and its server that can stall: `freeze(s)`
stops relaying in both directions for `s` seconds, as a paused (SIGSTOPped) robot process or
a starved laptop looks from the other end; bytes wait in the kernel buffers and flow again
afterwards. New connections are accepted meanwhile but their bytes wait too.

`Robot`: the ideal driver's agent and server (with a synthetic camera) behind such a relay;
`FakeLab`: what `app.robot_link.AgentLink` needs of a lab process it launched, without the process."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import numpy as np

from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.ideal import IdealDriver, panda_like_info
from devices.robots.agent.server import RobotServer
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.client import RobotClient
from devices.robots.wire.auth import new_token
from tests.devices.robots.helpers import synthetic_frames


class FlakyLink:
    """`FlakyLink(server_port)`; clients connect to `.port`. Use as a context manager."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self._srv = socket.create_server(("127.0.0.1", 0))
        self._srv.settimeout(0.1)
        self.port = int(self._srv.getsockname()[1])
        self._frozen_until = 0.0
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, name="flaky-link-accept")]
        self._threads[0].start()
        self.connections = 0

    def __enter__(self) -> FlakyLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def frozen(self) -> bool:
        return time.monotonic() < self._frozen_until

    def freeze(self, seconds: float) -> None:
        """Stop relaying for `seconds` from now (returns at once)."""
        self._frozen_until = time.monotonic() + seconds

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                a, _ = self._srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                b = socket.create_connection(("127.0.0.1", self.target), timeout=2.0)
            except OSError:
                a.close()
                continue
            self.connections += 1
            with self._lock:
                self._socks += [a, b]
                for src, dst in ((a, b), (b, a)):
                    t = threading.Thread(target=self._pump, args=(src, dst), name="flaky-link")
                    self._threads.append(t)
                    t.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.02)
        try:
            while not self._closed.is_set():
                if self.frozen:
                    time.sleep(0.005)
                    continue
                try:
                    data = src.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._srv.close()
        for t in list(self._threads):
            t.join(timeout=2.0)
        with self._lock:
            for s in self._socks:
                s.close()


class Robot:
    """Ideal driver + agent + server (with a synthetic camera), reached through a relay."""

    def __init__(self) -> None:
        info = panda_like_info(250.0)
        # mid-range joints with the elbow and wrist bent: the tool 20 cm inside the workspace
        # box (at mid-range alone the toy chain stands 13 mm under the box's top, and a
        # motion's check refuses what would take it out)
        start = (np.asarray(info.limits.lower) + np.asarray(info.limits.upper)) / 2
        start[3], start[5] = -2.3, 2.2
        self.agent = Agent(
            IdealDriver(info, initial=start), watchdog=WatchdogConfig(heartbeat_timeout_s=0.25)
        )
        self.agent.start()
        self.token = new_token()
        self.server = RobotServer(self.agent, self.token, cameras={"synthetic": synthetic_frames})
        self.server.start()
        self.link = FlakyLink(self.server.port)

    def client(self, **kw: Any) -> RobotClient:
        c = RobotClient("127.0.0.1", self.link.port, self.token, name="test-hiccup", **kw)
        c.connect()
        c.latest_state(timeout_s=5.0)
        return c

    def close(self) -> None:
        self.link.close()
        self.server.close()
        self.agent.close()


class FakeLab:
    """What AgentLink needs of a launched lab process, without the process."""

    def __init__(self, port: int, token: str) -> None:
        self.host, self.port, self.token = "127.0.0.1", port, token
        self.alive, self.terminated = True, 0

    def terminate(self) -> int:
        self.terminated += 1
        self.alive = False
        return 0
