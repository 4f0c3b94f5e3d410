"""bench fit-real's cube tosses: the held-out tosses are fixed and never fitted."""

from __future__ import annotations

import pytest

from benches import fit_real

needs_data = pytest.mark.skipif(
    not (fit_real.data_root() / "cube_tosses" / "toss_000.csv").is_file(),
    reason="shared real data not present",
)


@needs_data
@pytest.mark.parametrize("quick", [False, True])
def test_the_cube_split_is_fixed_and_disjoint(quick: bool) -> None:
    train, held = fit_real.cube_split(quick)
    assert len(train) == fit_real.CUBE_TRAIN[quick] and len(held) == fit_real.CUBE_HELD[quick]
    assert not set(train) & set(held)
    assert fit_real.cube_split(quick) == (train, held)  # seeded: the same every run
    # the quick run holds out the first tosses of the full run's held-out set
    full_held = fit_real.cube_split(False)[1]
    assert held == full_held[: len(held)]
    assert not set(fit_real.cube_split(False)[0]) & set(held)


def test_the_cube_fit_searches_globally_before_cma() -> None:
    cfg = fit_real.cube_fit_config(False)
    assert cfg.global_samples >= 16 and cfg.window_s is None and cfg.validation == 0
    assert set(cfg.params) == {
        "contacts.cube.ground.friction",
        "contacts.cube.ground.restitution",
    }
