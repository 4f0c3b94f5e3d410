"""Robust hand-eye calibration, eye-in-hand and eye-to-hand, with its own uncertainty.

One formulation covers both set-ups: view i shows the board at
`T_camera_board_i = inv(A_i @ X) @ B`, where

- eye-in-hand (camera on the wrist, board fixed): `A_i = T_base_hand_i`,
  `X = T_hand_camera`, `B = T_base_board`;
- eye-to-hand (camera fixed, board on the wrist): `A_i = inv(T_base_hand_i)`,
  `X = T_base_camera`, `B = T_hand_board`.

`solve_hand_eye` runs Park–Martin (closed form) on the views, refines X and B together on
the reprojection error of every board corner (through the camera's distortion) with a
robust loss, drops the worst view while it reprojects far above the others (the reason is
kept), refits once per view left out to measure the result's own spread, warns when the
closed form and the refinement disagree by more than that spread allows, and says which
wrist rotation the views lack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares
from scipy.spatial.transform import Rotation

from devices.frames import Intrinsics
from devices.poses import invert, rotation_angle_deg
from reconstruction.board import (
    BoardView,
    CalibrationError,
    RejectedView,
    project_points,
    view_rms_px,
)
from reconstruction.calibration import CalibrationResult, mean_pose, park_martin

Mode = Literal["eye_in_hand", "eye_to_hand"]
MODES: tuple[Mode, ...] = ("eye_in_hand", "eye_to_hand")


@dataclass(frozen=True)
class HandEyeOptions:
    """Settings of `solve_hand_eye`.

    loss, loss_scale_px: scipy `least_squares` robust loss on corner residuals (pixels).
    outlier_factor, outlier_floor_px: a view is dropped while its RMS reprojection exceeds
    both `outlier_factor` x the median view RMS and `outlier_floor_px`.
    min_views: never drop below this many views.
    leave_one_out: measure the spread (one refit per view).
    disagreement_spreads: warn when Park–Martin and the refinement differ by more than
    this many spreads (plus `disagreement_floor_mm` / `_deg`, the noise of a noise-free fit).
    """

    loss: str = "soft_l1"
    loss_scale_px: float = 1.0
    outlier_factor: float = 3.0
    outlier_floor_px: float = 2.0
    min_views: int = 4
    leave_one_out: bool = True
    disagreement_spreads: float = 3.0
    disagreement_floor_mm: float = 0.5
    disagreement_floor_deg: float = 0.05


def solve_hand_eye(
    T_base_hand: Sequence[NDArray[np.float64]],
    views: Sequence[BoardView],
    intrinsics: Intrinsics,
    mode: Mode = "eye_in_hand",
    options: HandEyeOptions | None = None,
    rejected: Sequence[RejectedView] = (),
) -> CalibrationResult:
    """Hand-eye calibration from robot wrist poses and the board views taken at them.

    `T_base_hand[i]` is the wrist pose of `views[i]`. `rejected`: views already left out
    (e.g. by detection), carried into the result. Returns a CalibrationResult whose `T` is
    T_hand_camera (eye-in-hand) or T_base_camera (eye-to-hand), with `uncertainty`,
    `rejected`, `warnings`, `suggestions`. Raises CalibrationError for too few views or
    motion that rotates about one axis only.
    """
    opt = options or HandEyeOptions()
    if mode not in MODES:
        raise CalibrationError(f"hand-eye mode {mode!r}: expected one of {', '.join(MODES)}")
    if len(views) < 3 or len(views) != len(T_base_hand):
        raise CalibrationError(
            f"hand-eye needs >= 3 board views with robot poses, got "
            f"{len(views)} views and {len(T_base_hand)} poses"
            + (f" ({len(rejected)} views rejected)" if rejected else "")
        )
    anchors = [_anchor(np.asarray(T, float), mode) for T in T_base_hand]
    used = list(range(len(views)))
    dropped = list(rejected)
    while True:
        X_linear, X, B = _fit(anchors, views, used, intrinsics, opt)
        rms = np.array([_rms(anchors[i], X, B, views[i], intrinsics) for i in used])
        median = float(np.median(rms))
        limit = max(opt.outlier_floor_px, opt.outlier_factor * median)
        worst = int(np.argmax(rms))
        if rms[worst] <= limit or len(used) <= opt.min_views:
            break
        view = views[used[worst]]
        why = (
            f"its corners fit a board pose of their own at {view.rms_px:.2f} px, so its "
            "robot pose disagrees with the other views (pose timing, a loose board or camera)"
            if view.rms_px < 0.5 * rms[worst]
            else f"its corners fit even a board pose of their own poorly ({view.rms_px:.2f} "
            "px): blur, glare or a wrong board spec"
        )
        dropped.append(
            RejectedView(
                view.index,
                "residual",
                f"reprojects at {rms[worst]:.2f} px after the fit, over {limit:.2f} px "
                f"({opt.outlier_factor:g}x the median {median:.2f} px); {why}",
            )
        )
        del used[worst]

    res = CalibrationResult(
        ("hand_eye" if mode == "eye_in_hand" else "eye_to_hand")
        + "_park_martin+robust_reprojection",
        X,
        B if mode == "eye_in_hand" else np.full((4, 4), np.nan),
        views=[views[i].index for i in used],
        mode=mode,
        T_hand_board=B if mode == "eye_to_hand" else None,
        T_linear=X_linear,
        rejected=dropped,
    )
    for i in used:
        B_i = anchors[i] @ X @ views[i].T_camera_board
        res.residual_mm.append(float(np.linalg.norm(B_i[:3, 3] - B[:3, 3]) * 1000))
        res.residual_deg.append(rotation_angle_deg(B_i, B))
    res.reproj_px = [float(v) for v in rms]
    if opt.leave_one_out:
        res.uncertainty = _leave_one_out(anchors, views, used, intrinsics, opt, X, B)
    _, B_linear = _refine(anchors, views, used, intrinsics, opt, X_linear, B, fix_X=True)
    res.uncertainty["linear_reproj_px_median"] = float(
        np.median([_rms(anchors[i], X_linear, B_linear, views[i], intrinsics) for i in used])
    )
    _warn(res, opt)
    hands = [np.asarray(T_base_hand[i], float) for i in used]
    res.rotation_spread_deg, res.suggestions = _pose_suggestions(hands)
    return res


def hand_eye(
    T_base_hand: Sequence[NDArray[np.float64]], views: Sequence[BoardView], intrinsics: Intrinsics
) -> CalibrationResult:
    """Eye-in-hand calibration from robot hand poses and board views of a fixed board.

    Needs >= 3 views with rotation between them. Park–Martin, then a robust reprojection
    refinement that drops outlier views (`solve_hand_eye`).
    Residuals per view: how far that view's board pose in the base frame lies from the
    consensus (mm, deg) and its reprojection RMS. Raises CalibrationError.
    """
    return solve_hand_eye(T_base_hand, views, intrinsics, mode="eye_in_hand")


def _anchor(T_base_hand: NDArray[np.float64], mode: Mode) -> NDArray[np.float64]:
    return T_base_hand if mode == "eye_in_hand" else invert(T_base_hand)


def _fit(
    anchors: Sequence[NDArray[np.float64]],
    views: Sequence[BoardView],
    used: Sequence[int],
    intrinsics: Intrinsics,
    opt: HandEyeOptions,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """(Park–Martin X, refined X, refined B) on the views `used`."""
    X_linear = park_martin([anchors[i] for i in used], [views[i].T_camera_board for i in used])
    B0 = mean_pose([anchors[i] @ X_linear @ views[i].T_camera_board for i in used])
    X, B = _refine(anchors, views, used, intrinsics, opt, X_linear, B0)
    return X_linear, X, B


def _refine(
    anchors: Sequence[NDArray[np.float64]],
    views: Sequence[BoardView],
    used: Sequence[int],
    intrinsics: Intrinsics,
    opt: HandEyeOptions,
    X0: NDArray[np.float64],
    B0: NDArray[np.float64],
    fix_X: bool = False,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """X and B minimising the robust reprojection error of every corner of `used` (only B
    with `fix_X`).

    Parametrised as small corrections applied on the right of X0 and B0, so that no pose
    sits at the rotation-vector singularity (a board flipped 180 degrees is common)."""
    anchors_inv = [invert(anchors[i]) for i in used]
    used_views = [views[i] for i in used]

    def corrected(
        params: NDArray[np.float64],
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        if fix_X:
            return X0, B0 @ _delta(params)
        return X0 @ _delta(params[:6]), B0 @ _delta(params[6:])

    def residuals(params: NDArray[np.float64]) -> NDArray[np.float64]:
        X, B = corrected(params)
        X_inv = invert(X)
        return np.concatenate(
            [
                (project_points(v.object_points, X_inv @ A_inv @ B, intrinsics) - v.corners).ravel()
                for A_inv, v in zip(anchors_inv, used_views, strict=True)
            ]
        )

    sol = least_squares(
        residuals,
        np.zeros(6 if fix_X else 12),
        loss=opt.loss,
        f_scale=opt.loss_scale_px,
        method="trf",
        x_scale="jac",
    )
    return corrected(sol.x)


def _delta(params: NDArray[np.float64]) -> NDArray[np.float64]:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_rotvec(params[:3]).as_matrix()
    T[:3, 3] = params[3:]
    return T


def _rms(
    anchor: NDArray[np.float64],
    X: NDArray[np.float64],
    B: NDArray[np.float64],
    view: BoardView,
    intrinsics: Intrinsics,
) -> float:
    return view_rms_px(view, invert(anchor @ X) @ B, intrinsics)


def _leave_one_out(
    anchors: Sequence[NDArray[np.float64]],
    views: Sequence[BoardView],
    used: Sequence[int],
    intrinsics: Intrinsics,
    opt: HandEyeOptions,
    X: NDArray[np.float64],
    B: NDArray[np.float64],
) -> dict[str, Any]:
    """Jackknife spread of X: refit without each view in turn (from the full solution).

    spread_mm / spread_deg: the jackknife standard error (one sigma) of X's translation and
    rotation; max_shift_mm / _deg: the largest move of X when one view is left out;
    most_influential_view: the view whose absence moves X's translation most;
    linear_spread_*: the same for the closed form (Park–Martin)."""
    n = len(used)
    if n < 4:
        return {"method": "leave-one-out", "views": n, "why": "needs >= 4 views"}
    refined, linear = [], []
    for k in range(n):
        rest = [i for j, i in enumerate(used) if j != k]
        refined.append(_refine(anchors, views, rest, intrinsics, opt, X, B)[0])
        linear.append(
            park_martin([anchors[i] for i in rest], [views[i].T_camera_board for i in rest])
        )
    spread_mm, spread_deg = _jackknife(refined)
    linear_mm, linear_deg = _jackknife(linear)
    shift_mm = np.array([np.linalg.norm(S[:3, 3] - X[:3, 3]) * 1000 for S in refined])
    shift_deg = np.array([rotation_angle_deg(S, X) for S in refined])
    worst = int(np.argmax(shift_mm))
    return {
        "method": "leave-one-out (jackknife, 1 sigma)",
        "views": n,
        "spread_mm": spread_mm,
        "spread_deg": spread_deg,
        "max_shift_mm": float(shift_mm.max()),
        "max_shift_deg": float(shift_deg.max()),
        "most_influential_view": views[used[worst]].index,
        "linear_spread_mm": linear_mm,
        "linear_spread_deg": linear_deg,
    }


def _jackknife(solutions: Sequence[NDArray[np.float64]]) -> tuple[float, float]:
    """Jackknife standard error (mm, deg) of leave-one-out poses."""
    n = len(solutions)
    t = np.array([S[:3, 3] for S in solutions])
    R_mean = mean_pose(solutions)
    angles = np.array([rotation_angle_deg(S, R_mean) for S in solutions])
    scale = (n - 1) / n
    return (
        float(np.sqrt(scale * np.sum((t - t.mean(axis=0)) ** 2)) * 1000),
        float(np.sqrt(scale * np.sum(angles**2))),
    )


def _warn(res: CalibrationResult, opt: HandEyeOptions) -> None:
    median = float(np.median(res.reproj_px))
    if median > 2.0:
        res.warnings.append(
            f"median reprojection {median:.2f} px (> 2 px): check the intrinsics and "
            "distortion, the board spec, and that each robot pose belongs to its image"
        )
    if res.T_linear is None:
        return
    d_mm = float(np.linalg.norm(res.T_linear[:3, 3] - res.T[:3, 3]) * 1000)
    d_deg = rotation_angle_deg(res.T_linear, res.T)
    u = res.uncertainty
    if "spread_mm" not in u:
        return
    # both estimates scatter: the refined one with the corner noise, the closed form with
    # the noise of each view's PnP pose (large when the views rotate little)
    spread_mm = float(np.hypot(u["spread_mm"], u["linear_spread_mm"]))
    spread_deg = float(np.hypot(u["spread_deg"], u["linear_spread_deg"]))
    limit_mm = opt.disagreement_spreads * spread_mm + opt.disagreement_floor_mm
    limit_deg = opt.disagreement_spreads * spread_deg + opt.disagreement_floor_deg
    u["linear_vs_refined_mm"] = d_mm
    u["linear_vs_refined_deg"] = d_deg
    if d_mm > limit_mm or d_deg > limit_deg:
        linear_px = u.get("linear_reproj_px_median", float("nan"))
        refined_px = float(np.median(res.reproj_px))
        if linear_px > 1.5 * refined_px + 0.05:
            why = (
                f"the images favour the refined one ({refined_px:.2f} px median reprojection "
                f"vs {linear_px:.2f} px for the closed form, board refitted): the closed form "
                "is the weak one here, usually because the views rotate too little about "
                "one axis (see the suggestions)"
            )
        else:
            why = (
                f"and the images do not tell them apart ({refined_px:.2f} vs {linear_px:.2f} "
                "px median reprojection): the robot poses and the images disagree (timing, "
                "intrinsics, a loose board or camera); add views before trusting either"
            )
        res.warnings.append(
            f"closed form (Park–Martin) vs refined: they differ by {d_mm:.2f} mm / "
            f"{d_deg:.3f} deg, more than {opt.disagreement_spreads:g}x their combined "
            f"leave-one-out spread ({spread_mm:.2f} mm / {spread_deg:.3f} deg); {why}"
        )


@dataclass(frozen=True)
class RotationSpread:
    """How the wrist rotations of a set of views spread.

    The wrist rotations relative to their mean (`R_mean`, base frame), as rotation vectors
    in the mean wrist frame, give a 3x3 covariance; `std_deg` are its square-rooted
    eigenvalues in degrees, weakest first, `axes` the matching eigen-directions (columns, in
    the mean wrist frame; `R_mean @ axes[:, k]` is the same direction in the base frame).
    Hand-eye needs rotation about two or more axes: `std_deg[1]` near 0 means the views
    rotate about one axis only."""

    std_deg: NDArray[np.float64]
    axes: NDArray[np.float64]
    R_mean: NDArray[np.float64]
    about_wrist_deg: tuple[float, float, float]

    def axis_name(self, k: int) -> str:
        return _axis_name(self.axes[:, k])

    def axis_in_base(self, k: int) -> NDArray[np.float64]:
        return np.asarray(self.R_mean @ self.axes[:, k], float)

    def lacking_axis(self, min_deg: float) -> int | None:
        """The axis to add wrist rotation about when the views turn about one axis only
        (the second one spreads less than `min_deg`): 1; else None."""
        return 1 if float(self.std_deg[1]) < min_deg else None


def rotation_spread(T_base_hand: Sequence[NDArray[np.float64]]) -> RotationSpread:
    """The `RotationSpread` of the wrist poses `T_base_hand` (at least one)."""
    mean = Rotation.from_matrix([np.asarray(T)[:3, :3] for T in T_base_hand]).mean()
    r = (
        mean.inv() * Rotation.from_matrix([np.asarray(T)[:3, :3] for T in T_base_hand])
    ).as_rotvec()
    cov = r.T @ r / len(r)
    eigvals, eigvecs = np.linalg.eigh(cov)
    about = tuple(float(np.degrees(np.sqrt(cov[k, k]))) for k in range(3))
    return RotationSpread(
        std_deg=np.degrees(np.sqrt(np.maximum(eigvals, 0.0))),
        axes=eigvecs,
        R_mean=mean.as_matrix(),
        about_wrist_deg=about,  # type: ignore[arg-type]
    )


def _pose_suggestions(
    T_base_hand: Sequence[NDArray[np.float64]],
) -> tuple[dict[str, float], list[str]]:
    """The views' rotation spread about the wrist axes, and which poses to add.

    The weakest eigen-direction of the `rotation_spread` is the rotation the views lack.
    Hand-eye needs motion about two or more axes; the less one axis is turned about, the
    worse conditioned both the closed form and the refinement are."""
    rs = rotation_spread(T_base_hand)
    std = rs.std_deg
    spread = {f"about wrist {a}": rs.about_wrist_deg[k] for k, a in enumerate("xyz")}
    spread["weakest"] = float(std[0])
    spread["strongest"] = float(std[2])
    weak_axis = rs.axis_name(0)
    suggestions = []
    if std[0] < 0.5 * std[2] or std[0] < 10.0:
        suggestions.append(
            f"add 2-3 views with the wrist turned about {weak_axis} by about "
            f"±{max(15.0, float(std[2])):.0f} deg (the views now spread ±{std[0]:.1f} deg about "
            f"it, ±{std[2]:.1f} deg about {rs.axis_name(2)})"
        )
    else:
        suggestions.append(
            f"the views' rotation is balanced (±{std[0]:.1f} to ±{std[2]:.1f} deg); if more "
            f"views are wanted, turn the wrist about {weak_axis}"
        )
    n = len(T_base_hand)
    if n < 8:
        suggestions.append(
            f"only {n} views are used; 10-15 views spread over the workspace shrink the "
            "spread roughly as 1/sqrt(views)"
        )
    return spread, suggestions


def _axis_name(v: NDArray[np.float64]) -> str:
    """'the wrist z axis' when v is within 25 degrees of a wrist axis, else its direction."""
    k = int(np.argmax(np.abs(v)))
    if abs(v[k]) > np.cos(np.radians(25)):
        return f"the wrist {'xyz'[k]} axis"
    u = v if v[k] > 0 else -v
    return f"the wrist axis ({u[0]:.2f}, {u[1]:.2f}, {u[2]:.2f})"
