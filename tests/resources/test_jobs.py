"""Job protocol (resources/jobs.py): progress, result, cancel at the next yield, nested jobs,
errors."""

from __future__ import annotations

import pytest

from resources.jobs import Cancelled, Job, Progress, run_to_end, sub_job


def counting_job(n: int, log: list[str]) -> Job[int]:
    total = 0
    try:
        for i in range(n):
            total += i
            yield Progress((i + 1) / n, f"step {i + 1}/{n}", partial=total)
        return total
    finally:
        log.append("cleanup")


def test_progress_and_result() -> None:
    seen: list[Progress] = []
    log: list[str] = []
    assert run_to_end(counting_job(5, log), seen.append) == sum(range(5))
    assert [p.fraction for p in seen] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert seen[-1].partial == 10
    assert log == ["cleanup"]


def test_cancel_takes_effect_at_next_yield() -> None:
    seen: list[Progress] = []
    log: list[str] = []
    with pytest.raises(Cancelled):
        run_to_end(counting_job(100, log), seen.append, should_stop=lambda: len(seen) >= 3)
    assert len(seen) == 3  # no step ran after the cancel request
    assert log == ["cleanup"]


def test_errors_propagate_unchanged() -> None:
    def broken() -> Job[None]:
        yield Progress(0.0, "start")
        raise ValueError("depth scale 1.0 m/unit is implausible")

    with pytest.raises(ValueError, match="implausible"):
        run_to_end(broken())


def test_sub_job_maps_fractions() -> None:
    log: list[str] = []

    def outer() -> Job[int]:
        yield Progress(0.0, "begin")
        r = yield from sub_job(counting_job(4, log), 0.5, 1.0, prefix="fit: ")
        return r * 2

    seen: list[Progress] = []
    assert run_to_end(outer(), seen.append) == 12
    assert [p.fraction for p in seen] == pytest.approx([0.0, 0.625, 0.75, 0.875, 1.0])
    assert seen[1].message == "fit: step 1/4"
