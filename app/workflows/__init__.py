"""Workflows: one function per step of the loop (scan, build_twin, record, fit, train, deploy),
shared by the CLI and the GUI. Each step's module lives here (`app/workflows/<step>.py`) as it
is built.

This package also describes the steps themselves — what each does and what it needs first —
so the GUI's empty states, the CLI and the docs say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from resources.project import Project


@dataclass(frozen=True)
class Need:
    """A precondition of a step: an artifact kind in the project, or a connected device."""

    label: str  # "a twin (Twin page)"
    kind: str | None = None  # project artifact kind that satisfies it
    device: str | None = None  # or a device name ("robot", "camera") that must be connected


@dataclass(frozen=True)
class Step:
    """One workflow step as the GUI lists it."""

    key: str
    title: str
    does: str
    needs: tuple[Need, ...]
    cli: str | None  # its command line, or None while the step has none
    built: bool = True  # False: the page can only say what is coming
    coming: str = ""  # what the step will offer, shown while it is not built


STEPS: tuple[Step, ...] = (
    Step(
        "scan",
        "Scan",
        "Record the workspace with a RealSense camera (live, a .db3 recording or the lab "
        "camera) and reconstruct a mesh of the table and the objects on it.",
        (
            Need(
                "a camera: a RealSense, a .db3 recording, or the virtual lab camera",
                device="camera",
            ),
        ),
        "python main.py scan …",
    ),
    Step(
        "twin",
        "Twin",
        "Build a PyBullet digital twin from a scan: robot, table and objects with collision "
        "shapes, inertia and tunable physical parameters.",
        (Need("a scan (Scan page)", kind="scan"),),
        "python main.py twin build …",
    ),
    Step(
        "calibrate",
        "Calibrate",
        "Compare simulated and real trajectories and fit the twin's physical parameters "
        "(friction, mass, damping…) until they agree.",
        (
            Need("a twin (Twin page)", kind="twin"),
            Need(
                "a recorded real trajectory (record one from a connected robot)", kind="trajectory"
            ),
        ),
        "python main.py fit …",
    ),
    Step(
        "policies",
        "Policies",
        "Train a policy in the calibrated twin under domain randomization and evaluate it.",
        (Need("a twin (Twin page), ideally calibrated (Calibrate page)", kind="twin"),),
        "python main.py train …",
    ),
    Step(
        "deploy",
        "Deploy",
        "Shadow-run a policy in the twin, then run it on the connected robot inside the "
        "safety envelope, and record what happened for the next fit.",
        (
            Need("a trained policy (Policies page)", kind="policy"),
            Need("a connected robot (Devices panel)", device="robot"),
        ),
        "python main.py deploy …",
    ),
)


def step(key: str) -> Step:
    """The step called `key` ("scan", "twin", "calibrate", "policies", "deploy")."""
    for s in STEPS:
        if s.key == key:
            return s
    raise KeyError(f"no workflow step '{key}' (one of {', '.join(s.key for s in STEPS)})")


def needs_met(
    s: Step, project: Project | None, connected: frozenset[str] = frozenset()
) -> list[tuple[Need, bool]]:
    """Each need of step `s` with whether the open project / connected devices satisfy it."""
    out: list[tuple[Need, bool]] = []
    for n in s.needs:
        if n.kind is not None:
            ok = project is not None and project.latest(n.kind) is not None
        elif n.device is not None:
            ok = n.device in connected
        else:
            ok = True
        out.append((n, ok))
    return out
