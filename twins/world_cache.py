"""Twin worlds kept between evaluations in one process (a fit's worker scores hundreds of
candidates of the same twin): the next candidate's values are written in place
(`twins.retune`, ~1 ms; a retuned world replays exactly as a fresh build,
tests/twins/test_retune.py) instead of building the world again (~70-140 ms for the Panda:
PyBullet parses its meshes every time). Parameters that cannot change in place build a new
world, as before. A world whose replay raised is closed, never kept."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from twins.builder import TwinWorld
from twins.retune import retune
from twins.spec import TwinSpec

KEEP = 2  # worlds kept per process (a twin and its zero-latency copy)
_kept: dict[tuple[bytes, str], TwinWorld] = {}


def _key(spec: TwinSpec, role: str) -> tuple[bytes, str]:
    return hashlib.sha1(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)).digest(), role


@contextmanager
def world_at(spec: TwinSpec, values: Mapping[str, float], role: str = "") -> Iterator[TwinWorld]:
    """A world of `spec` at `values`, reset: this process's kept one retuned when it can
    be, else a new build; kept again afterwards unless the caller's block raised. `role`
    tells apart worlds of the same spec kept side by side."""
    key = _key(spec, role)
    kept = _kept.pop(key, None)
    if kept is not None:
        try:
            ok = retune(kept, values)
        except BaseException:
            kept.close()
            raise
        if not ok:
            kept.close()
            kept = None
    world = kept if kept is not None else TwinWorld(spec, values)
    try:
        yield world
    except BaseException:
        world.close()
        raise
    _kept[key] = world
    while len(_kept) > KEEP:
        _kept.pop(next(iter(_kept))).close()


def clear() -> None:
    """Close every kept world."""
    while _kept:
        _kept.popitem()[1].close()
