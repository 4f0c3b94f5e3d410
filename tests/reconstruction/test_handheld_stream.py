"""The two-core scan pipeline (reconstruction/stream.py): frames read ahead on a worker come
back in order with their prepared views, a source's error surfaces at its frame, leaving
early stops the reader, and a deferred fusion runs in order, after the raycast. Tracking accuracy through the
pipeline is checked against the lab's truth in test_handheld_lab.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from devices.frames import Intrinsics, RGBDFrame
from reconstruction.stream import DeferredFusion, read_ahead


def _frame(i: int, z_m: float = 0.8) -> RGBDFrame:
    K = Intrinsics(160, 120, 150.0, 150.0, 80.0, 60.0)
    depth = np.full((120, 160), int(z_m * 1000), np.uint16)
    depth[40:80, 50:110] -= 80  # a box on a wall: shape for ICP
    color = np.full((120, 160, 3), 128, np.uint8)
    return RGBDFrame(color, depth, 0.001, K, timestamp=i / 30, index=i)


def test_read_ahead_keeps_order_and_prepares_on_another_thread() -> None:
    seen: list[tuple[int, str]] = []

    def prep(f: RGBDFrame) -> None:
        seen.append((f.index, threading.current_thread().name))

    got = [f.index for f in read_ahead((_frame(i) for i in range(7)), prep)]
    assert got == list(range(7))
    assert [i for i, _ in seen] == list(range(7))
    assert all(name == "scan-read-ahead" for _, name in seen)


def test_read_ahead_raises_the_source_error_at_its_frame() -> None:
    def source() -> Iterator[RGBDFrame]:
        yield _frame(0)
        yield _frame(1)
        raise OSError("recording.db3: truncated at frame 2")

    got = []
    with pytest.raises(OSError, match="truncated at frame 2"):
        for f in read_ahead(source()):
            got.append(f.index)
    assert got == [0, 1]


def test_leaving_early_stops_the_reader() -> None:
    read = []

    def endless() -> Iterator[RGBDFrame]:
        i = 0
        while True:
            read.append(i)
            yield _frame(i)
            i += 1

    for f in read_ahead(endless(), depth=2):
        if f.index == 3:
            break
    time.sleep(0.3)
    n = len(read)
    time.sleep(0.3)
    assert len(read) == n <= 3 + 2 + 2  # the frames taken, the queue, one in hand


def test_deferred_fusion_runs_in_order_and_only_when_started() -> None:
    order: list[str] = []
    fus = DeferredFusion()
    fus.defer(lambda: order.append("fuse 0"))
    assert order == [] and fus.pending
    order.append("raycast 1")
    fus.start()
    fus.defer(lambda: order.append("fuse 1"))  # waits for fuse 0
    assert order == ["raycast 1", "fuse 0"]
    fus.close()
    assert order == ["raycast 1", "fuse 0", "fuse 1"] and not fus.pending


def test_deferred_fusion_reraises_an_error() -> None:
    fus = DeferredFusion()

    def bad() -> None:
        raise ValueError("frame 5: camera pose has NaN")

    fus.defer(bad)
    with pytest.raises(ValueError, match="frame 5"):
        fus.wait()
