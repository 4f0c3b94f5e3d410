"""The project store: contained (symlinks refused), bounded parsing, orphans of killed writers
cleaned, kill -9 safe, concurrent writers lose nothing, adds cost the same at 2k artifacts."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import resources.project.store as store
from resources.project import (
    FORMAT_VERSION,
    JOURNAL,
    KINDS,
    LOCK,
    MANIFEST,
    Artifact,
    Project,
    ProjectError,
)
from resources.project.artifact import artifacts_from_json
from resources.project.files import MAX_FILE_BYTES

MARK = "complete"


def _add(proj: Project, i: int, kind: str = "trajectory", **kw: object) -> str:
    with proj.new_artifact(kind, settings={"i": i}, **kw) as folder:  # type: ignore[arg-type]
        (folder / "data.bin").write_bytes(b"x" * 2000)
        (folder / MARK).write_text(str(i))  # written last: the artifact is complete
    return folder.name.split("-", 2)[2]  # the temp folder was .tmp-<pid>-<id>


def _listing(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def _all_complete(proj: Project) -> bool:
    return all((proj.path_of(a.id) / MARK).is_file() for a in proj.artifacts())


@contextmanager
def _forked(child: Callable[[int], None]) -> Iterator[tuple[int, int]]:
    """Run child(write_fd) in a forked process; yields (pid, read_fd); kills it at the end."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            child(w)
        finally:
            os._exit(0)
    os.close(w)
    try:
        yield pid, r
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass  # already reaped


# -- containment ---------------------------------------------------------------------------
def test_symlinked_kind_folder_is_refused_and_nothing_written_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "p", tmp_path / "outside"
    outside.mkdir()
    proj = Project.create(root)
    (root / "trajectories").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ProjectError, match="symbolic link") as err:
        _add(proj, 0)
    assert str(root / "trajectories") in str(err.value)
    assert list(outside.iterdir()) == []
    assert Project.open(root).artifacts() == []


def test_symlinked_kind_folder_is_not_read_through(tmp_path: Path) -> None:
    """`twin info` reads path_of: a `twins` symlink to a look-alike folder is refused."""
    root, outside = tmp_path / "p", tmp_path / "outside"
    proj = Project.create(root)
    with proj.new_artifact("twin", artifact_id="twin-1") as f:
        (f / "twin.json").write_text("{}")
    (outside / "twin-1").mkdir(parents=True)
    (outside / "twin-1" / "twin.json").write_text('{"outside": true}')
    os.rename(root / "twins", tmp_path / "moved")
    (root / "twins").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ProjectError, match="symbolic link"):
        Project.open(root).path_of("twin-1")


def test_symlinked_lock_file_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    root, outside = tmp_path / "p", tmp_path / "outside"
    outside.mkdir()
    proj = Project.create(root)
    (root / LOCK).unlink()
    (root / LOCK).symlink_to(outside / "made-by-lock")  # dangling: open(O_CREAT) would make it
    with pytest.raises(ProjectError, match="lock file is a symbolic link") as err:
        _add(proj, 0)
    assert str(root / LOCK) in str(err.value)
    with pytest.raises(ProjectError, match="symbolic link"):
        proj.save()
    with pytest.raises(ProjectError, match="symbolic link"):
        Project.open(root)
    assert list(outside.iterdir()) == []


def test_symlinked_journal_and_manifest_are_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "p", tmp_path / "outside"
    outside.mkdir()
    (outside / "journal").write_bytes(b"")
    proj = Project.create(root)
    (root / JOURNAL).unlink()
    (root / JOURNAL).symlink_to(outside / "journal")
    with pytest.raises(ProjectError, match="journal is a symbolic link"):
        _add(proj, 0)
    assert (outside / "journal").read_bytes() == b""
    (root / JOURNAL).unlink()
    (outside / "m.json").write_text((root / MANIFEST).read_text())
    (root / MANIFEST).unlink()
    (root / MANIFEST).symlink_to(outside / "m.json")
    with pytest.raises(ProjectError, match="manifest is a symbolic link"):
        Project.open(root)


def test_planted_temp_folder_symlink_is_not_written_through(tmp_path: Path) -> None:
    root, outside = tmp_path / "p", tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    proj = Project.create(root)
    (root / "scans").mkdir()
    for name in (".tmp-scan-x", f".tmp-{os.getpid()}-scan-x"):
        (root / "scans" / name).symlink_to(outside, target_is_directory=True)
    with proj.new_artifact("scan", artifact_id="scan-x") as f:
        assert not f.is_symlink()
        (f / "scan.json").write_text("{}")
    assert _listing(outside) == {"keep.txt"}
    assert (Project.open(root).path_of("scan-x") / "scan.json").is_file()


def test_orphan_clean_up_never_deletes_through_a_symlink(tmp_path: Path) -> None:
    root, outside = tmp_path / "p", tmp_path / "outside"
    (outside / "a").mkdir(parents=True)
    (outside / "a" / "keep.txt").write_text("keep")
    (outside / "b").mkdir()
    (outside / "b" / "keep.txt").write_text("keep")
    proj = Project.create(root)
    (root / "scans").mkdir()
    (root / "scans" / ".tmp-999999999-scan-gone").symlink_to(outside / "a")
    (root / "scans" / "scan-unrecorded").symlink_to(outside / "b")
    Project.open(root).clean_orphans()
    _add(proj, 0, "scan")
    assert _listing(outside) == {"a", "a/keep.txt", "b", "b/keep.txt"}


# -- bounded parsing -------------------------------------------------------------------------
def test_deeply_nested_manifest_is_a_project_error_naming_the_file(tmp_path: Path) -> None:
    root = tmp_path / "p"
    Project.create(root)
    (root / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ProjectError, match="deeper than the 64-level limit") as err:
        Project.open(root)
    assert str(root / MANIFEST) in str(err.value)
    # deep settings that Python could parse (and would later fail to print or save)
    deep: object = 1
    for _ in range(200):
        deep = {"d": deep}
    _v1_manifest(root, [_entry(0, settings={"x": deep})])
    with pytest.raises(ProjectError, match="nest deeper than") as err:
        Project.open(root)
    assert str(root / MANIFEST) in str(err.value)


def test_oversized_manifest_is_refused_before_reading(tmp_path: Path) -> None:
    root = tmp_path / "p"
    Project.create(root)
    with open(root / MANIFEST, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: costs nothing to make
    t0 = time.perf_counter()
    with pytest.raises(ProjectError, match="MiB limit") as err:
        Project.open(root)
    assert time.perf_counter() - t0 < 1.0
    assert str(root / MANIFEST) in str(err.value)


def test_deep_journal_line_is_a_project_error_naming_the_journal(tmp_path: Path) -> None:
    root = tmp_path / "p"
    Project.create(root)
    payload = ("[" * 100_000 + "]" * 100_000).encode()
    with open(root / JOURNAL, "ab") as fh:
        fh.write(b"%08x %s\n" % (zlib.crc32(payload), payload))
    with pytest.raises(ProjectError, match="64-level limit") as err:
        Project.open(root)
    assert str(root / JOURNAL) in str(err.value)


# -- journal ---------------------------------------------------------------------------------
def test_torn_journal_lines_are_ignored_and_later_adds_kept(tmp_path: Path) -> None:
    root = tmp_path / "p"
    proj = Project.create(root)
    first = [_add(proj, i) for i in range(2)]
    line = (root / JOURNAL).read_bytes().splitlines(keepends=True)[-1]
    with open(root / JOURNAL, "ab") as fh:
        fh.write(line[: len(line) // 2])  # a writer killed mid-line (no newline)
    again = Project.open(root)
    assert [a.id for a in again.artifacts()] == first
    _add(again, 2)  # appends after the torn bytes: its line must not be glued to them
    with open(root / JOURNAL, "ab") as fh:
        fh.write(b"0badc0de {not a line}\n")  # a damaged line in the middle
    _add(again, 3)
    reopened = Project.open(root)
    assert len(reopened.artifacts()) == 4 and _all_complete(reopened)
    proj.refresh()  # the first object reads only what is new, past the torn bytes
    assert [a.id for a in proj.artifacts()] == [a.id for a in reopened.artifacts()]


def test_version_1_project_opens_and_is_upgraded_on_first_write(tmp_path: Path) -> None:
    root = tmp_path / "p"
    Project.create(root)
    (root / JOURNAL).unlink()
    _v1_manifest(root, [_entry(i) for i in range(3)])
    proj = Project.open(root)
    assert [a.summary for a in proj.artifacts()] == ["e0", "e1", "e2"]
    _add(proj, 3)
    data = json.loads((root / MANIFEST).read_text())
    assert data["format_version"] == FORMAT_VERSION == 2
    assert len(data["artifacts"]) == 4  # the upgrade wrote everything into the snapshot
    assert len(Project.open(root).artifacts()) == 4


def test_compaction_keeps_everything_and_others_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "JOURNAL_COMPACT_LINES", 5)
    root = tmp_path / "p"
    Project.create(root)
    a, b = Project.open(root), Project.open(root)
    b.settings["lab_scene"] = "panda_table"
    b.save()
    ids = [_add(a if i % 2 else b, i) for i in range(23)]
    assert len((root / JOURNAL).read_bytes().splitlines()) <= 6
    reopened = Project.open(root)
    assert {x.id for x in reopened.artifacts()} == set(ids)
    assert reopened.settings == {"lab_scene": "panda_table"}  # a's compactions kept it
    a.refresh()
    assert {x.id for x in a.artifacts()} == set(ids)


def test_bulk_check_matches_entry_by_entry(tmp_path: Path) -> None:
    good: list[Any] = [_entry(i) for i in range(3)]
    bad_cases: list[dict[str, object]] = [
        {"id": "a\nb"},
        {"id": "twin-1\n"},
        {"created": float("nan")},
        {"created": float("inf")},
        {"created": True},
        {"created": 10**400},
        {"kind": ["twin"]},
        {"inputs": [1]},
        {"parent": 3},
        {"summary": None},
        {"settings": {"a": json.loads("[" * 70 + "]" * 70)}},
    ]
    for change in bad_cases:
        entries: list[Any] = [*good, {**_entry(9), **change}]
        with pytest.raises(ValueError) as one:
            Artifact.from_json(entries[-1])
        with pytest.raises(ValueError) as bulk:
            artifacts_from_json(entries)
        assert str(bulk.value) == str(one.value)
    assert artifacts_from_json(good) == [Artifact.from_json(e) for e in good]


# -- orphans, kill -9, concurrency -----------------------------------------------------------
def _hang_in_new_artifact(root: Path) -> Callable[[int], None]:
    def child(w: int) -> None:
        proj = Project.open(root)
        with proj.new_artifact("trajectory") as f:
            (f / "half.bin").write_bytes(b"x" * 100)
            os.write(w, b"1")
            time.sleep(60)

    return child


def test_orphans_of_killed_writers_are_cleaned_by_the_next_writer(tmp_path: Path) -> None:
    root = tmp_path / "p"
    Project.create(root)
    with _forked(_hang_in_new_artifact(root)) as (_, r):
        assert os.read(r, 1) == b"1"  # killed below, mid-artifact
    (root / "trajectories" / "trajectory-renamed-never-recorded").mkdir()
    (root / f".{MANIFEST}.abc123.tmp").write_text("{")  # a killed compaction's temp file
    before = _listing(root)
    assert any(".tmp-" in p for p in before)
    proj = Project.open(root)  # read-only: deletes nothing
    assert _listing(root) == before
    with _forked(_hang_in_new_artifact(root)) as (_, r):  # a live writer's folder is kept
        assert os.read(r, 1) == b"1"
        _add(proj, 0)  # the first write cleans up
        live = [p for p in os.listdir(root / "trajectories") if p.startswith(".tmp-")]
        assert len(live) == 1 and live[0].split("-")[1] != str(os.getpid())
    names = _listing(root / "trajectories")
    assert "trajectory-renamed-never-recorded" not in names
    assert not (root / f".{MANIFEST}.abc123.tmp").exists()
    assert proj.clean_orphans() == 1  # the second writer, killed by _forked
    assert {n for n in _listing(root / "trajectories") if "/" not in n} == {
        a.id for a in proj.artifacts()
    }


def _writer_forever(root: Path, compact_lines: int) -> Callable[[int], None]:
    def child(w: int) -> None:
        store.JOURNAL_COMPACT_LINES = compact_lines
        proj = Project.open(root)
        i = 0
        while True:
            _add(proj, i)
            if i == 0:
                os.write(w, b"1")
            i += 1

    return child


def test_writer_killed_at_random_moments_leaves_complete_project(tmp_path: Path) -> None:
    """SIGKILL a writer (half the time compacting every 3 lines) at random moments: the
    project opens with every listed artifact complete, and a writer's open cleans up."""
    root = tmp_path / "p"
    Project.create(root)
    rng = random.Random(7)
    count = 0
    for run in range(8):
        with _forked(_writer_forever(root, 3 if run % 2 else 1000)) as (_, r):
            assert os.read(r, 1) == b"1"
            time.sleep(rng.uniform(0.0, 0.03))
        proj = Project.open(root)
        assert len(proj.artifacts()) > count
        count = len(proj.artifacts())
        assert _all_complete(proj)
        proj.clean_orphans()
        leftovers = [p for p in _listing(root) if ".tmp" in p]
        assert leftovers == []
        for kind, folder in KINDS.items():
            if (root / folder).is_dir():
                assert {p.name for p in (root / folder).iterdir()} <= {
                    a.id for a in proj.artifacts(kind)
                }


def test_two_writers_compacting_concurrently_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "JOURNAL_COMPACT_LINES", 7)  # compactions amid appends
    root = tmp_path / "p"
    Project.create(root)

    def child(w: int) -> None:
        proj = Project.open(root)
        for i in range(30):
            _add(proj, 1000 + i, "run")
        os.write(w, b"1")

    with _forked(child) as (pid, r):
        mine = Project.open(root)
        for i in range(30):
            _add(mine, i)
        assert os.read(r, 1) == b"1"
        os.waitpid(pid, 0)
    reopened = Project.open(root)
    assert len(reopened.artifacts("run")) == 30 and len(reopened.artifacts("trajectory")) == 30
    assert sorted(a.settings["i"] for a in reopened.artifacts()) == sorted(
        [*range(30), *range(1000, 1030)]
    )
    mine.refresh()
    assert len(mine.artifacts()) == 60 and _all_complete(reopened)


# -- scale -----------------------------------------------------------------------------------
def test_add_cost_does_not_grow_with_the_project(tmp_path: Path) -> None:
    """One add with 2,000 artifacts present costs about what it costs in an empty project
    (measured interleaved, as a ratio of medians: a loaded machine slows both alike)."""
    small = Project.create(tmp_path / "small")
    big_root = tmp_path / "big"
    Project.create(big_root)
    _v1_manifest(big_root, [_entry(i) for i in range(2000)])
    big = Project.open(big_root)
    _add(big, -1)  # its first write (the version upgrade, a full snapshot) is not timed
    _add(small, -1)
    t_small: list[float] = []
    t_big: list[float] = []
    for i in range(25):
        for proj, out in ((small, t_small), (big, t_big)):
            t0 = time.perf_counter()
            _add(proj, i)
            out.append(time.perf_counter() - t0)
    ratio = statistics.median(t_big) / statistics.median(t_small)
    assert ratio < 3.0, f"add at 2k costs {ratio:.1f}x an add at 0"
    assert len(Project.open(big_root).artifacts()) == 2026


# -- helpers ---------------------------------------------------------------------------------
def _entry(i: int, **kw: object) -> dict[str, object]:
    return {
        "kind": "fit",
        "id": f"fit-{i:05d}",
        "created": 1.7e9 + i,
        "inputs": [],
        "settings": {"i": i},
        "summary": f"e{i}",
        "parent": None,
        **kw,
    }


def _v1_manifest(root: Path, entries: list[dict[str, object]]) -> None:
    (root / MANIFEST).write_text(
        json.dumps(
            {
                "format": "twinbench-project",
                "format_version": 1,
                "name": "p",
                "created": 1.7e9,
                "settings": {},
                "artifacts": entries,
            }
        )
    )
