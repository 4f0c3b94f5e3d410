"""Which recording to make next (Qt-free; the CLI and the GUI share it).

`suggest_job(project, twin_id, params, fit_id=..., trajectory_ids=...)` is a job that ranks
the excitation library's candidate motions by expected information gain at the current
estimate (twins/fit/design.py): the estimate is the fit's (else the twin's nominal values),
the information in hand comes from the recordings the fit used (or those named). It
returns the ranked `Suggestion`s (`only` keeps the named candidates); `record_command` turns one into the `record` command line
that makes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.workflows.fit import load_fit, load_recording
from app.workflows.twin import load_twin
from devices.robots.motion import MotionError
from resources.jobs import Job, Progress
from resources.project import Project
from twins.errors import TwinError
from twins.executor import make_executor
from twins.fit.design import (
    Suggestion,
    default_candidates,
    information,
    rank,
    robot_info_for,
    start_pose,
)
from twins.pushes import plan_push

PUSH_DIRECTIONS = (0.0, 90.0)  # deg
PUSH_SPEEDS = (0.05, 0.15)  # m/s


def suggest_job(
    project: Project,
    twin_id: str | None,
    params: Sequence[str] = (),
    fit_id: str | None = None,
    trajectory_ids: Sequence[str] | None = None,
    amplitude: float = 0.1,
    duration: float = 6.0,
    sigma: dict[str, float] | None = None,
    pushes: bool = False,
    workers: int = 1,
    only: Sequence[str] = (),
) -> Job[list[Suggestion]]:
    """Job: rank candidate motions, best first (see the module docstring)."""

    values: dict[str, float] = {}
    if fit_id is not None:
        d = load_fit(project, fit_id, finished=True)
        twin_id = twin_id or str(d["twin"])
        values = {str(k): float(v) for k, v in d["estimate"].items()}
        params = list(params) or list(values)
        if trajectory_ids is None:
            trajectory_ids = list(d.get("trajectories", []))
    tid, spec = load_twin(project, twin_id)
    if not params:
        raise TwinError("design: choose --params NAME ... (or --fit FIT to take its parameters)")
    unknown = [p for p in params if p not in spec.params]
    if unknown:
        raise TwinError(
            f"design: twin '{tid}' has no parameter(s) {unknown} (see `python main.py twin info`)"
        )
    recs = [load_recording(project, i) for i in trajectory_ids or ()]
    values = {**{p: spec.params[p].nominal for p in params}, **values}
    info = robot_info_for(spec, recs)
    q0 = start_pose(spec, info, recs)
    cands = default_candidates(info, q0, amplitude, duration)
    if pushes:
        for obj in spec.objects:
            for direction in PUSH_DIRECTIONS:
                for speed in PUSH_SPEEDS:
                    key = f"push:{obj.name}:{direction:g}deg:{speed:g}m/s"
                    try:
                        cands[key] = plan_push(
                            info,
                            q0,
                            target_xy=tuple(obj.pose[:2]),
                            direction=direction,
                            speed=speed,
                        )
                    except MotionError:
                        continue
    if only:
        missing = [k for k in only if k not in cands]
        if missing:
            raise TwinError(
                f"design: no candidate(s) {missing} for robot {info.name} (candidates: "
                f"{', '.join(cands)})"
            )
        cands = {k: cands[k] for k in only}
    executor = make_executor("local", workers)
    try:
        yield Progress(0.0, f"information in {len(recs)} recording(s) at the estimate")
        current = information(spec, values, params, recs, sigma, executor=executor)
        ranked: list[Suggestion] = []
        for i, (key, motion) in enumerate(cands.items()):
            yield Progress(0.05 + 0.95 * i / len(cands), f"scoring {key} ({i + 1}/{len(cands)})")
            ranked += rank(spec, values, params, {key: motion}, current, sigma, executor=executor)
    finally:
        executor.close()
    ranked.sort(key=lambda s: s.gain, reverse=True)
    yield Progress(1.0, f"best next recording: {ranked[0].name}" if ranked else "no candidate")
    return ranked


def record_command(s: Suggestion) -> str:
    """The `record` command line that makes suggestion `s` (project/robot options to add)."""
    p = s.motion.params
    if s.motion.name == "push":
        x, y = p["target_xy"]
        return (
            f"python main.py record --motion push --target {x:.3f} {y:.3f} "
            f"--direction {p['direction']:g} --speed {p['speed']:g}"
        )
    parts = [f"python main.py record --motion {s.motion.name}"]
    for key in ("amplitude", "velocity", "duration"):
        if key in p and not (key == "duration" and s.motion.name == "steps"):
            parts.append(f"--{key} {p[key]:g}")
    if p.get("joints") not in (None, "all"):
        parts.append(f"--joints {' '.join(str(p['joints']).split(','))}")
    return " ".join(parts)


def latest_fit(project: Project) -> str | None:
    """The newest finished fit of the project (cancelled ones are skipped), or None."""
    for art in reversed(project.artifacts("fit")):
        if art.settings.get("status", "done") != "cancelled":
            return art.id
    return None
