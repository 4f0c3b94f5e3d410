"""PyBullet, imported once for all of twins/ (its one home, docs/ARCHITECTURE.md §2), and quiet vendor
loading.

Native code linked with Bullet prints "pybullet build time: …" through C stdio (pybullet and
coacd do it when they load). The line sits in C's buffer
and lands anywhere in CLI output, even after a `--json` result. `quiet_native()` sends the
process's stdout and stderr to /dev/null around such calls and flushes C's buffers before
putting them back.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_libc = ctypes.CDLL(None)
_lock = threading.Lock()


@contextmanager
def quiet_native() -> Iterator[None]:
    """Silence native stdout/stderr chatter for the duration (process-wide, briefly)."""
    with _lock:
        sys.stdout.flush()
        sys.stderr.flush()
        _libc.fflush(None)
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in saved:
            os.dup2(devnull, fd)
        try:
            yield
            _libc.fflush(None)
        finally:
            for fd, keep in saved.items():
                os.dup2(keep, fd)
                os.close(keep)
            os.close(devnull)


with quiet_native():  # pybullet prints its banner to stderr when it loads
    pb: Any = importlib.import_module("pybullet")


def connect_direct() -> int:
    """A new PyBullet DIRECT client (its own world); returns the client id."""
    with quiet_native():
        return int(pb.connect(pb.DIRECT))


__all__ = ["connect_direct", "pb", "quiet_native"]
