"""Opening a twin for the Calibrate page (Qt-free jobs): the twin, the recordings that fit
it (with why others do not) and its meshes, loaded off the GUI thread; and saving values
tuned by eye as a new twin version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.workflows.fit import load_recording
from app.workflows.twin import load_twin, save_twin_edit
from devices.trajectory import Trajectory
from reconstruction.display import display_mesh
from resources.errors import TwinbenchError
from resources.jobs import Progress
from twins.builder import TwinWorld
from twins.fit.objective import check_recording
from twins.spec import TwinSpec
from twins.view import drawables


@dataclass(frozen=True)
class CalibrationInputs:
    """A twin and the project's recordings, loaded for the Calibrate page: `recordings` that
    fit the twin; `refused` the others, with why (another robot, unreadable)."""

    twin_id: str
    spec: TwinSpec
    recordings: Mapping[str, Trajectory]
    refused: Mapping[str, str]
    drawables: Sequence[Any]


def open_job(project: Any, twin_id: str | None, trajectory_ids: Sequence[str]) -> Any:
    """Job: load twin `twin_id` (the latest when None), the recordings and the twin's
    meshes off the GUI thread; returns `CalibrationInputs`."""

    yield Progress(None, "loading the twin")
    tid, spec = load_twin(project, twin_id)
    recs: dict[str, Trajectory] = {}
    refused: dict[str, str] = {}
    for i, rid in enumerate(trajectory_ids):
        yield Progress(i / max(len(trajectory_ids), 1), f"loading recording {rid}")
        try:
            traj = load_recording(project, rid)
            check_recording(spec, traj, rid, twin=tid)
            if "robot/command" in traj.channels and not np.all(np.isfinite(traj["robot/command"])):
                raise TwinbenchError(
                    f"recording '{rid}' has no complete commands to replay (robot/command is "
                    "NaN where nothing was commanded: it recorded the robot's state only); "
                    "record a motion with the Record panel to compare it with the twin"
                )
            traj.check_finite(f"recording '{rid}'")
        except TwinbenchError as exc:
            refused[rid] = str(exc)
            continue
        recs[rid] = traj
    yield Progress(0.9, "loading the twin's meshes")
    with TwinWorld(spec) as world:
        meshes = [_lighter(d) for d in drawables(world) if not d.collision]
    return CalibrationInputs(tid, spec, recs, refused, meshes)


DRAW_MAX_FACES = 800  # per mesh: the page draws the twin twice (recorded + ghost), live


def _lighter(d: Any) -> Any:
    """A drawable with at most DRAW_MAX_FACES triangles."""
    import trimesh

    if len(d.faces) <= DRAW_MAX_FACES:
        return d
    m = display_mesh(trimesh.Trimesh(d.vertices, d.faces, process=False), DRAW_MAX_FACES)
    return replace(d, vertices=np.asarray(m.vertices), faces=np.asarray(m.faces))


def save_job(project: Any, inputs: CalibrationInputs, values: dict[str, float]) -> Any:
    """Job: `values` saved as a new twin whose parent is the open one and whose inputs add
    the recordings; returns the new twin's id."""

    yield Progress(None, f"saving the tuned values of {inputs.twin_id} as a new twin")
    names = ", ".join(sorted(values))[:120]
    return save_twin_edit(
        project,
        inputs.twin_id,
        inputs.spec,
        values,
        summary=f"tuned by eye in the Calibrate page ({names})",
        extra_inputs=tuple(inputs.recordings),
    )
