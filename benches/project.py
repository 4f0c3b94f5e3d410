"""The project store: speed at 1k/10k artifacts, containment, and kill -9 safety.

- `artifacts`, `save_ms`, `open_ms`, `create_*`, `roundtrip_ok`: 1,000 artifacts (quick: 100)
  made through the public API with lineage, saved and reopened.
- `add_ms_at_0/1k/10k`: median cost of one `new_artifact` (a 20 kB file and a marker, both
  fsynced) with that many artifacts present; `open_ms_at_1k/10k`: median of 7
  `Project.open` (`open_cpu_ms_at_10k`: the CPU time, for a loaded machine). At 10k the
  journal is first filled to just short of its compaction (the slowest open; quick: 50
  lines, `journal_lines_at_10k_open`). The 1k/10k projects are prepared once as version-1
  snapshots (the older format, which must still open); `upgrade_ms_at_10k` is the first
  write, which rewrites it as version 2, and `save_ms_at_10k` a full snapshot rewrite (what
  a journal compaction costs, once per `JOURNAL_COMPACT_LINES` adds).
- `symlink_escapes`: attempts to make the store write or read outside the project through a
  symlinked kind folder, lock file, journal, manifest or temp folder, or to make its orphan
  clean-up delete through a symlink; how many succeeded (`symlink_escaped` names them).
- `bounded_parse_ok`: a 100,000-deep manifest, a 65 MiB one and a deep journal line are each
  refused with a ProjectError naming the file (never a RecursionError or a read).
- `kill9_*`: a forked writer adds artifacts as fast as it can (compacting every few lines in
  half of the runs) and is SIGKILLed at a random moment, 100 times (quick: 20). After each
  kill the project must open with every listed artifact complete (`kill9_ok`), and after the
  clean-up a writer does on opening no orphan may be left (`orphans_after_kill9`;
  `orphans_before_cleanup` shows the kills did leave some).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resources.project import JOURNAL, KINDS, LOCK, MANIFEST, Project, ProjectError, store
from resources.project.files import TMP_PREFIX
from resources.project.journal import FORMAT

DESCRIPTION = "project store: add/open cost at 1k and 10k artifacts, containment, kill -9 safety"

_PAYLOAD = b"x" * 20000
_MARK = "complete"


def _add(proj: Project, i: int, kind: str = "trajectory") -> None:
    with proj.new_artifact(kind, settings={"i": i}, summary=f"bench {i}") as folder:
        (folder / "data.bin").write_bytes(_PAYLOAD)
        (folder / _MARK).write_text(str(i))  # written last: the artifact is complete


def _complete(proj: Project) -> bool:
    for art in proj.artifacts():
        folder = proj.path_of(art.id)
        if not (folder / _MARK).is_file():
            return False
        if (folder / "data.bin").is_file() and (folder / "data.bin").stat().st_size != 20000:
            return False
    return True


def _orphans(proj: Project) -> int:
    """Temp folders, unrecorded artifact folders and snapshot temp files in the project."""
    listed = {(a.kind, a.id) for a in proj.artifacts()}
    n = 0
    for kind, folder in KINDS.items():
        base = proj.root / folder
        if base.is_symlink() or not base.is_dir():
            continue
        for e in os.scandir(base):
            if e.name.startswith(TMP_PREFIX):
                n += 1
            elif e.is_dir(follow_symlinks=False) and (kind, e.name) not in listed:
                n += 1
    n += sum(
        1 for e in os.scandir(proj.root) if e.name.startswith(f".{MANIFEST}.") and ".tmp" in e.name
    )
    return n


def _ms(f: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1000


def _roundtrip(tmp: Path, n: int) -> dict[str, Any]:
    root = tmp / "roundtrip"
    proj = Project.create(root)
    t0 = time.perf_counter()
    prev: str | None = None
    for i in range(n):
        kind = ("scan", "twin", "trajectory", "fit")[i % 4]
        with proj.new_artifact(
            kind, inputs=[prev] if prev else [], settings={"i": i}, summary=f"bench {i}"
        ) as folder:
            (folder / "data.txt").write_text(str(i))
        prev = proj.artifacts()[-1].id
    create_ms = (time.perf_counter() - t0) * 1000
    save_ms = _ms(proj.save)
    t0 = time.perf_counter()
    reopened = Project.open(root)
    open_ms = (time.perf_counter() - t0) * 1000
    ok = [a.id for a in reopened.artifacts()] == [a.id for a in proj.artifacts()]
    return {
        "artifacts": n,
        "save_ms": round(save_ms, 2),
        "open_ms": round(open_ms, 2),
        "create_all_ms": round(create_ms, 1),
        "create_ms_per_artifact": round(create_ms / n, 3),
        "roundtrip_ok": ok and len(reopened.artifacts()) == n,
    }


def _prepare(root: Path, n: int) -> None:
    """A version-1 project (snapshot only, the older format) with n complete artifacts."""
    Project.create(root)
    (root / JOURNAL).unlink()  # version 1 had no journal
    arts = []
    base = root / "trajectories"
    base.mkdir()
    t = time.time() - n
    for i in range(n):
        aid = f"trajectory-prep-{i:06d}"
        (base / aid).mkdir()
        (base / aid / _MARK).write_text(str(i))
        arts.append(
            {
                "kind": "trajectory",
                "id": aid,
                "created": t + i,
                "inputs": [f"trajectory-prep-{i - 1:06d}"] if i else [],
                "settings": {"i": i, "rate_hz": 100.0},
                "summary": f"prepared {i}",
                "parent": None,
            }
        )
    manifest = {
        "format": FORMAT,
        "format_version": 1,
        "name": root.name,
        "created": t,
        "settings": {},
        "artifacts": arts,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2))


def _scale(tmp: Path, n: int, adds: int, fill_journal: bool) -> dict[str, float]:
    root = tmp / f"scale{n}"
    if n:
        _prepare(root, n)
        proj = Project.open(root)
    else:
        proj = Project.create(root)
    upgrade = _ms(lambda: _add(proj, -1))  # version 1 -> 2 (a full snapshot) or first add
    times = [_ms(lambda i=i: _add(proj, i)) for i in range(adds)]  # type: ignore[misc]
    if fill_journal:  # open's worst case: a journal just short of its compaction
        i = adds
        while len((root / JOURNAL).read_bytes().splitlines()) < store.JOURNAL_COMPACT_LINES:
            _add(proj, i)
            i += 1
    lines = len((root / JOURNAL).read_bytes().splitlines())
    opens, cpu = [], []
    for _ in range(7):
        c0 = time.process_time()
        opens.append(_ms(lambda: Project.open(root)))
        cpu.append((time.process_time() - c0) * 1000)
    save = _ms(proj.save)
    return {
        "add_ms": statistics.median(times),
        "add_ms_p95": sorted(times)[int(0.95 * (len(times) - 1))],
        "open_ms": statistics.median(opens),
        "open_cpu_ms": statistics.median(cpu),
        "journal_lines": lines,
        "upgrade_ms": upgrade,
        "save_ms": save,
    }


def _escape_attempts(tmp: Path) -> dict[str, bool]:
    """Each attempt in a fresh project; True when the store wrote/read/deleted outside."""
    results: dict[str, bool] = {}
    for fn in ESCAPES:
        name = fn.__name__
        root, out = tmp / f"esc-{name}" / "proj", tmp / f"esc-{name}" / "outside"
        out.mkdir(parents=True)
        Project.create(root)
        try:
            results[name] = fn(root, out)
        except ProjectError:
            results[name] = False  # refused: contained
    return results


# The escape attempts, each given a fresh project `root` (in tmp/esc-NAME/) and a folder
# `out` outside it; True when the store wrote, read or deleted outside. Their names are the
# report's keys.
def kind_folder_write(root: Path, out: Path) -> bool:
    (root / "trajectories").symlink_to(out, target_is_directory=True)
    try:
        _add(Project.open(root), 0)
    except ProjectError:
        pass
    return any(out.iterdir())


def kind_folder_read(root: Path, out: Path) -> bool:
    proj = Project.open(root)
    with proj.new_artifact("twin", artifact_id="twin-1") as f:
        (f / "twin.json").write_text("{}")
    (out / "twin-1").mkdir()
    (out / "twin-1" / "twin.json").write_text('{"outside": true}')
    os.rename(root / "twins", root.parents[1] / "moved-twins")  # tmp/moved-twins
    (root / "twins").symlink_to(out, target_is_directory=True)
    try:
        path = Project.open(root).path_of("twin-1")
    except ProjectError:
        return False
    return "outside" in (path / "twin.json").read_text()


def lock_write(root: Path, out: Path) -> bool:
    (root / LOCK).unlink()
    (root / LOCK).symlink_to(out / "created-by-lock")
    try:
        _add(Project.open(root), 0)
    except ProjectError:
        pass
    return (out / "created-by-lock").exists()


def journal_write(root: Path, out: Path) -> bool:
    (out / "journal").write_bytes(b"")
    if (root / JOURNAL).exists():
        (root / JOURNAL).unlink()
    (root / JOURNAL).symlink_to(out / "journal")
    try:
        _add(Project.open(root), 0)
    except ProjectError:
        pass
    return (out / "journal").stat().st_size > 0 or len(list(out.iterdir())) > 1


def manifest_read(root: Path, out: Path) -> bool:
    text = (root / MANIFEST).read_text().replace(root.name, "OUTSIDE-NAME")
    (out / "m.json").write_text(text)
    (root / MANIFEST).unlink()
    (root / MANIFEST).symlink_to(out / "m.json")
    try:
        return Project.open(root).name == "OUTSIDE-NAME"
    except ProjectError:
        return False


def tmp_folder_write(root: Path, out: Path) -> bool:
    (root / "scans").mkdir()
    (out / "keep.txt").write_text("keep")
    for name in (".tmp-scan-x", f".tmp-{os.getpid()}-scan-x"):
        (root / "scans" / name).symlink_to(out, target_is_directory=True)
    proj = Project.open(root)
    try:
        with proj.new_artifact("scan", artifact_id="scan-x") as f:
            (f / "scan.json").write_text("{}")
    except (ProjectError, OSError):
        pass
    return {p.name for p in out.iterdir()} != {"keep.txt"}


def clean_tmp_link(root: Path, out: Path) -> bool:
    (root / "scans").mkdir()
    (out / "keep.txt").write_text("keep")
    (root / "scans" / ".tmp-999999999-scan-gone").symlink_to(out, target_is_directory=True)
    proj = Project.open(root)
    getattr(proj, "clean_orphans", lambda: None)()
    _add(proj, 0, "scan")
    return not (out / "keep.txt").exists()


def clean_unrecorded_link(root: Path, out: Path) -> bool:
    (root / "scans").mkdir()
    (out / "keep").mkdir()
    (out / "keep" / "keep.txt").write_text("keep")
    (root / "scans" / "scan-unrecorded").symlink_to(out / "keep", target_is_directory=True)
    proj = Project.open(root)
    getattr(proj, "clean_orphans", lambda: None)()
    _add(proj, 0, "scan")
    return not (out / "keep" / "keep.txt").exists()


ESCAPES: tuple[Callable[[Path, Path], bool], ...] = (
    kind_folder_write,
    kind_folder_read,
    lock_write,
    journal_write,
    manifest_read,
    tmp_folder_write,
    clean_tmp_link,
    clean_unrecorded_link,
)


def _bounded_parse(tmp: Path) -> bool:
    """Deep and huge manifests, and a deep journal line, are ProjectErrors naming the file."""
    ok = True
    cases: list[tuple[str, Callable[[Path], None], str]] = [
        ("deep", _deep_manifest, MANIFEST),
        ("huge", lambda r: _sparse(r / MANIFEST, 65 * 2**20), MANIFEST),
        ("deep-line", _deep_journal_line, JOURNAL),
    ]
    for name, spoil, fname in cases:
        root = tmp / f"bounded-{name}"
        Project.create(root)
        spoil(root)
        try:
            Project.open(root)
            ok = False
        except ProjectError as exc:
            ok = ok and str(root / fname) in str(exc)
        except RecursionError:
            ok = False
    return ok


def _deep_manifest(root: Path) -> None:
    (root / MANIFEST).write_text("[" * 100000 + "]" * 100000)


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)


def _deep_journal_line(root: Path) -> None:
    payload = ("[" * 100000 + "]" * 100000).encode()
    with open(root / JOURNAL, "ab") as fh:
        fh.write(b"%08x %s\n" % (zlib.crc32(payload), payload))


def _writer(root: Path, compact_lines: int, ready: int) -> None:
    """The forked child: add artifacts forever (until SIGKILL)."""
    store.JOURNAL_COMPACT_LINES = compact_lines
    proj = Project.open(root)
    i = 0
    while True:
        _add(proj, i)
        if i == 0:
            os.write(ready, b"1")
        i += 1


def _kill9(tmp: Path, runs: int) -> dict[str, int]:
    root = tmp / "kill9"
    Project.create(root)
    rng = random.Random(9)
    ok = orphans_before = orphans_after = 0
    for run in range(runs):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns
            try:
                os.close(r)
                _writer(root, 5 if run % 2 else 1000, w)
            finally:
                os._exit(1)
        os.close(w)
        os.read(r, 1)  # at least one artifact committed (the first write cleaned up)
        os.close(r)
        time.sleep(rng.uniform(0.0, 0.04))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            proj = Project.open(root)
            good = _complete(proj)
        except ProjectError:
            continue
        orphans_before += _orphans(proj)
        getattr(proj, "clean_orphans", lambda: None)()  # what a writer does on opening
        orphans_after += _orphans(proj)
        ok += good
    final = Project.open(root)
    return {
        "kill9_runs": runs,
        "kill9_ok": ok,
        "kill9_artifacts": len(final.artifacts()),
        "orphans_before_cleanup": orphans_before,
        "orphans_after_kill9": orphans_after,
    }


def run(quick: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        out.update(_roundtrip(tmp, 100 if quick else 1000))
        adds = 50 if quick else 200
        at0 = _scale(tmp, 0, adds, False)
        at1k = _scale(tmp, 1000, adds, False)
        at10k = _scale(tmp, 10000, adds, not quick)
        out["add_ms_at_0"] = round(at0["add_ms"], 3)
        out["add_ms_at_1k"] = round(at1k["add_ms"], 3)
        out["add_ms_at_10k"] = round(at10k["add_ms"], 3)
        out["add_ms_p95_at_10k"] = round(at10k["add_ms_p95"], 3)
        out["open_ms_at_1k"] = round(at1k["open_ms"], 2)
        out["open_ms_at_10k"] = round(at10k["open_ms"], 2)
        out["open_cpu_ms_at_10k"] = round(at10k["open_cpu_ms"], 2)
        out["journal_lines_at_10k_open"] = int(at10k["journal_lines"])
        out["upgrade_ms_at_10k"] = round(at10k["upgrade_ms"], 1)
        out["save_ms_at_10k"] = round(at10k["save_ms"], 1)
        escapes = _escape_attempts(tmp)
        out["symlink_attempts"] = len(escapes)
        out["symlink_escapes"] = sum(escapes.values())
        out["symlink_escaped"] = ",".join(k for k, v in escapes.items() if v)
        out["bounded_parse_ok"] = _bounded_parse(tmp)
        out.update(_kill9(tmp, 20 if quick else 100))
    return out
