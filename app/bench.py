"""`python main.py bench NAME [--json]`: benchmarks, not tests.

Each benchmark module (app/benches/NAME.py) has `DESCRIPTION` and
`run(quick: bool) -> dict[str, float | int | str]`. The runner prints a short human summary
and, with --json, one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import time
from typing import Any

HELP = "Run a benchmark (speed and accuracy against ground truth)."

BENCHMARKS: dict[str, str] = {
    "project": "app.benches.project",
    "lab": "app.benches.lab",
    "scan": "app.benches.scan",
    "twin": "app.benches.twin",
    "gui": "app.benches.gui",
    "safety": "app.benches.safety",
    "scan-real": "app.benches.scan_real",
    "calib-real": "app.benches.calib_real",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--quick", action="store_true", help="smaller sizes (for smoke tests)")


def run_benchmark(name: str, quick: bool = False) -> dict[str, Any]:
    """Run one benchmark and return its result dict (plus machine info and wall time)."""
    mod = importlib.import_module(BENCHMARKS[name])
    t0 = time.perf_counter()
    result: dict[str, Any] = dict(mod.run(quick=quick))
    result.setdefault("bench", name)
    result["wall_s"] = round(time.perf_counter() - t0, 3)
    result["machine"] = (
        f"{platform.machine()} {platform.python_implementation()} {platform.python_version()}"
    )
    return result


def run(args: argparse.Namespace) -> int:
    result = run_benchmark(args.name, quick=args.quick)
    mod = importlib.import_module(BENCHMARKS[args.name])
    print(f"bench {args.name}: {getattr(mod, 'DESCRIPTION', '')}")
    for k, v in result.items():
        print(f"  {k:<28} {v}")
    if args.json:
        print(json.dumps(result, allow_nan=False, default=float))
    return 0
