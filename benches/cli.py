"""`python main.py bench NAME [--json]`: benchmarks, not tests.

Each benchmark module (benches/NAME.py) has `DESCRIPTION` and
`run(quick: bool) -> dict[str, float | int | str]`. The runner prints a short human summary
and, with --json, one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
import time
from pathlib import Path
from typing import Any

from resources.errors import TwinbenchError

HELP = "Run a benchmark (speed and accuracy against ground truth)."

BENCHMARKS: dict[str, str] = {
    "project": "benches.project",
    "lab": "benches.lab",
    "scan": "benches.scan",
    "twin": "benches.twin",
    "gui": "benches.gui",
    "loop": "benches.loop",
    "safety": "benches.safety",
    "scan-real": "benches.scan_real",
    "calib-real": "benches.calib_real",
    "fit-real": "benches.fit_real",
    "drivers": "benches.drivers",
    "calibrate": "benches.calibrate",
    "fit": "benches.fit",
    "design": "benches.design",
    "track": "benches.track",
    "policies": "benches.policies",
    "push_deploy": "benches.push_deploy",
    "sim2real": "benches.sim2real",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--quick", action="store_true", help="smaller sizes (for smoke tests)")
    p.add_argument(
        "--minutes", type=float, default=None, help="how long a soak runs (gui; default 10)"
    )
    p.add_argument("--lab-config", type=Path, default=None, help="lab truth to run against (fit)")
    p.add_argument(
        "--load",
        type=int,
        default=None,
        help="run N CPU-bound processes beside the benchmark (safety, loop: their targets hold at 4)",
    )
    p.add_argument(
        "--posterior",
        choices=("laplace", "smc"),
        default=None,
        help="fit: how the posterior is found",
    )


def run_benchmark(name: str, quick: bool = False, **options: Any) -> dict[str, Any]:
    """Run one benchmark and return its result dict (plus machine info and wall time).
    `options` (e.g. minutes=) go to benchmarks that take them."""
    mod = importlib.import_module(BENCHMARKS[name])
    t0 = time.perf_counter()
    given = {k: v for k, v in options.items() if v is not None}
    accepted = inspect.signature(mod.run).parameters
    for k in given:
        if k not in accepted:
            raise TwinbenchError(f"bench {name} has no --{k} option")
    result: dict[str, Any] = dict(mod.run(quick=quick, **given))
    result.setdefault("bench", name)
    result["wall_s"] = round(time.perf_counter() - t0, 3)
    result["machine"] = (
        f"{platform.machine()} {platform.python_implementation()} {platform.python_version()}"
    )
    return result


def run(args: argparse.Namespace) -> int:
    result = run_benchmark(
        args.name,
        quick=args.quick,
        minutes=args.minutes,
        lab_config=args.lab_config,
        posterior=args.posterior,
        load=args.load,
    )
    mod = importlib.import_module(BENCHMARKS[args.name])
    print(f"bench {args.name}: {getattr(mod, 'DESCRIPTION', '')}")
    for k, v in result.items():
        print(f"  {k:<28} {v}")
    if args.json:
        print(json.dumps(result, allow_nan=False, default=float))
    return 0
