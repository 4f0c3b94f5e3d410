"""Create, save and reopen a project with 1,000 artifacts."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from app.project import Project

DESCRIPTION = "create, save and reopen a project with 1,000 artifacts"


def run(quick: bool = False) -> dict[str, Any]:
    n = 100 if quick else 1000
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bench"
        proj = Project.create(root)
        t0 = time.perf_counter()
        prev: str | None = None
        for i in range(n):
            kind = ("scan", "twin", "trajectory", "fit")[i % 4]
            with proj.new_artifact(
                kind, inputs=[prev] if prev else [], settings={"i": i}, summary=f"bench {i}"
            ) as folder:
                (folder / "data.txt").write_text(str(i))
            prev = proj.artifacts()[-1].id
        create_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        proj.save()
        save_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        reopened = Project.open(root)
        open_ms = (time.perf_counter() - t0) * 1000
        ok = len(reopened.artifacts()) == n
    return {
        "artifacts": n,
        "save_ms": round(save_ms, 2),
        "open_ms": round(open_ms, 2),
        "create_all_ms": round(create_ms, 1),
        "create_ms_per_artifact": round(create_ms / n, 3),
        "roundtrip_ok": ok,
    }
