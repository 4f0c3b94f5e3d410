"""Runs policy inference on its own thread so the control loop can give up on a late output
(the watchdog's policy deadline) instead of blocking behind it."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from devices.robots.driver import RobotState
from devices.robots.timing import set_realtime

PolicyFn = Callable[[RobotState], NDArray[np.float64]]


class PolicyWorker:
    """`submit(state)` then `result(timeout)`: the output, or None while it is not ready
    (call `result` again on a later tick; `busy` stays true until it is collected)."""

    def __init__(
        self, fn: PolicyFn, name: str = "policy", realtime_priority: int | None = None
    ) -> None:
        self.fn = fn
        self.realtime_priority = realtime_priority  # inference is part of the control loop
        self._go = threading.Event()
        self._done = threading.Event()
        self._state: RobotState | None = None
        self._out: NDArray[np.float64] | None = None
        self._exc: BaseException | None = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"twinbench-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self.realtime_priority:
            set_realtime(self.realtime_priority)
        while True:
            self._go.wait()
            self._go.clear()
            if self._closed:
                return
            try:
                self._out, self._exc = self.fn(self._state), None  # type: ignore[arg-type]
            except BaseException as exc:  # handed to the control loop, which stops the robot
                self._out, self._exc = None, exc
            self._busy = False
            self._done.set()

    @property
    def busy(self) -> bool:
        return self._busy

    def submit(self, state: RobotState) -> bool:
        """Start inference on `state`; False if the previous one has not finished."""
        if self._busy:
            return False
        self._busy = True
        self._state = state
        self._done.clear()
        self._go.set()
        return True

    def result(self, timeout: float) -> NDArray[np.float64] | None:
        """The output, None if not ready within `timeout` s; re-raises the policy's error."""
        if not self._done.wait(timeout):
            return None
        if self._exc is not None:
            raise self._exc
        return self._out

    def close(self) -> None:
        self._closed = True
        self._go.set()
        self._thread.join(timeout=1.0)
