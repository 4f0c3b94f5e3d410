"""Twin workflows (Qt-free jobs shared by the CLI and the Twin page).

- `build_twin(project, scan_id, robot)`: scan artifact (+ robot URDF) -> twin artifact
  (twin.json, object meshes and hulls, repaired robot URDF if any, URDF exports), lineage
  to the scan. `procedural_scan(project)` writes the demo scan when there is no camera scan.
- `save_twin_edit(project, parent_id, spec)`: an edited twin (values, object poses) as a new
  artifact whose parent is the twin it came from (artifacts are immutable).
- `set_twin_values(project, twin_id, ["NAME=VALUE", ...])`: hand-set values (a number,
  optionally followed by the parameter's declared unit) as a new twin version through
  `save_twin_edit`; every assignment is checked first and a bad one is refused naming the
  parameter and the problem, with nothing written.
- `load_twin(project, twin_id)`, `twin_summary(spec)`, `simulate_twin(...)`.

A failure leaves the project exactly as it was (`Project.new_artifact` discards the
half-written folder).
"""

from __future__ import annotations

import difflib
import logging
import math
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resources.jobs import Job, Progress
from resources.project import Project, ProjectError
from resources.text import count
from twins.builder import TwinWorld
from twins.errors import TwinError
from twins.export import export_urdfs
from twins.from_scan import PANDA, build_twin_steps, resolve_robot_ref
from twins.params import Param
from twins.scan_input import procedural_scan_result
from twins.spec import IDENTITY_POSE, TwinSpec
from twins.urdf import read_urdf
from twins.view import drawables, poses

DEFAULT_ROBOT = PANDA
log = logging.getLogger(__name__)


def procedural_scan(project: Project) -> str:
    """Write the procedural demo scan (box, cylinder, U-block on a table) as a scan
    artifact; returns its id."""

    res = procedural_scan_result()
    with project.new_artifact(
        "scan",
        settings={"source": "procedural"},
        summary=f"procedural demo scan, {len(res.objects)} objects",
    ) as f:
        res.save(f)
    return project.artifacts("scan")[-1].id


def build_twin(
    project: Project,
    scan_id: str | None,
    robot: str | None = DEFAULT_ROBOT,
    name: str | None = None,
    procedural: bool = False,
    base_pose: Any = None,
) -> Job[str]:
    """Job: build a twin artifact from scan `scan_id` (the latest scan when None; the
    procedural demo scan when `procedural` and there is none). Returns the twin id."""
    if robot:  # refuse a bad robot file before anything is written
        read_urdf(resolve_robot_ref(robot))
    if scan_id is None:
        latest = project.latest("scan")
        if latest is not None and not procedural:
            scan_id = latest.id
        elif procedural:
            yield Progress(0.0, "writing the procedural demo scan")
            scan_id = procedural_scan(project)
        else:
            raise TwinError(
                f"{project.root}: no scan to build a twin from (scan first, or "
                "use --procedural for the demo objects)"
            )
    scan_dir = project.path_of(scan_id)
    settings = {"scan": scan_id, "robot": robot or "none"}
    with project.new_artifact(
        "twin",
        inputs=[scan_id],
        settings=settings,
        summary=f"from {scan_id}" + (f" + {robot}" if robot else ""),
    ) as folder:
        spec: TwinSpec = yield from build_twin_steps(  # closed with this job (a cancel)
            scan_dir,
            folder,
            robot,
            tuple(base_pose) if base_pose is not None else IDENTITY_POSE,
            name=name or f"twin of {scan_id}",
            meta={"scan_id": scan_id},
        )
        notes = spec.meta.get("notes", [])
        log.info(
            "built twin '%s' with %d objects%s",
            spec.name,
            len(spec.objects),
            f" ({count(len(notes), 'note')})" if notes else "",
        )
    return project.artifacts("twin")[-1].id


def load_twin(project: Project, twin_id: str | None = None) -> tuple[str, TwinSpec]:
    """(id, spec) of twin `twin_id` (the latest when None)."""
    if twin_id is None:
        art = project.latest("twin")
        if art is None:
            raise TwinError(f"{project.root}: no twin yet (build one from a scan)")
        twin_id = art.id
    return twin_id, TwinSpec.load(project.path_of(twin_id))


def save_twin_edit(
    project: Project,
    parent_id: str,
    spec: TwinSpec,
    values: Mapping[str, float] | None = None,
    summary: str = "edited",
    extra_inputs: tuple[str, ...] = (),
    settings: Mapping[str, Any] | None = None,
) -> str:
    """A new twin artifact: `spec` with `values` as its nominals, files copied from the
    parent twin, lineage parent -> new (inputs: the parent's scan, plus `extra_inputs`
    such as the fit and recordings the values came from; `settings` recorded beside
    `edit_of`)."""
    parent_dir = project.path_of(parent_id)
    edited = spec.with_values(values or {})
    parent = project.artifact(parent_id)
    with project.new_artifact(
        "twin",
        inputs=[*parent.inputs, *(i for i in extra_inputs if i not in parent.inputs)],
        parent=parent_id,
        settings={"edit_of": parent_id, **(settings or {})},
        summary=summary,
    ) as folder:
        for item in Path(parent_dir).iterdir():
            if item.name in ("twin.json", "urdf"):
                continue
            dst = folder / item.name
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, dst)
        from dataclasses import replace

        moved = replace(
            edited, base_dir=folder, meta={**dict(edited.meta), "parent_twin": parent_id}
        )
        export_urdfs(moved, folder / "urdf")
        moved.save(folder)
    return project.artifacts("twin")[-1].id


_NUMBER = re.compile(
    r"^\s*([-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf(?:inity)?|nan))\s*(.*?)\s*$",
    re.IGNORECASE,
)
_EXAMPLE = "robot.joints.panda_joint1.damping=0.5"


@dataclass(frozen=True)
class SetValue:
    """One parameter changed by `set_twin_values`: its value before and after, its unit."""

    name: str
    old: float
    new: float
    unit: str


def parse_value(param: Param, text: str) -> float:
    """`text` as a value of `param`: a number, optionally followed by exactly the unit the
    parameter declares (`0.5`, `0.5N*m*s/rad`, `30 1/s`); checked to be finite, inside the
    bounds and whole for a count. TwinError naming the parameter otherwise."""

    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        value = _number_in_unit(param, raw)
    if param.integer and math.isfinite(value) and value != round(value):
        raise TwinError(f"parameter '{param.name}' is a whole number (a count); {value:g} is not")
    return param.check(value)


def _number_in_unit(param: Param, raw: str) -> float:
    """A number followed by the parameter's declared unit text; TwinError naming the
    parameter and its unit for any other unit, or for no number at all."""

    if param.unit and raw.endswith(param.unit):
        try:
            return float(raw[: -len(param.unit)])
        except ValueError:
            pass
    m = _NUMBER.match(raw)
    if m is None or not m.group(2):
        raise TwinError(
            f"parameter '{param.name}': '{raw}' is not a number (give a number, optionally "
            f"followed by its unit '{param.unit}')"
        )
    raise TwinError(
        f"parameter '{param.name}': unit '{m.group(2)}' is not its unit '{param.unit}'; give "
        f"the value in {param.unit}, as a bare number or followed by '{param.unit}'"
    )


def _twin_to_edit(project: Project, twin_id: str) -> TwinSpec:
    try:
        art = project.artifact(twin_id)
    except ProjectError:
        ids = [a.id for a in project.artifacts("twin")]
        there = f"its twins: {', '.join(ids[-5:])}" if ids else "it has no twin yet"
        raise TwinError(f"{project.root}: no twin '{twin_id}' ({there})") from None
    if art.kind != "twin":
        raise TwinError(f"{project.root}: '{twin_id}' is a {art.kind}, not a twin")
    return load_twin(project, twin_id)[1]


def parse_assignments(
    spec: TwinSpec, assignments: Sequence[str], twin_id: str = ""
) -> list[SetValue]:
    """`NAME=VALUE` texts as changes to `spec`'s nominals; every one checked (known name,
    value as `parse_value` takes it, each name once, a value that changes something).
    TwinError naming the assignment or parameter and the problem."""

    out: dict[str, SetValue] = {}
    for text in assignments:
        name, eq, value = (x.strip() for x in text.partition("="))
        if not eq or not name:
            raise TwinError(f"twin set: '{text}' is not NAME=VALUE (e.g. {_EXAMPLE})")
        if not value:
            raise TwinError(f"twin set: '{text}' has no value; write NAME=VALUE (e.g. {_EXAMPLE})")
        param = spec.params.get(name)
        if param is None:
            names = list(spec.params)
            close = [n for n in names if n.endswith(name)][:3]  # a shortened name
            close += [n for n in difflib.get_close_matches(name, names, 3, 0.6) if n not in close]
            hint = f"; closest: {', '.join(close[:3])}" if close else ""
            raise TwinError(
                f"twin '{twin_id or spec.name}' has no parameter '{name}'{hint} "
                "(`python main.py twin info` lists them)"
            )
        if name in out:
            raise TwinError(f"parameter '{name}' is set twice")
        out[name] = SetValue(name, param.nominal, parse_value(param, value), param.unit)
    if not out:
        raise TwinError(f"twin set: give at least one NAME=VALUE (e.g. {_EXAMPLE})")
    same = [c for c in out.values() if c.new == c.old]
    if len(same) == len(out):
        what = ", ".join(f"{c.name} = {c.old:g} {c.unit}" for c in same)
        raise TwinError(f"nothing to change: {what} already (no new twin version made)")
    return list(out.values())


def set_twin_values(
    project: Project, twin_id: str, assignments: Sequence[str], name: str | None = None
) -> tuple[str, list[SetValue]]:
    """A new twin version of `twin_id` with hand-set values (`NAME=VALUE` texts, see
    `parse_assignments`) and display name `name` (default: the twin's); its parent is
    `twin_id`, which is not changed. Everything is checked before anything is written.
    Returns the new twin id and the changes."""
    from dataclasses import replace

    spec = _twin_to_edit(project, twin_id)
    changes = parse_assignments(spec, assignments, twin_id)
    if name:
        spec = replace(spec, name=name)
    what = ", ".join(f"{c.name}={c.new:g} {c.unit}" for c in changes)
    new_id = save_twin_edit(
        project,
        twin_id,
        spec,
        {c.name: c.new for c in changes},
        summary=f"set {what} on {twin_id}",
        settings={"set": {c.name: c.new for c in changes}},
    )
    return new_id, changes


def twin_summary(spec: TwinSpec) -> dict[str, Any]:
    """Counts for a status line or the CLI."""
    return {
        "name": spec.name,
        "objects": len(spec.objects),
        "params": len(spec.params),
        "robot": spec.robot.urdf if spec.robot else None,
        "joints": len(spec.robot.joints) if spec.robot else 0,
        "notes": list(spec.meta.get("notes", [])),
    }


class TwinSession:
    """A twin open for viewing and editing (the Twin page's model; Qt-free).

    Holds the spec, the current parameter values and a built world; `step` advances it,
    `reset` returns to the start, `set_values` / `move_object` rebuild it. Geometry and poses
    come as plain arrays (`twins.view`)."""

    def __init__(self, spec: TwinSpec, twin_id: str | None = None) -> None:
        self.spec = spec
        self.twin_id = twin_id
        self.values: dict[str, float] = spec.params.nominal()
        self.time = 0.0
        self.world = TwinWorld(spec, self.values)
        self._drawables: list[Any] | None = None
        self.edited = False

    def close(self) -> None:
        self.world.close()

    @property
    def notes(self) -> list[str]:
        return list(self.spec.meta.get("notes", [])) + [
            n for n in self.world.notes if n not in self.spec.meta.get("notes", [])
        ]

    def drawables(self) -> list[Any]:
        """Meshes in body frames (cached: geometry does not change when values do)."""
        if self._drawables is None:
            self._drawables = drawables(self.world)
        return self._drawables

    def poses(self) -> dict[str, Any]:
        return poses(self.world)

    def step(self, seconds: float) -> None:
        n = max(1, int(round(seconds / self.world.dt)))
        self.world.step(n)
        self.time += n * self.world.dt

    def reset(self) -> None:
        self.world.reset()
        self.time = 0.0

    def _rebuild(self, spec: TwinSpec, values: Mapping[str, float]) -> None:
        new = TwinWorld(spec, values)  # raises TwinError naming the parameter; old kept then
        self.world.close()
        self.world, self.spec, self.values = new, spec, dict(new.values)
        self.time = 0.0
        self.edited = True

    def set_values(self, values: Mapping[str, float]) -> None:
        """New parameter values (validated against the bounds); the world restarts."""
        self._rebuild(self.spec, {**self.values, **values})

    def move_object(self, name: str, pose: Any) -> None:
        """Place object `name` at pose (xyz + quat xyzw) as its new starting pose."""
        self._rebuild(self.spec.with_object_pose(name, pose), self.values)

    def save(self, project: Project, summary: str = "edited in the Twin page") -> str:
        """Save as a new twin artifact (parent: the twin this session came from)."""
        if self.twin_id is None:
            raise TwinError("this twin is not from the open project; build one there first")
        new_id = save_twin_edit(project, self.twin_id, self.spec, self.values, summary)
        self.twin_id = new_id
        self.edited = False
        return new_id


def open_session(project: Project, twin_id: str | None = None) -> TwinSession:
    """A TwinSession on twin `twin_id` (the latest when None) of `project`."""
    tid, spec = load_twin(project, twin_id)
    return TwinSession(spec, tid)


def open_session_job(project: Project, twin_id: str | None = None) -> Job[TwinSession]:
    """Job: open a twin for viewing (build its world, load its meshes) off the GUI thread."""
    yield Progress(None, "building the twin's world")
    session = open_session(project, twin_id)
    yield Progress(0.5, "loading meshes")
    session.drawables()
    return session
