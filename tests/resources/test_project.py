"""Project folder: round trip, lineage, immutability, atomicity and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resources.project import MANIFEST, Project, ProjectError

REPO = Path(__file__).resolve().parents[2]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_round_trip_with_lineage(tmp_path: Path) -> None:
    proj = Project.create(tmp_path / "p", name="bench cell")
    with proj.new_artifact("scan", settings={"voxel_m": 0.005}, summary="first scan") as f:
        (f / "scan.json").write_text("{}")
    scan = proj.latest("scan")
    assert scan is not None
    with proj.new_artifact("twin", inputs=[scan.id]) as f:
        (f / "twin.json").write_text("{}")
    twin = proj.latest("twin")
    assert twin is not None
    with proj.new_artifact("twin", inputs=[scan.id], parent=twin.id, summary="edited") as f:
        (f / "twin.json").write_text('{"edited": true}')
    edited = proj.latest("twin")
    assert edited is not None and edited.id != twin.id

    again = Project.open(tmp_path / "p")
    assert again.name == "bench cell"
    assert [a.id for a in again.artifacts()] == [scan.id, twin.id, edited.id]
    assert again.artifact(scan.id).settings == {"voxel_m": 0.005}
    assert {a.id for a in again.lineage(edited.id)} == {scan.id, twin.id}
    assert (again.path_of(edited.id) / "twin.json").read_text() == '{"edited": true}'
    assert "first scan" in again.describe()


def test_artifacts_are_immutable_and_inputs_must_exist(tmp_path: Path) -> None:
    proj = Project.create(tmp_path / "p")
    with proj.new_artifact("fit", artifact_id="fit-a") as f:
        (f / "fit.json").write_text("{}")
    with pytest.raises(ProjectError, match="already exists"):
        with proj.new_artifact("fit", artifact_id="fit-a"):
            pass
    with pytest.raises(ProjectError, match="does not exist"):
        with proj.new_artifact("fit", inputs=["nope"]):
            pass
    with pytest.raises(ProjectError, match="unknown artifact kind"):
        with proj.new_artifact("banana"):
            pass


def test_failed_artifact_leaves_no_trace(tmp_path: Path) -> None:
    proj = Project.create(tmp_path / "p")
    before = _snapshot(proj.root)
    with pytest.raises(RuntimeError):
        with proj.new_artifact("scan") as f:
            (f / "half.bin").write_bytes(b"x" * 100)
            raise RuntimeError("camera unplugged")
    assert _snapshot(proj.root) == before
    assert Project.open(proj.root).artifacts() == []


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "not a Twinbench project"),
        ("{ this is not json", "corrupt manifest"),
        ('{"format": "something-else", "format_version": 1}', "not a Twinbench manifest"),
        ('{"format": "twinbench-project", "format_version": 99}', "newer than this Twinbench"),
        (
            '{"format": "twinbench-project", "format_version": 1, "name": "p", "created": 1.0, '
            '"artifacts": [{"id": 1}]}',
            "corrupt manifest: artifact entry is missing 'kind'",
        ),
        ('{"format": "twinbench-project", "format_version": 1}', "missing name, created"),
        (
            '{"format": "twinbench-project", "format_version": -1, "name": "p", "created": 1.0, '
            '"artifacts": []}',
            "format_version -1 is not a valid version",
        ),
        (
            '{"format": "twinbench-project", "format_version": 1, "name": ["p"], "created": 1.0, '
            '"artifacts": []}',
            "'name' must be text",
        ),
    ],
)
def test_bad_projects_are_refused_and_untouched(
    tmp_path: Path, content: str | None, match: str
) -> None:
    root = tmp_path / "bad"
    root.mkdir()
    (root / "notes.txt").write_text("keep me")
    if content is not None:
        (root / MANIFEST).write_text(content)
    before = _snapshot(root)
    with pytest.raises(ProjectError, match=match) as err:
        Project.open(root)
    assert str(root) in str(err.value)
    assert _snapshot(root) == before


def test_create_refuses_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "data.csv").write_text("1,2")
    with pytest.raises(ProjectError, match="not empty"):
        Project.create(tmp_path / "x")


_WRITER = """
import sys, time
from resources.project import Project
proj = Project.open(sys.argv[1])
i = 0
while True:
    with proj.new_artifact("trajectory", settings={"i": i}) as f:
        (f / "data.bin").write_bytes(b"x" * 20000)
    i += 1
    print(i, flush=True)
"""


@pytest.mark.slow
def test_writer_killed_mid_save_leaves_openable_project(tmp_path: Path) -> None:
    """SIGKILL a process that is writing artifacts as fast as it can, several times."""
    root = tmp_path / "p"
    Project.create(root)
    committed = 0
    for delay in (0.3, 0.45, 0.6):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(root)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # at least one artifact written before the kill
        assert first.strip() == "1"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proj = Project.open(root)  # must open after every kill
        arts = proj.artifacts()
        assert len(arts) > committed
        committed = len(arts)
        for a in arts:  # everything in the manifest is complete on disk
            assert (proj.path_of(a.id) / "data.bin").stat().st_size == 20000
        json.loads((root / MANIFEST).read_text())


def _manifest_with(root: Path, **artifact: object) -> None:
    entry = {"kind": "twin", "id": "twin-1", "created": 1.7e9, **artifact}
    (root / MANIFEST).write_text(
        json.dumps(
            {
                "format": "twinbench-project",
                "format_version": 1,
                "name": "p",
                "created": 1.7e9,
                "artifacts": [entry],
            }
        )
    )


@pytest.mark.parametrize(
    "bad_id", ["../../outside_twin", "/etc", "twin/../../x", "..", "twin-1\n", "a\\b"]
)
def test_artifact_ids_cannot_leave_the_project(tmp_path: Path, bad_id: str) -> None:
    root = tmp_path / "proj"
    Project.create(root)
    (tmp_path / "outside_twin").mkdir()
    _manifest_with(root, id=bad_id)
    with pytest.raises(ProjectError, match="not a plain name") as err:
        Project.open(root)
    assert str(root / MANIFEST) in str(err.value)


def test_symlinked_artifact_folder_outside_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    Project.create(root)
    (tmp_path / "elsewhere").mkdir()
    (root / "twins").mkdir()
    (root / "twins" / "twin-1").symlink_to(tmp_path / "elsewhere")
    _manifest_with(root)
    proj = Project.open(root)
    with pytest.raises(ProjectError, match="outside the project"):
        proj.path_of("twin-1")


@pytest.mark.parametrize("created", [1e300, "nan", -5.0, True, None])
def test_odd_creation_times_are_refused_with_the_file(tmp_path: Path, created: object) -> None:
    root = tmp_path / "proj"
    Project.create(root)
    _manifest_with(root, created=created)
    with pytest.raises(ProjectError, match="'created' must be a time") as err:
        Project.open(root)
    assert str(root / MANIFEST) in str(err.value)


def test_project_info_never_prints_terminal_escapes(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    Project.create(root)
    _manifest_with(root, summary="fine\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m\rover\nline")
    proc = subprocess.run(
        [sys.executable, str(REPO / "main.py"), "project", "info", str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout
    assert "finered" in proc.stdout.replace(" ", "") and "over line" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_project_info_with_corrupt_time_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    Project.create(root)
    _manifest_with(root, created=1e300)
    proc = subprocess.run(
        [sys.executable, str(REPO / "main.py"), "project", "info", str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "created" in proc.stderr + proc.stdout


def test_two_processes_adding_artifacts_lose_none(tmp_path: Path) -> None:
    """The app and a training subprocess each hold the project open and add artifacts; each
    manifest write merges the other's, so every artifact stays recorded (none lost)."""
    import subprocess
    import sys
    import textwrap

    root = tmp_path / "p"
    app_side = Project.create(root)
    child = textwrap.dedent(
        f"""
        from pathlib import Path
        from resources.project import Project
        p = Project.open(Path({str(root)!r}))
        for i in range(20):
            with p.new_artifact("run", summary=f"child {{i}}") as f:
                (f / "x.txt").write_text(str(i))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=Path(__file__).parents[2])
    mine = []
    for i in range(20):
        with app_side.new_artifact("trajectory", summary=f"app {i}") as f:
            (f / "x.txt").write_text(str(i))
        mine.append(app_side.artifacts()[-1].id)
    assert proc.wait(timeout=120) == 0
    app_side.refresh()
    reopened = Project.open(root)
    summaries = sorted(a.summary for a in reopened.artifacts())
    assert summaries == sorted([f"app {i}" for i in range(20)] + [f"child {i}" for i in range(20)])
    assert {a.id for a in app_side.artifacts()} == {a.id for a in reopened.artifacts()}
    # an artifact made by the other process can be an input here without reopening
    child_id = next(a.id for a in reopened.artifacts("run"))
    fresh = Project.open(root)
    with fresh.new_artifact("trajectory"):
        pass
    with app_side.new_artifact("fit", inputs=[fresh.artifacts()[-1].id, child_id]):
        pass
    assert len(Project.open(root).artifacts()) == 42
