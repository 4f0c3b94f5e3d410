"""Which way is up, and which plane the scene stands on, for a handheld scan.

A handheld scan's world is the first camera's frame, so "up" is not given. It comes from the
recording's accelerometer when there is one (D435i/D455: at rest it measures the reaction to
gravity, which points up), otherwise from how people hold cameras: level, image up being world
up, so up is minus the mean of the cameras' y axes (OpenCV axes, y pointing down in the image).

The support-plane rule (documented for the user, shown in scan.json):
  the largest plane (RANSAC, seeded) whose normal is within `max_tilt_deg` of up (25 deg with
  an accelerometer, 45 deg with the image-up guess, which tilts as the camera looks down) and
  that lies at least `min_below_m` below the median camera centre.
A ceiling faces down towards the cameras and lies above them, and a wall is vertical: neither
can pass. When no plane passes, nothing is guessed: the candidates are listed (with why each
was refused) and the user picks one by number, or gives the plane, with `--support-plane`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import open3d as o3d
from numpy.typing import NDArray

from reconstruction.errors import ReconstructionError
from reconstruction.segment import Plane, downsample

RULE = (
    "largest plane within {tilt:.0f} deg of up and at least {below:.2f} m below the median "
    "camera position"
)


@dataclass
class SupportChoice:
    plane: Plane | None
    inlier_fraction: float
    candidates: list[dict[str, Any]] = field(default_factory=list)
    chosen: int | None = None  # 1-based candidate number, None for a given plane / none
    rule: str = ""
    message: str = ""


def up_direction(
    poses: NDArray[np.float64] | None,
    gravity_up: NDArray[np.float64] | None = None,
    given: NDArray[np.float64] | None = None,
) -> tuple[NDArray[np.float64], str]:
    """(unit up vector in the scan's world frame, where it came from)."""
    if given is not None and np.linalg.norm(given) > 0:
        return np.asarray(given, float) / np.linalg.norm(given), "given"
    if gravity_up is not None and np.linalg.norm(gravity_up) > 0:
        return np.asarray(gravity_up, float) / np.linalg.norm(gravity_up), "accelerometer"
    if poses is not None and len(poses):
        y = -np.asarray(poses)[:, :3, 1].mean(axis=0)
        if np.linalg.norm(y) > 1e-6:
            return y / np.linalg.norm(y), "camera held upright (mean image-up direction)"
    return np.array([0.0, -1.0, 0.0]), "first camera's image-up direction"


def plane_candidates(
    points: NDArray[np.floating],
    up: NDArray[np.float64],
    seed: int = 0,
    n: int = 5,
    distance: float = 0.01,
    voxel: float = 0.01,
) -> list[tuple[Plane, float]]:
    """Up to `n` largest planes (seeded RANSAC, each removed before the next), normals
    oriented towards `up` (or, for walls, any way), with their share of the points."""
    p, _ = downsample(points, None, voxel)
    total = len(p)
    out: list[tuple[Plane, float]] = []
    remaining = p
    for _ in range(n):
        if len(remaining) < max(100, 0.02 * total):
            break
        o3d.utility.random.seed(seed)
        pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(remaining))
        model, inliers = pc.segment_plane(
            distance_threshold=distance, ransac_n=3, num_iterations=1000
        )
        nv = np.asarray(model[:3], float)
        norm = float(np.linalg.norm(nv))
        if norm == 0 or len(inliers) < 50:
            break
        nv, d = nv / norm, float(model[3]) / norm
        if nv @ up < 0:
            nv, d = -nv, -d
        out.append((Plane(nv, d), len(inliers) / total))
        remaining = np.delete(remaining, inliers, axis=0)
    return out


def choose_support_plane(
    points: NDArray[np.floating],
    up: NDArray[np.float64],
    camera_centres: NDArray[np.float64] | None,
    choice: str = "auto",
    seed: int = 0,
    max_tilt_deg: float = 25.0,
    min_below_m: float = 0.2,
) -> SupportChoice:
    """Apply the support-plane rule, or the user's `choice`: "auto", "none", a candidate
    number ("2", as listed by a previous run) or "a,b,c,d" (n.p + d = 0, world frame).
    Raises ReconstructionError for a malformed choice."""
    rule = RULE.format(tilt=max_tilt_deg, below=min_below_m)
    choice = choice.strip().lower()
    if choice == "none":
        return SupportChoice(None, 0.0, rule=rule, message="support plane: none asked for")
    if "," in choice:
        try:
            v = [float(x) for x in choice.split(",")]
            if len(v) != 4 or np.linalg.norm(v[:3]) == 0:
                raise ValueError("need 4 numbers with a non-zero normal")
        except ValueError as exc:
            raise ReconstructionError(
                f"--support-plane {choice!r}: give a,b,c,d of the plane a x + b y + c z + d = 0 "
                f"in the scan's frame ({exc})"
            ) from exc
        nv = np.asarray(v[:3]) / np.linalg.norm(v[:3])
        return SupportChoice(Plane(nv, v[3] / float(np.linalg.norm(v[:3]))), 0.0, rule="given")
    cands = plane_candidates(points, up, seed=seed)
    centre = (
        None if camera_centres is None or not len(camera_centres) else np.median(camera_centres, 0)
    )
    listed: list[dict[str, Any]] = []
    first_ok: int | None = None
    for i, (pl, frac) in enumerate(cands, 1):
        tilt = float(np.degrees(np.arccos(np.clip(pl.normal @ up, -1.0, 1.0))))
        below = None if centre is None else float(pl.height(centre[None])[0])
        why = []
        if tilt > max_tilt_deg:
            why.append(f"tilted {tilt:.0f} deg from up (a wall or slope)")
        if below is not None and below < min_below_m:
            why.append(
                "above the cameras (a ceiling or shelf)"
                if below < 0
                else f"only {below:.2f} m below the cameras"
            )
        listed.append(
            {
                "number": i,
                "plane": [round(float(x), 5) for x in pl.to_list()],
                "inlier_fraction": round(frac, 4),
                "tilt_deg": round(tilt, 1),
                "camera_height_m": None if below is None else round(below, 3),
                "refused": "; ".join(why),
            }
        )
        if not why and first_ok is None:
            first_ok = i
    if choice != "auto":
        if not choice.isdigit() or not 1 <= int(choice) <= len(cands):
            raise ReconstructionError(
                f"--support-plane {choice!r}: use auto, none, a candidate number 1-{len(cands)} "
                "or a,b,c,d"
            )
        k = int(choice)
        return SupportChoice(cands[k - 1][0], cands[k - 1][1], listed, k, "user's choice")
    if first_ok is None:
        lines = "; ".join(
            f"{c['number']}: plane {c['plane']} ({c['inlier_fraction'] * 100:.0f} % of points, "
            f"{c['refused']})"
            for c in listed
        )
        msg = (
            f"no support plane found (rule: {rule}); objects were not segmented. Candidates: "
            f"{lines or 'none'}. Pick one with --support-plane NUMBER, give one with "
            "--support-plane a,b,c,d, or scan more of the floor/table"
        )
        return SupportChoice(None, 0.0, listed, None, rule, msg)
    pl, frac = cands[first_ok - 1]
    return SupportChoice(pl, frac, listed, first_ok, rule)
