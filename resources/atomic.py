"""Atomic file writes: temp file in the same folder, fsync, rename.

Killing the program at any moment leaves either the old file or the new one, never a
half-written one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_with(path: Path, writer: Callable[[Path], None]) -> None:
    """Call `writer(tmp_path)` to write a temp file beside `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        writer(tmp_path)
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    """Atomically replace `path` with `data`."""

    def write(p: Path) -> None:
        p.write_bytes(data)

    write_with(Path(path), write)


def write_text(path: Path, text: str) -> None:
    """Atomically replace `path` with UTF-8 `text`."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    """Atomically write `obj` as indented JSON (NaN is refused: it is not JSON)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def jsonable(obj: Any) -> Any:
    """JSON-safe copy: mappings/sequences recursed, numpy arrays and scalars to Python,
    NaN/inf to None (JSON has no NaN)."""
    import math

    import numpy as np

    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
