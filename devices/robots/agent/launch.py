"""Start a robot agent as its own process (`python -m devices.robots.agent.serve --driver …`, the
module entry point, not the repository's main.py) and wait until it accepts connections.
The demo, tests and benchmarks start the virtual lab this way; like a real robot, it is then
reached only through the protocol.

    with start_lab_process("panda_table") as lab:
        with RobotClient(lab.host, lab.port, lab.token) as robot: ...
    with start_agent_process("feetech", ["--emulate"]) as arm: ...
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from devices.errors import DeviceError
from devices.robots.agent.math_threads import single_threaded_math
from devices.robots.wire.auth import new_token, write_token_file

REPO_ROOT = Path(__file__).resolve().parents[3]
READY = re.compile(r"listening on ([0-9.]+):(\d+)")
FINGERPRINT = re.compile(r"fingerprint (sha256:[0-9a-f]{64})")


class LabProcess:
    """A running agent subprocess (the lab or any driver): `host`, `port`, `token`,
    `terminate()`."""

    def __init__(
        self, proc: subprocess.Popen[str], token: str, token_dir: tempfile.TemporaryDirectory[str]
    ) -> None:
        self.proc, self.token, self._token_dir = proc, token, token_dir
        self.host, self.port = "127.0.0.1", 0
        self.fingerprint: str | None = None  # TLS certificate fingerprint, when serving TLS
        self.output: deque[str] = deque(maxlen=200)
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="lab-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())
            f = FINGERPRINT.search(line)
            if f:
                self.fingerprint = f.group(1)
            m = READY.search(line)
            if m and not self._ready.is_set():
                self.host, self.port = m.group(1), int(m.group(2))
                self._ready.set()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                raise DeviceError(
                    "lab process exited with code "
                    f"{self.proc.returncode} before serving:\n" + self.tail()
                )
            if time.monotonic() > deadline:
                self.terminate()
                raise DeviceError(
                    f"lab process did not start serving within {timeout_s:.0f} s:\n" + self.tail()
                )

    def tail(self, lines: int = 20) -> str:
        return "\n".join(list(self.output)[-lines:])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (the lab holds the robot and exits), SIGKILL if it does not."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        self._reader.join(timeout=2.0)
        self._token_dir.cleanup()
        return self.proc.returncode

    def __enter__(self) -> LabProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


def start_lab_process(
    scene: str = "panda_table",
    config: Path | None = None,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    token: str | None = None,
    camera_size: str | None = None,
    camera_fps: int | None = None,
    extra_args: list[str] | None = None,
    timeout_s: float = 60.0,
    tls: bool = False,
) -> LabProcess:
    """Start the virtual lab (`python -m devices.robots.agent.serve --driver lab`, the same agent as
    `python main.py lab serve`) and return once it listens (port 0: any free port).

    tls: serve TLS with a certificate made in the process's temp folder; its fingerprint
    is then `LabProcess.fingerprint` (pass it to RobotClient(tls_fingerprint=…)).
    Raises DeviceError with the process output if it fails to start.
    """
    args = ["--scene", scene]
    if config is not None:
        args += ["--config", str(config)]
    if camera_size:
        args += ["--camera-size", camera_size]
    if camera_fps:
        args += ["--camera-fps", str(camera_fps)]
    return start_agent_process(
        "lab",
        args + (extra_args or []),
        port=port,
        host=host,
        token=token,
        timeout_s=timeout_s,
        tls=tls,
    )


def start_agent_process(
    driver: str,
    driver_args: list[str] | None = None,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    token: str | None = None,
    timeout_s: float = 60.0,
    tls: bool = False,
) -> LabProcess:
    """Start `python -m devices.robots.agent.serve --driver DRIVER …` and return once it listens.

    driver_args: the driver's options (e.g. ["--emulate"], ["--robot-ip", "127.0.0.2"]).
    Raises DeviceError with the process output if it fails to start.
    """
    token = token or new_token()
    tdir = tempfile.TemporaryDirectory(prefix=f"twinbench-{driver}-")
    token_file = Path(tdir.name) / "token"
    write_token_file(token_file, token)
    cmd = [
        sys.executable,
        "-m",
        "devices.robots.agent.serve",
        "--driver",
        driver,
        "--port",
        str(port),
        "--host",
        host,
        "--token-file",
        str(token_file),
        "--exit-with-parent",
    ]
    if tls:
        cmd += ["--tls", "--tls-dir", str(Path(tdir.name) / "tls")]
    cmd += driver_args or []
    env = dict(os.environ)
    env.setdefault("MUJOCO_GL", "egl")
    env.setdefault("PYOPENGL_PLATFORM", "egl")
    env["PYTHONUNBUFFERED"] = "1"
    single_threaded_math(env)  # no BLAS workers for its SCHED_FIFO loop to wait on
    # stdin stays open for the lab's lifetime: if this process dies, the lab sees EOF and stops
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lab = LabProcess(proc, token, tdir)
    try:
        lab.wait_ready(timeout_s)
    finally:
        # The lab has read its token (and made its TLS certificate) by the time it listens:
        # remove the folder now, so a crash of this process leaves no secrets in /tmp.
        tdir.cleanup()
    return lab
