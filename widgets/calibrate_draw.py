"""What the Calibrate page draws: plot series of recordings and their simulations, and the
recorded motion with the twin's ghost in the 3D view (widgets/calibrate_page.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PySide6 import QtGui
from scipy.spatial.transform import Rotation

from app.controller import data_dir
from app.workflows.calibrate_live import CalibFrame
from app.workflows.calibrate_preview import make_project
from devices.trajectory import Trajectory
from widgets.scene_view import SceneView
from widgets.trajectory_plot import Series, TrajectoryPlot

GHOST_RGBA = (0.35, 0.65, 1.0, 0.35)


def _qmat(T: np.ndarray) -> QtGui.QMatrix4x4:
    return QtGui.QMatrix4x4(*np.asarray(T, dtype=float).reshape(-1))


def channel_series(
    traj: Trajectory,
    source: str,
    joint_units: dict[str, str] | None = None,
    keys: set[str] | None = None,
) -> list[Series]:
    """Plot series of a recording or its simulation, time from 0: joint positions per joint
    (`<source>/joint_pos/<joint>`), object positions x/y/z (m) and orientation roll/pitch/yaw
    (rad, unwrapped) per object (`<source>/objects/<name>/<component>`). `joint_units`
    names joints whose unit differs from the channel's (a Panda's prismatic fingers: m).
    `keys`: only the series whose name after `<source>/` is one of these."""
    t = traj.t - traj.t[0]
    out: list[Series] = []

    def want(key: str) -> bool:
        return keys is None or key in keys

    if "robot/joint_pos" in traj.channels:
        q = traj["robot/joint_pos"]
        names = [str(j) for j in traj.meta.get("joint_names", [])] or [
            f"joint{k + 1}" for k in range(q.shape[1])
        ]
        unit = traj.units.get("robot/joint_pos", "rad")
        for k, jn in enumerate(names[: q.shape[1]]):
            u = (joint_units or {}).get(jn, unit)
            if want(f"joint_pos/{jn}"):
                out.append(Series(f"{source}/joint_pos/{jn}", t, q[:, k], u))
    for ch, arr in traj.channels.items():
        if not (ch.startswith("objects/") and ch.endswith("/pose")) or arr.shape[1] != 7:
            continue
        obj = ch.split("/")[1]
        for k, c in enumerate("xyz"):
            if want(f"objects/{obj}/{c}"):
                out.append(Series(f"{source}/objects/{obj}/{c}", t, arr[:, k], "m"))
        angles = [(k, c) for k, c in enumerate(("roll", "pitch", "yaw"))]
        angles = [(k, c) for k, c in angles if want(f"objects/{obj}/{c}")]
        if angles:
            rpy = np.unwrap(Rotation.from_quat(arr[:, 3:]).as_euler("xyz"), axis=0)
            for k, c in angles:
                out.append(Series(f"{source}/objects/{obj}/{c}", t, rpy[:, k], "rad"))
    return out


def residual_series(real: list[Series], sim: list[Series], label: str) -> list[Series]:
    """real − sim per series (sim interpolated onto the real times)."""
    by_key = {s.name.split("/", 1)[1]: s for s in sim}
    out = []
    for r in real:
        key = r.name.split("/", 1)[1]
        s = by_key.get(key)
        if s is not None:
            y = r.y - np.interp(r.t, s.t, s.y)
            out.append(Series(f"residual{label}/{key}", r.t, y, r.unit))
    return out


def joint_units(spec: Any) -> dict[str, str]:
    """Joints whose unit differs from their channel's (a Panda's prismatic fingers: m)."""
    robot = spec.robot if spec is not None else None
    if robot is None:
        return {}
    return {j.name: "m" for j in robot.joints if j.kind == "prismatic"}


def default_view(series: list[Series]) -> list[str]:
    """The series shown first: the joint and the object position that move most, with
    their simulation and residual."""

    def span(s: Series) -> float:
        return float(np.ptp(s.y)) if len(s.y) else 0.0

    joints = [s for s in series if "/joint_pos/" in s.name]
    objs = [s for s in series if "/objects/" in s.name and s.unit == "m"]
    pick = [max(g, key=span) for g in (joints, objs) if g and span(max(g, key=span)) > 0]
    if not pick and series:
        pick = [series[0]]
    out = []
    for s in pick:
        key = s.name.split("/", 1)[1]
        out += [s.name, f"sim/{key}", f"residual/{key}"]
    return out


def sim_series(
    sims: Mapping[str, Trajectory],
    real: Mapping[str, list[Series]],
    labelled: bool,
    joint_units: dict[str, str],
    shown: Sequence[str] | None = None,
) -> list[Series]:
    """The simulations' series and their residuals against the recordings' (`real` by
    recording id; `@<id tail>` labels when several recordings are shown). `shown`: only
    those of the channels these series names show (any source: real, sim or residual)."""
    out: list[Series] = []
    for rid, sim in sims.items():
        lab = f"@{rid.rsplit('-', 1)[-1]}" if labelled else ""
        keys = None if shown is None else shown_keys(shown, lab)
        s = channel_series(sim, f"sim{lab}", joint_units, keys)
        reals = [r for r in real.get(rid, []) if keys is None or r.name.split("/", 1)[1] in keys]
        out += s + residual_series(reals, s, lab)
    return out


def shown_keys(names: Sequence[str], label: str) -> set[str]:
    """The channels (series names without their source) of `names` that belong to the
    recording labelled `label` ("" or "@<id tail>")."""
    out = set()
    for n in names:
        src, _, key = n.partition("/")
        if src.partition("@")[2] == label[1:]:
            out.add(key)
    return out


class SimCurves:
    """The simulated series and residuals a frame draws: those shown (or of a shown
    channel) are computed with each frame, the others only when shown (until then they
    hold an older simulation). Every series is computed once per set of recordings, so
    the plot lists them all."""

    def __init__(self) -> None:
        self.sims_for: frozenset[str] | None = None
        self.stale: set[str] = set()

    def reset(self) -> None:
        """The plot lost its simulated series: the next frame computes them all."""
        self.sims_for = None

    def draw(
        self,
        plot: TrajectoryPlot,
        sims: Mapping[str, Trajectory],
        real: Mapping[str, list[Series]],
        labelled: bool,
        joint_units: dict[str, str],
    ) -> list[Series]:
        """Put a frame's series into `plot`; returns them."""
        every = frozenset(sims) != self.sims_for
        shown = None if every else plot.visible_series()
        out = sim_series(sims, real, labelled, joint_units, shown)
        if every:
            self.sims_for, self.stale = frozenset(sims), set()
        else:
            held = plot.series().values()
            self.stale |= {s.name for s in held if s.source in ("sim", "residual")}
        self.stale -= {s.name for s in out}
        plot.update_data(out)
        for p in plot.plots().values():
            keep_y_range(p)
        return out

    def refresh(
        self,
        plot: TrajectoryPlot,
        sims: Mapping[str, Trajectory],
        real: Mapping[str, list[Series]],
        labelled: bool,
        joint_units: dict[str, str],
    ) -> None:
        """Series just shown that hold an older simulation: these `sims`' data."""
        stale = [n for n in plot.visible_series() if n in self.stale]
        if stale:
            out = sim_series(sims, real, labelled, joint_units, stale)
            self.stale -= {s.name for s in out}
            plot.update_data(out)


def keep_y_range(p: Any, fill: float = 0.4, pad: float = 0.08) -> None:
    """Keep a plot's y range while its curves fit in it and fill at least `fill` of it,
    else fit it to them (with `pad`): an axis whose range changes is drawn again with its
    grid over the whole plot (~5 ms each), so re-fed curves move in a still frame. Set
    now, not while painting: a range that changes during a paint asks for a second one."""
    vb = p.vb
    lo, hi = np.inf, -np.inf
    for item in p.listDataItems():
        a, b = item.dataBounds(1)
        if a is not None and b is not None and np.isfinite(a) and np.isfinite(b):
            lo, hi = min(lo, a), max(hi, b)
    if not lo <= hi:
        vb.prepareForPaint()
        return
    y0, y1 = vb.viewRange()[1]
    if not (y0 <= lo and hi <= y1 and hi - lo >= fill * (y1 - y0)):
        span = hi - lo if hi > lo else max(abs(hi), 1e-9)
        vb.setYRange(lo - pad * span, hi + pad * span, padding=0)
    vb.disableAutoRange(axis=vb.YAxis)
    vb.prepareForPaint()


def build_scene(view: SceneView, drawables: Sequence[Any]) -> None:
    """The twin's meshes twice: `real:<mesh>` (the recorded motion) and `ghost:<mesh>`
    (the replay, translucent blue; the table once)."""
    view.clear()
    for d in drawables:
        if d.collision:
            continue
        view.set_mesh(f"real:{d.name}", d.vertices, d.faces, d.rgba, np.eye(4))
        if d.body != "table":
            view.set_mesh(f"ghost:{d.name}", d.vertices, d.faces, GHOST_RGBA, np.eye(4))
    view.look_at((0.45, 0.0, 0.25), 1.45)


def place_bodies(
    view: SceneView, drawables: Sequence[Any], f: CalibFrame, rid: str, t: float
) -> bool:
    """Put recording `rid`'s recorded bodies and the ghost where they are at time `t` (s);
    True when anything moved (the 3D view is then asked to repaint)."""
    real = f.recorded[rid].at(t)
    ghost = f.ghost[rid].at(t) if rid in f.ghost else {}
    items = view.items()
    moved = False
    for d in drawables:
        if d.collision:
            continue
        for prefix, poses in (("real:", real), ("ghost:", ghost)):
            item = items.get(prefix + d.name)
            T_body = poses.get(d.body)
            if item is None or T_body is None:
                continue
            T = T_body @ d.T_body_mesh
            if np.array_equal(item.data["transform"], T):
                continue  # e.g. the full ghost arriving for the same cursor time
            moved = True
            item.data["transform"] = T
            for g in item.gl:
                g.setTransform(_qmat(T))
    if moved and view.gl_view is not None:
        view.gl_view.update()
    return moved


def demo_project() -> str:
    """The preview's project: <data dir>/calibrate-preview with the Panda twin and a 5 s
    recording with 3 objects (made once, reused after)."""
    root = data_dir() / "calibrate-preview"
    if not root.exists():  # an existing folder is opened as it is (never overwritten)
        make_project(root)
    return str(root)
