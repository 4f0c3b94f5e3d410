"""franky-sim as a peer process: a simulated FR3 that speaks libfranka's network protocol on
a loopback address (franky-sim picks a free 127.x.y.z; its port is libfranka's 1337).

    with start_franky_sim() as sim:
        FrankaDriver(sim.host) ...

It runs `franky-sim -s mujoco` as its own process (MuJoCo never enters ours), which also
ends when our process does (its stdin closes); `terminate()` sends SIGINT, then SIGKILL.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from devices.errors import DeviceError

READY = re.compile(r"using '([0-9.]+)' as the robot IP")
# franky-sim's own entry point, plus: exit when stdin closes (the launching process ended),
# and a joint reflex on SIGUSR1 (franky_reflex.py)
SHIM = (
    "import os, sys, threading\n"
    "def watch():\n"
    "    while sys.stdin.buffer.read(4096):\n"
    "        pass\n"
    "    os._exit(0)\n"
    "threading.Thread(target=watch, daemon=True).start()\n"
    "from devices.robots.agent.emulators.franky_reflex import install\n"
    "install()\n"
    "from franky_sim.run_server import main\n"
    "main()\n"
)


class FrankySim:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.host = ""
        self.output: deque[str] = deque(maxlen=100)
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="franky-sim-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())
            m = READY.search(line)
            if m and not self._ready.is_set():
                self.host = m.group(1)
                self._ready.set()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.terminate()
                raise DeviceError(
                    f"franky-sim did not start within {timeout_s:.0f} s:\n"
                    + "\n".join(list(self.output)[-15:])
                )
        time.sleep(0.3)  # the server loop starts right after it prints the address

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def reflex(self) -> None:
        """Make the arm abort its running motion with a joint reflex (franky_reflex.py)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)

    def kill(self) -> None:
        """Pull the plug (a fault test: the robot drops off the network)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5.0)

    def terminate(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        self._reader.join(timeout=2.0)

    def __enter__(self) -> FrankySim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


def start_franky_sim(timeout_s: float = 60.0) -> FrankySim:
    """Start franky-sim (MuJoCo backend) and return once it serves."""
    env = dict(os.environ)
    env.setdefault("MUJOCO_GL", "egl")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[4]), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    proc = subprocess.Popen(
        [sys.executable, "-c", SHIM, "-s", "mujoco"],
        stdin=subprocess.PIPE,  # held open for the peer's lifetime: EOF (we died) ends it
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    sim = FrankySim(proc)
    sim.wait_ready(timeout_s)
    return sim
