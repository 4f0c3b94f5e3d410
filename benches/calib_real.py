"""Hand-eye calibration benchmark on a real eye-to-hand capture.

The shared capture `handeye_abb_charuco` (a fixed industrial camera, a ChArUco board on an
ABB wrist, 16 views, one washed out by glare) goes through the same code path as
`python main.py calibrate --eye-to-hand`. There is no ground truth: the result is judged
by its reprojection and by its own leave-one-out spread of base -> camera. Targets:
reproj_px_median <= 2, loo_spread_mm <= 3, loo_spread_deg <= 0.3, the glare image rejected
with a reason.

The data is looked up in `$TWINBENCH_SHARED_DATA/real/handeye_abb_charuco`, else in
`shared/data/real/handeye_abb_charuco` in the repository's parent folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconstruction.calib_capture import calibrate_folder
from reconstruction.calibration import BoardSpec
from resources import shared_data
from resources.errors import TwinbenchError

DESCRIPTION = (
    "real eye-to-hand capture (ABB + ChArUco, 16 views): views used, reprojection, "
    "leave-one-out spread of base->camera, rejected views"
)
CAPTURE = ("real", "handeye_abb_charuco")
BOARD = "charuco:5x7:0.036195:0.018256:DICT_6X6_250"


def capture_folder() -> Path:
    """The shared capture's folder; raises BenchDataError (a TwinbenchError) if absent."""

    folder = shared_data(*CAPTURE)
    if not (folder / "images").is_dir() or not (folder / "poses").is_dir():
        raise TwinbenchError(
            f"{folder}: the shared capture handeye_abb_charuco (images/, poses/) is not there; "
            "set TWINBENCH_SHARED_DATA to the folder that holds real/handeye_abb_charuco"
        )
    return folder


def run(quick: bool = False) -> dict[str, Any]:
    folder = capture_folder()
    result, _capture = calibrate_folder(
        folder / "images", folder / "poses", BoardSpec.parse(BOARD), "eye_to_hand"
    )
    s = result.summary()
    u = result.uncertainty
    return {
        "views_total": len(result.views) + len(result.rejected),
        "views_used": len(result.views),
        "reproj_px_median": round(float(s["median_reproj_px"]), 3),
        "reproj_px_max": round(float(s["max_reproj_px"]), 3),
        "loo_spread_mm": round(float(u["spread_mm"]), 3),
        "loo_spread_deg": round(float(u["spread_deg"]), 4),
        "loo_max_shift_mm": round(float(u["max_shift_mm"]), 3),
        "loo_max_shift_deg": round(float(u["max_shift_deg"]), 4),
        "linear_vs_refined_mm": round(float(u["linear_vs_refined_mm"]), 3),
        "linear_vs_refined_deg": round(float(u["linear_vs_refined_deg"]), 4),
        "rejected": [f"{r.index}: {r.reason} ({r.detail})" for r in result.rejected],
        "warnings": len(result.warnings),
    }
