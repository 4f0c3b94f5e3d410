"""`python main.py calibrate --images DIR --poses DIR --board SPEC --eye-in-hand|--eye-to-hand
[--intrinsics FILE] [--json] [--out FILE]`: hand-eye calibration from a folder capture."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from resources import atomic

HELP = (
    "Camera-robot (hand-eye) calibration from a folder of ChArUco board images and a folder "
    "of robot wrist poses paired by file name (N.jpg <-> N.yaml: x y z qx qy qz qw, base -> "
    "wrist). Eye-to-hand (camera fixed, board on the wrist) gives T_base_camera; eye-in-hand "
    "(camera on the wrist, board fixed) gives T_hand_camera. Reports per-view reprojection, "
    "rejected views with reasons, the leave-one-out spread and which poses to add."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--images", type=Path, required=True, help="folder of board images")
    p.add_argument(
        "--poses", type=Path, required=True, help="folder of wrist pose files (.yaml/.json/.txt)"
    )
    p.add_argument(
        "--board",
        required=True,
        help="charuco:COLSxROWS:SQUARE_M:MARKER_M:DICT, e.g. "
        "charuco:5x7:0.036195:0.018256:DICT_6X6_250; 'lab' for the virtual lab's board",
    )
    # no default: a calibration solved in the wrong set-up looks plausible and is wrong
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--eye-to-hand",
        dest="mode",
        action="store_const",
        const="eye_to_hand",
        help="camera fixed, board on the wrist",
    )
    mode.add_argument(
        "--eye-in-hand",
        dest="mode",
        action="store_const",
        const="eye_in_hand",
        help="camera on the wrist, board fixed",
    )
    p.add_argument(
        "--intrinsics",
        type=Path,
        default=None,
        help="YAML/JSON with fx fy cx cy [coeffs] (default: camera_intr_calibrated.yaml, "
        "intrinsics.yaml|json or camera_intr.yaml next to the images or in their parent)",
    )
    p.add_argument("--min-corners", type=int, default=8, help="fewest board corners per view")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON result here")


def run(args: argparse.Namespace) -> int:
    # cv2 + scipy (0.5-0.9 s): `calibrate --help` and usage errors answer without them (app/cli.py)
    from reconstruction.calib_capture import calibrate_folder
    from reconstruction.calibration import BoardSpec

    board = BoardSpec.parse(args.board)
    result, capture = calibrate_folder(
        args.images,
        args.poses,
        board,
        args.mode,
        args.intrinsics,
        min_corners=args.min_corners,
    )
    report = _report(result.summary(), result.T, capture, board.to_spec())
    _print_human(report)
    if args.out is not None:
        atomic.write_json(args.out, report)
    if args.json:
        print(json.dumps(report, allow_nan=False))
    return 0


def _report(summary: dict[str, Any], T: Any, capture: Any, board: str) -> dict[str, Any]:
    # scipy (0.33 s): `calibrate --help` and usage errors answer without them (app/cli.py)
    from devices.poses import matrix_to_pose

    name = "T_base_camera" if summary["mode"] == "eye_to_hand" else "T_hand_camera"
    return {
        "mode": summary["mode"],
        "board": board,
        "intrinsics_file": str(capture.intrinsics_file),
        "intrinsics": capture.intrinsics.to_dict(),
        name: T.tolist(),
        f"{name}_pose": [round(float(v), 6) for v in matrix_to_pose(T)],
        "views_used": len(summary["views"]),
        "files": {str(k): v for k, v in capture.files.items()},
        **summary,
    }


def _print_human(r: dict[str, Any]) -> None:
    name = "T_base_camera" if r["mode"] == "eye_to_hand" else "T_hand_camera"
    x, y, z, qx, qy, qz, qw = r[f"{name}_pose"]
    u = r["uncertainty"]
    print(f"{r['mode'].replace('_', '-')} calibration, board {r['board']}")
    print(f"  intrinsics: {r['intrinsics_file']}")
    print(f"  {name}: xyz {x:.4f} {y:.4f} {z:.4f} m, quat xyzw {qx:.5f} {qy:.5f} {qz:.5f} {qw:.5f}")
    if "spread_mm" in u:
        print(
            f"  uncertainty (leave-one-out, 1 sigma): {u['spread_mm']:.2f} mm, "
            f"{u['spread_deg']:.3f} deg over {u['views']} views"
        )
    print(
        f"  views used: {r['views_used']}, reprojection median {r['median_reproj_px']:.2f} px, "
        f"max {r['max_reproj_px']:.2f} px"
    )
    for view, px in zip(r["views"], r["reproj_px"], strict=True):
        print(f"    view {view} ({r['files'].get(str(view), '?')}): {px:.2f} px")
    for rej in r["rejected"]:
        print(f"  rejected view {rej['index']} ({rej['reason']}): {rej['detail']}")
    for w in r["warnings"]:
        print(f"  warning: {w}")
    for s in r["suggestions"]:
        print(f"  suggestion: {s}")
