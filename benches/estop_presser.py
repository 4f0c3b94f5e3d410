"""An e-stop button in a process of its own, for `bench safety`'s big-message attacks.

`bench safety` asks how fast the robot answers an e-stop while a client floods it. Measured
from a thread of the bench itself on a loaded machine (4 busy processes on 2 cores), the
round trip is mostly the bench's own wake-ups: its reader thread and the waiting thread each
wait their turn behind the busy processes and behind the bench's other threads for the GIL
(25-50 ms, whatever the robot did). A real e-stop is a station of its own; so is this: a
small process that runs SCHED_FIFO where the OS allows it (every thread, its client's reader
included) and presses every `period` seconds.

    python -m benches.estop_presser HOST PORT  (token in $TWINBENCH_TOKEN)

stdin lines: `go` starts pressing, `end` stops and prints one JSON line
{"worst_ms", "presses", "errors"} after resetting the e-stop, `quit` leaves. stdout's first
line is {"ready": true, "realtime": bool} once it holds control of the robot.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

from devices.errors import DeviceError
from devices.robots.agent.timing import set_realtime
from devices.robots.client import RobotClient
from devices.robots.wire.auth import TOKEN_ENV

PRIORITY = 5  # SCHED_FIFO, below every thread of `lab serve` (10 and up)
ACK_TIMEOUT_S = 5.0  # an unanswered press counts as this long


def _line(timeout: float) -> str | None:
    """One stdin command, or None when none arrived within `timeout` seconds."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return None
    line = sys.stdin.readline()
    return line.strip() if line else "quit"


def _say(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _press_until_end(c: RobotClient, period: float) -> dict[str, object]:
    worst, presses, errors = 0.0, 0, []
    while True:
        t0 = time.perf_counter()
        try:
            c.request("estop", timeout_s=ACK_TIMEOUT_S, reason="bench: e-stop during a big message")
            ms = (time.perf_counter() - t0) * 1e3
        except DeviceError as exc:
            errors.append(str(exc)[:200])
            ms = ACK_TIMEOUT_S * 1e3
        worst, presses = max(worst, ms), presses + 1
        cmd = _line(max(0.0, period - (time.perf_counter() - t0)))
        if cmd is not None:
            break
    try:
        c.reset()
    except DeviceError as exc:
        errors.append(f"reset: {exc}"[:200])
    return {"worst_ms": worst, "presses": presses, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    host, port = args[0], int(args[1])
    period = float(args[2]) if len(args) > 2 else 0.02
    realtime = set_realtime(PRIORITY)  # before the client's reader thread: it inherits it
    c = RobotClient(host, port, os.environ[TOKEN_ENV], name="e-stop", subscribe_state=False)
    c.connect()
    try:
        c.take_control()  # the e-stop's operator: the client in control when it latches
        _say({"ready": True, "realtime": realtime})
        while (cmd := _line(60.0)) != "quit":
            if cmd == "go":
                _say(_press_until_end(c, period))
        try:
            c.stop()  # its own stop hands control back at once
        except DeviceError:
            pass
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
