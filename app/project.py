"""The open project folder (docs/ARCHITECTURE.md §6): manifest, artifact registry, lineage.

```
myproject/
  twinbench.json        snapshot: format version, settings, artifacts and their inputs
  twinbench.journal     artifacts added since the snapshot, one self-checking line each
  .twinbench.lock       flock target: one writer at a time (never holds data)
  scans/<id>/ twins/<id>/ trajectories/<id>/ fits/<id>/ policies/<id>/ runs/<id>/
```

Artifacts are immutable once written. A new artifact is written into a hidden temp folder
(`<kind folder>/.tmp-<pid>-<id>`, flocked by its writer while it is filled), its files are
fsynced, and then, under the project lock, it is renamed into place and recorded by appending
one line to the journal (`<crc32> <json>\\n`, O_APPEND + fsync): the complete line is the
commit point. Adding an artifact therefore costs the same with 10 or 10,000 artifacts. When
the journal grows past `JOURNAL_COMPACT_LINES` lines it is compacted (under the lock: write
the snapshot atomically, then empty the journal; a crash between the two replays lines that
are already in the snapshot, which is harmless). Opening reads the snapshot and replays the
journal, skipping torn lines (a killed writer), so killing any process at any moment leaves
a project that opens with everything committed before.

Several processes may add artifacts to one project at once (the app, a training subprocess, a
CLI command): appends are serialized by the lock and never rewrite another's line, so none of
their artifacts is lost; each writer picks up the others' lines as it commits (`refresh` does
the same on demand, reading only what is new).

Contained: kind folders, the lock, the journal, the snapshot and temp folders are used only
as real files and folders inside the project (symlinks are refused with a ProjectError naming
the path, never followed); snapshot and journal are bounded in size (`MAX_FILE_BYTES`) and
nesting (`MAX_JSON_DEPTH`). Orphans of killed writers (temp folders whose writer is gone,
artifact folders renamed but never recorded, snapshot temp files) are removed, under the
lock, the first time a `Project` writes (`clean_orphans` does it on demand); a read-only open
never deletes anything.

Format version 2 adds the journal; version-1 projects (a snapshot with every artifact) open
unchanged and are rewritten as version 2 on their first write.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import logging
import math
import operator
import os
import re
import shutil
import stat
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from resources import atomic
from resources.errors import TwinbenchError

log = logging.getLogger(__name__)

MANIFEST = "twinbench.json"
JOURNAL = "twinbench.journal"
LOCK = ".twinbench.lock"  # flock target: one manifest writer at a time (never data)
FORMAT = "twinbench-project"
JOURNAL_FORMAT = "twinbench-journal"
FORMAT_VERSION = 2  # 2: snapshot + journal; 1: snapshot only (still opens)
KINDS: dict[str, str] = {
    "scan": "scans",
    "twin": "twins",
    "trajectory": "trajectories",
    "fit": "fits",
    "policy": "policies",
    "run": "runs",
}
TMP_PREFIX = ".tmp-"  # temp artifact folders: <kind folder>/.tmp-<pid>-<id>
MAX_FILE_BYTES = 64 * 1024 * 1024  # snapshot or journal larger than this: refused
MAX_JSON_DEPTH = 64  # nesting of a snapshot; settings may nest MAX_JSON_DEPTH - 4 levels
JOURNAL_COMPACT_LINES = 1000  # compact the journal into the snapshot beyond this many lines
JOURNAL_COMPACT_BYTES = 8 * 1024 * 1024  # ... or this many bytes
_SETTINGS_DEPTH = MAX_JSON_DEPTH - 4  # manifest > artifacts > artifact > settings
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class ProjectError(TwinbenchError):
    """A project folder cannot be created, opened or written (message names the path)."""


class _ReplaceableManifest(ProjectError):
    """The snapshot is missing or not JSON: a writer replaces it with what it knows."""


def _nests_deeper(obj: Any, limit: int) -> bool:
    """Whether `obj` (parsed JSON) nests more than `limit` containers deep (iterative)."""
    todo: list[tuple[Any, int]] = [(obj, 1)]
    while todo:
        o, depth = todo.pop()
        if depth > limit:
            return True
        values = o.values() if isinstance(o, dict) else o
        todo.extend((v, depth + 1) for v in values if isinstance(v, (dict, list)))
    return False


def _settings_ok(settings: Mapping[str, Any]) -> bool:
    """Settings nest at most _SETTINGS_DEPTH levels (fast path: a flat object)."""
    for v in settings.values():
        if type(v) is dict or type(v) is list or isinstance(v, (dict, list)):
            return not _nests_deeper(dict(settings), _SETTINGS_DEPTH)
    return True


@dataclass(frozen=True)
class Artifact:
    """One immutable artifact: kind, id, creation time, inputs (lineage), settings."""

    kind: str
    id: str
    created: float
    inputs: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    parent: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "created": self.created,
            "inputs": list(self.inputs),
            "settings": dict(self.settings),
            "summary": self.summary,
            "parent": self.parent,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Artifact:
        """An artifact entry of a manifest; raises ValueError naming the field that is wrong.
        (Written for speed: a 10,000-artifact project checks every entry on open.)"""
        if type(d) is not dict and not isinstance(d, Mapping):
            raise ValueError(f"artifact entry must be an object, not {type(d).__name__}")
        try:
            kind = d["kind"]
            aid = d["id"]
            created = d["created"]
        except KeyError as exc:
            raise ValueError(f"artifact entry is missing '{exc.args[0]}'") from None
        if type(kind) is not str or kind not in KINDS:
            raise ValueError(f"artifact {aid!r}: unknown kind {kind!r}")
        if type(aid) is not str or _ID_MATCH(aid) is None:
            raise ValueError(
                f"artifact id {aid!r} is not a plain name (letters, digits, '.', '_', '-'; "
                "no path separators or '..')"
            )
        # bool is neither float nor int by type; NaN and inf fail the range test
        if (type(created) is not float and type(created) is not int) or not (
            0 <= created <= MAX_TIMESTAMP
        ):
            raise ValueError(
                f"artifact {aid}: 'created' must be a time in seconds since 1970, got {created!r}"
            )
        inputs = d.get("inputs", ())
        if type(inputs) is not list and type(inputs) is not tuple:
            raise ValueError(f"artifact {aid}: 'inputs' must be a list of artifact ids")
        for ref in inputs:
            if type(ref) is not str:
                raise ValueError(f"artifact {aid}: 'inputs' must be a list of artifact ids")
        parent = d.get("parent")
        if parent is not None and type(parent) is not str:
            raise ValueError(f"artifact {aid}: 'parent' must be an artifact id or null")
        settings = d.get("settings", {})
        if type(settings) is not dict and not isinstance(settings, Mapping):
            raise ValueError(f"artifact {aid}: 'settings' must be an object")
        if not _settings_ok(settings):
            raise ValueError(
                f"artifact {aid}: 'settings' nest deeper than {_SETTINGS_DEPTH} levels "
                f"(a manifest may nest at most {MAX_JSON_DEPTH})"
            )
        summary = d.get("summary", "")
        if type(summary) is not str:
            raise ValueError(f"artifact {aid}: 'summary' must be text")
        art = object.__new__(cls)  # checked above: skip the frozen __init__'s setattr calls
        art.__dict__.update(
            kind=kind,
            id=aid,
            created=float(created),
            inputs=tuple(inputs),
            settings=dict(settings),
            summary=summary,
            parent=parent,
        )
        return art


_NONE_TYPE = type(None)


def _ids_ok(joined: str, count: int) -> bool:
    """Every id of `joined` (one per line, each ending in a newline) is a plain name."""
    return joined.count("\n") == count and _IDS_RE.fullmatch(joined) is not None


def _artifacts_from_json(entries: list[Any], owned: bool = False) -> list[Artifact]:
    """`Artifact.from_json` of every entry, checked column by column at C speed (a snapshot
    of 10,000 artifacts opens in tens of ms); anything unusual goes through `from_json`
    entry by entry, which raises the ValueError naming the field. `owned`: the entries were
    just parsed and nobody else holds them, so a checked entry becomes the artifact's own
    attribute dict (no copy: at 10,000 artifacts the copies and the garbage collection they
    set off cost more than the parse)."""
    if not entries:
        return []
    try:
        if set(map(type, entries)) - {dict}:
            raise TypeError
        # every field of every entry, as columns (a missing one: entry by entry, below)
        kinds, ids, created, inputs, settings, summaries, parents = zip(
            *map(_COLUMNS, entries), strict=True
        )
        ok = (
            set(kinds) <= _KIND_SET
            and set(map(type, ids)) <= {str}
            and _ids_ok("\n".join(ids) + "\n", len(ids))
            and set(map(type, created)) <= {float, int}
            and math.isfinite(sum(created))  # no NaN or inf (else entry by entry)
            and 0 <= min(created)
            and max(created) <= MAX_TIMESTAMP
            and set(map(type, inputs)) <= {list, tuple}
            and set(map(type, chain.from_iterable(inputs))) <= {str}
            and set(map(type, settings)) <= {dict}
            and set(map(type, summaries)) <= {str}
            and set(map(type, parents)) <= {str, _NONE_TYPE}
        )
        if ok:
            inner = set(map(type, chain.from_iterable(map(dict.values, settings))))
            if inner & {dict, list}:
                ok = all(map(_settings_ok, settings))
    except (KeyError, TypeError, OverflowError):
        ok = False  # (a missing field, an unhashable kind, a huge int, ...): entry by entry
    if not ok:
        return [Artifact.from_json(d) for d in entries]
    out: list[Artifact] = []
    new, append = object.__new__, out.append
    if owned and all(map(operator.eq, repeat(_FIELDS), map(dict.keys, entries))):
        setattr_ = object.__setattr__  # (the frozen dataclass's own setattr refuses)
        for d, ins in zip(entries, map(tuple, inputs), strict=True):
            d["inputs"] = ins
            if type(d["created"]) is not float:
                d["created"] = float(d["created"])
            art = new(Artifact)
            setattr_(art, "__dict__", d)
            append(art)
        return out
    for kind, aid, when, ins, sets, summary, parent in zip(
        kinds,
        ids,
        map(float, created),
        map(tuple, inputs),
        map(dict, settings),
        summaries,
        parents,
        strict=True,
    ):
        art = new(Artifact)  # checked above: skip the frozen __init__'s setattr calls
        art.__dict__.update(
            kind=kind,
            id=aid,
            created=when,
            inputs=ins,
            settings=sets,
            summary=summary,
            parent=parent,
        )
        append(art)
    return out


def _new_id(kind: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{stamp}-{uuid.uuid4().hex[:6]}"


_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
_ID_MATCH = _ID_RE.fullmatch
_IDS_RE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,120}\n)*")  # ids, one per line
_KIND_SET = frozenset(KINDS)
_FIELDS = frozenset(("kind", "id", "created", "inputs", "settings", "summary", "parent"))
_COLUMNS = operator.itemgetter("kind", "id", "created", "inputs", "settings", "summary", "parent")
MAX_TIMESTAMP = 253402300799.0  # 9999-12-31T23:59:59Z: later "times" are corrupt data
# Terminal control sequences (CSI/OSC/other ESC) and C0/C1 control characters: text from a
# manifest is data, never instructions to the terminal that prints it.
_CONTROL_RE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def printable(text: str) -> str:
    """`text` without terminal escape sequences or control characters (safe to print)."""
    return _CONTROL_RE.sub("", text)


# -- contained file access -------------------------------------------------------------------
def _open_plain(
    path: Path, flags: int, what: str, mode: int = 0o644, unreadable_ok: bool = False
) -> int | None:
    """os.open that never follows a symlink and accepts only a plain file (no FIFO, device or
    folder); None when the file does not exist (and `flags` does not create it), or, with
    `unreadable_ok`, when this user may not open it."""
    try:
        fd = os.open(path, flags | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK, mode)
    except FileNotFoundError:
        return None
    except PermissionError:
        if unreadable_ok:
            return None
        raise ProjectError(
            f"{path}: cannot open the project's {what} (permission denied)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProjectError(
                f"{path}: the project's {what} is a symbolic link; refusing to follow it "
                "(it must be a plain file inside the project)"
            ) from None
        raise ProjectError(f"{path}: cannot open the project's {what} ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ProjectError(f"{path}: the project's {what} is not a plain file")
    return fd


def _read_bounded(fd: int, path: Path, what: str, start: int = 0) -> bytes:
    """Bytes of `fd` from `start` to its end, refusing a file over MAX_FILE_BYTES."""
    size = os.fstat(fd).st_size
    if size > MAX_FILE_BYTES:
        raise ProjectError(
            f"{path}: {what} is {size / 2**20:.1f} MiB, over the "
            f"{MAX_FILE_BYTES // 2**20} MiB limit (refusing to read it)"
        )
    chunks: list[bytes] = []
    pos = start
    while True:
        chunk = os.pread(fd, max(size - pos, 0) + 65536, pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
        if pos > MAX_FILE_BYTES:
            raise ProjectError(
                f"{path}: {what} is over the {MAX_FILE_BYTES // 2**20} MiB limit "
                "(refusing to read it)"
            )
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """fsync every plain file and folder under `folder` (symlinks are not followed)."""
    todo = [str(folder)]
    while todo:
        d = todo.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    try:
                        fd = os.open(e.path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
                    except OSError:
                        continue
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
        _fsync_dir(Path(d))


def _stat_id(path: Path) -> tuple[int, int, int] | None:
    """Identity of a file version (inode, size, mtime): changes when it is replaced."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _remove(path: str) -> None:
    """Remove a folder tree, or just the link/file when `path` is not a real folder."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _remove_dead_tmp(path: str) -> bool:
    """Remove a temp artifact folder whose writer is gone (its flock is free); True if removed.
    A symlink or file of that name is unlinked (never followed)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return True
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its writer is still filling it
        shutil.rmtree(path)
        return True
    finally:
        os.close(fd)


# -- journal lines: "<crc32 of json, 8 hex> <json>\n" ---------------------------------------
def _journal_line(obj: Mapping[str, Any]) -> bytes:
    payload = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("ascii")
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def _checked_payload(line: bytes) -> bytes | None:
    """The JSON bytes of a journal line whose CRC matches, or None (a torn or damaged line:
    a killed writer)."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    try:
        crc = int(line[:8], 16)
    except ValueError:
        return None
    payload = line[9:]
    return payload if zlib.crc32(payload) == crc else None


def _parse_payload(payload: bytes, path: Path, where: int) -> Any:
    try:
        return json.loads(payload)
    except RecursionError:
        raise ProjectError(
            f"{path}: line at byte {where} nests deeper than the {MAX_JSON_DEPTH}-level limit"
        ) from None
    except ValueError as exc:
        raise ProjectError(f"{path}: corrupt journal line at byte {where} ({exc})") from None


def _line_payload(line: bytes, path: Path, where: int) -> Any:
    """The JSON of a journal line, or None for a torn or damaged line."""
    payload = _checked_payload(line)
    return None if payload is None else _parse_payload(payload, path, where)


def _journal_header_id(fd: int, path: Path) -> str | None:
    head = os.pread(fd, 512, 0)
    line, nl, _ = head.partition(b"\n")
    if not nl:
        return None
    obj = _line_payload(line, path, 0)
    if isinstance(obj, dict) and obj.get("format") == JOURNAL_FORMAT:
        jid = obj.get("id")
        return jid if isinstance(jid, str) else None
    return None


@dataclass
class _JournalRead:
    jid: str | None  # header id (only when read from the start)
    entries: list[Artifact]
    end: int  # offset after the last complete line (where the next read starts)
    lines: int  # complete lines read (header included)


def _read_journal(fd: int, path: Path, start: int) -> _JournalRead:
    """Parse journal lines from byte `start`; torn or damaged lines are skipped, a valid line
    that is not a valid artifact is refused (naming the file and the line's offset)."""
    data = _read_bounded(fd, path, "journal", start)
    pieces = data.split(b"\n")
    tail = pieces.pop()  # b"" when the data ends with a newline; else an unfinished line
    out = _JournalRead(None, [], start + len(data) - len(tail), len(pieces))
    good: list[tuple[int, bytes]] = []  # (offset, payload) of the lines whose CRC matches
    pos = start
    for line in [*pieces, tail]:
        where = pos
        pos += len(line) + 1
        payload = _checked_payload(line)
        if payload is None:
            if line and where < out.end:
                log.debug("%s: skipped a torn line at byte %d (a killed writer)", path, where)
            continue
        if where == 0:
            obj = _parse_payload(payload, path, where)
            if isinstance(obj, dict) and obj.get("format") == JOURNAL_FORMAT:
                jid = obj.get("id")
                out.jid = jid if isinstance(jid, str) else None
                continue
        good.append((where, payload))
    if not good:
        return out
    try:  # all lines in one parse (C speed); any trouble: line by line, naming the line
        objs = json.loads(b"[" + b",".join(p for _, p in good) + b"]")
        if len(objs) == len(good):
            out.entries = _artifacts_from_json(objs, owned=True)
            return out
    except (ValueError, RecursionError):
        pass
    for where, payload in good:
        try:
            out.entries.append(Artifact.from_json(_parse_payload(payload, path, where)))
        except ValueError as exc:
            raise ProjectError(f"{path}: corrupt journal line at byte {where}: {exc}") from None
    return out


def _read_manifest(root: Path) -> tuple[dict[str, Any], tuple[int, int, int] | None]:
    """The snapshot, checked (format, version, required keys, size, nesting)."""
    mpath = root / MANIFEST
    fd = _open_plain(mpath, os.O_RDONLY, "manifest")
    if fd is None:
        raise _ReplaceableManifest(f"{root}: not a Twinbench project (no {MANIFEST})")
    try:
        st = os.fstat(fd)
        data = _read_bounded(fd, mpath, "manifest")
    finally:
        os.close(fd)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ProjectError(
            f"{mpath}: manifest nests deeper than the {MAX_JSON_DEPTH}-level limit"
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _ReplaceableManifest(f"{mpath}: corrupt manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ProjectError(f"{mpath}: not a Twinbench manifest (format field missing)")
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ProjectError(f"{mpath}: manifest has no integer format_version")
    if version < 1:
        raise ProjectError(f"{mpath}: format_version {version} is not a valid version (>= 1)")
    if version > FORMAT_VERSION:
        raise ProjectError(
            f"{mpath}: project format version {version} is newer than this Twinbench "
            f"supports ({FORMAT_VERSION}); update Twinbench to open it"
        )
    missing = [k for k in ("name", "created", "artifacts") if k not in manifest]
    if missing:
        raise ProjectError(f"{mpath}: manifest is missing {', '.join(missing)}")
    return manifest, (st.st_ino, st.st_size, st.st_mtime_ns)


def _snapshot_text(meta: Mapping[str, Any], arts: list[Artifact]) -> str:
    """The snapshot as JSON: header fields indented, one artifact per line (readable, and
    fast to write and parse at thousands of artifacts). NaN is refused: it is not JSON."""
    lines = ["{"]
    for key, value in meta.items():
        text = json.dumps(value, indent=2, allow_nan=False).replace("\n", "\n  ")
        lines.append(f"  {json.dumps(key)}: {text},")
    if arts:
        body = ",\n    ".join(json.dumps(a.to_json(), allow_nan=False) for a in arts)
        lines.append(f'  "artifacts": [\n    {body}\n  ]')
    else:
        lines.append('  "artifacts": []')
    lines.append("}\n")
    return "\n".join(lines)


@contextmanager
def _flock(root: Path, exclusive: bool) -> Iterator[None]:
    """Hold the project's lock (an flock on LOCK): exclusive for a writer, shared for a reader
    (a reader of a project that was never written here, without a lock file, reads as is)."""
    path = root / LOCK
    flags = os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY
    fd = _open_plain(path, flags, "lock file", unreadable_ok=not exclusive)
    if fd is None:
        if exclusive:
            raise ProjectError(f"{path}: cannot lock the project (the lock file vanished)")
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


class Project:
    """An open project folder. Create with `Project.create`, open with `Project.open`."""

    def __init__(self, root: Path, manifest: dict[str, Any], *, _owned: bool = False) -> None:
        self.root = Path(root)
        name = manifest.get("name", self.root.name)
        if not isinstance(name, str):
            raise ValueError(f"'name' must be text, not {type(name).__name__}")
        self.name: str = name
        created = manifest.get("created", time.time())
        if (type(created) is not float and type(created) is not int) or not (
            0 <= created <= MAX_TIMESTAMP
        ):
            raise ValueError(f"'created' must be a time in seconds since 1970, got {created!r}")
        self.created: float = float(created)
        settings = manifest.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("'settings' must be an object")
        if _nests_deeper(settings, _SETTINGS_DEPTH):
            raise ValueError(f"'settings' nest deeper than {_SETTINGS_DEPTH} levels")
        self.settings: dict[str, Any] = dict(settings)
        arts = manifest.get("artifacts", [])
        if not isinstance(arts, list):
            raise ValueError("'artifacts' must be a list")
        listed = _artifacts_from_json(arts, owned=_owned)
        self._artifacts: dict[str, Artifact] = {a.id: a for a in listed}
        if len(self._artifacts) != len(listed):
            seen: set[str] = set()
            for a in listed:
                if a.id in seen:
                    raise ValueError(f"artifact id {a.id} appears twice")
                seen.add(a.id)
        self._order: list[Artifact] | None = None  # artifacts() cache, by creation time
        self._mutex = threading.RLock()  # this object's state, between threads
        # what this object has read of the folder (see _sync_locked)
        self._snap_id: tuple[int, int, int] | None = None  # snapshot file version read
        self._disk_version = FORMAT_VERSION  # its format_version
        self._disk_meta: dict[str, Any] | None = None  # its name/created/settings
        self._listing_complete = False  # the snapshot was read (or written) whole
        self._jid: str | None = None  # journal generation (header id) read
        self._joff = 0  # journal bytes read (start of the first unread line)
        self._jlines = 0  # journal lines (header included)
        self._cleaned = False  # orphans removed by this object (on its first write)

    # -- create / open / save ------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, name: str | None = None) -> Project:
        """Create a new empty project; refuses a folder that is not empty."""
        root = Path(root)
        if root.exists() and not root.is_dir():
            raise ProjectError(f"{root}: exists and is not a folder")
        if root.exists() and any(root.iterdir()):
            if (root / MANIFEST).exists():
                raise ProjectError(f"{root}: already a Twinbench project (open it instead)")
            raise ProjectError(f"{root}: folder is not empty; choose a new or empty folder")
        root.mkdir(parents=True, exist_ok=True)
        proj = cls(root, {"name": name or root.name, "created": time.time()})
        proj.save()
        return proj

    @classmethod
    def open(cls, root: Path) -> Project:
        """Open an existing project. Never writes anything; raises ProjectError on problems."""
        root = Path(root)
        if not root.is_dir():
            raise ProjectError(f"{root}: no such folder")
        with _flock(root, exclusive=False):
            return cls._load(root)

    @classmethod
    def _load(cls, root: Path, replace_bad: bool = False) -> Project:
        """Read snapshot + journal (caller holds the lock, or there is none). With
        `replace_bad`, a missing or unparsable snapshot reads as empty (a writer replaces it).
        The cyclic garbage collector is paused meanwhile: tens of thousands of new, acyclic
        objects would set it off again and again (half the time of a 10,000-artifact open)."""
        paused = gc.isenabled()
        gc.disable()
        try:
            return cls._load_unpaused(root, replace_bad)
        finally:
            if paused:
                gc.enable()

    @classmethod
    def _load_unpaused(cls, root: Path, replace_bad: bool) -> Project:
        mpath = root / MANIFEST
        try:
            manifest, snap_id = _read_manifest(root)
        except _ReplaceableManifest:
            if not replace_bad:
                raise
            proj = cls(root, {})
        else:
            try:
                proj = cls(root, manifest, _owned=True)
            except (KeyError, TypeError, ValueError) as exc:
                raise ProjectError(f"{mpath}: corrupt manifest: {exc}") from exc
            proj._snap_id = snap_id
            proj._disk_version = manifest["format_version"]
            proj._disk_meta = {
                "name": proj.name,
                "created": proj.created,
                "settings": dict(proj.settings),
            }
            proj._listing_complete = True
        jpath = root / JOURNAL
        fd = _open_plain(jpath, os.O_RDONLY, "journal")
        if fd is not None:
            try:
                read = _read_journal(fd, jpath, 0)
            finally:
                os.close(fd)
            for art in read.entries:
                proj._add(art)
            proj._jid, proj._joff, proj._jlines = read.jid, read.end, read.lines
        return proj

    def to_manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "created": self.created,
            "settings": self.settings,
            "artifacts": [a.to_json() for a in self.artifacts()],
        }

    def _add(self, art: Artifact) -> None:
        if art.id not in self._artifacts:
            self._artifacts[art.id] = art
            self._order = None

    def _sync_locked(self, replace_bad: bool = False) -> None:
        """Catch up with the folder (caller holds the lock): only the new journal lines when
        the snapshot and the journal generation are the ones read before, else all of it.
        Artifacts are immutable and never removed, so a union loses nothing."""
        if self._snap_id is not None and _stat_id(self.root / MANIFEST) == self._snap_id:
            jpath = self.root / JOURNAL
            fd = _open_plain(jpath, os.O_RDONLY, "journal")
            if fd is None and self._jid is None:
                return  # a version-1 snapshot, unchanged, and no journal
            if fd is not None:
                try:
                    size = os.fstat(fd).st_size
                    if (
                        self._jid is not None
                        and size >= self._joff
                        and _journal_header_id(fd, jpath) == self._jid
                    ):
                        read = _read_journal(fd, jpath, self._joff)
                        for art in read.entries:
                            self._add(art)
                        self._joff = read.end
                        self._jlines += read.lines
                        return
                finally:
                    os.close(fd)
        disk = Project._load(self.root, replace_bad=replace_bad)
        for art in disk._artifacts.values():
            self._add(art)
        self._snap_id, self._disk_version = disk._snap_id, disk._disk_version
        self._disk_meta, self._listing_complete = disk._disk_meta, disk._listing_complete
        self._jid, self._joff, self._jlines = disk._jid, disk._joff, disk._jlines

    def _compact_locked(self, meta: Mapping[str, Any]) -> None:
        """Write every artifact into the snapshot (atomically), then start an empty journal
        (a crash between the two replays lines already in the snapshot: harmless)."""
        full = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
        atomic.write_text(self.root / MANIFEST, _snapshot_text(full, self.artifacts()))
        self._snap_id = _stat_id(self.root / MANIFEST)
        self._disk_version = FORMAT_VERSION
        self._disk_meta = dict(meta)
        self._listing_complete = True
        jid = uuid.uuid4().hex
        header = _journal_line({"format": JOURNAL_FORMAT, "id": jid})
        jpath = self.root / JOURNAL
        fd = _open_plain(jpath, os.O_RDWR | os.O_CREAT, "journal")
        if fd is None:
            raise ProjectError(f"{jpath}: cannot create the journal")
        try:
            os.ftruncate(fd, 0)
            _write_all(fd, header)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(self.root)
        self._jid, self._joff, self._jlines = jid, len(header), 1

    def _append_locked(self, art: Artifact) -> None:
        """Record `art` by appending one self-checking line to the journal (the commit)."""
        line = _journal_line(art.to_json())
        jpath = self.root / JOURNAL
        fd = _open_plain(jpath, os.O_RDWR | os.O_APPEND, "journal")
        if fd is None:
            raise ProjectError(f"{jpath}: the journal vanished")
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # end a torn line of a killed writer: it stays skipped
            _write_all(fd, line)
            self._add(art)  # the complete line is the commit point
            try:
                os.fsync(fd)
            except OSError as exc:
                log.error("%s: fsync failed (%s); artifact %s recorded", jpath, exc, art.id)
        finally:
            os.close(fd)
        self._joff = size + len(line)
        self._jlines += 1

    def _meta(self) -> dict[str, Any]:
        return {"name": self.name, "created": self.created, "settings": self.settings}

    def save(self) -> None:
        """Write the snapshot (this object's name and settings, every artifact recorded by
        anyone) atomically and start an empty journal. Never drops another's artifact."""
        if _nests_deeper(self.settings, _SETTINGS_DEPTH):
            raise ProjectError(
                f"{self.root / MANIFEST}: project settings nest deeper than {_SETTINGS_DEPTH} "
                "levels"
            )
        try:
            with self._mutex, _flock(self.root, exclusive=True):
                self._sync_locked(replace_bad=True)
                self._clean_once_locked()
                self._compact_locked(self._meta())
        except ProjectError:
            raise
        except (OSError, ValueError, TypeError) as exc:
            raise ProjectError(f"{self.root / MANIFEST}: cannot write manifest ({exc})") from exc

    def refresh(self) -> None:
        """Pick up artifacts other processes recorded since this project was opened (reads
        only the journal lines that are new). A folder that cannot be read is logged."""
        try:
            with self._mutex, _flock(self.root, exclusive=False):
                self._sync_locked()
        except ProjectError as exc:
            log.warning("%s: cannot refresh the project (%s)", self.root, exc)

    # -- orphans -------------------------------------------------------------------------
    def clean_orphans(self) -> int:
        """Remove what killed writers left: temp folders whose writer is gone, artifact
        folders renamed into place but never recorded, snapshot temp files. Returns how many.
        Safe while others write (under the lock; a live writer's temp folder is flocked)."""
        with self._mutex, _flock(self.root, exclusive=True):
            self._sync_locked()
            self._cleaned = True
            return self._clean_locked()

    def _clean_once_locked(self) -> None:
        if not self._cleaned:
            self._cleaned = True
            try:
                n = self._clean_locked()
            except OSError as exc:
                log.warning("%s: could not remove orphans (%s)", self.root, exc)
                return
            if n:
                log.info("%s: removed %d orphan(s) left by killed writers", self.root, n)

    def _clean_locked(self) -> int:
        listed: dict[str, set[str]] = {kind: set() for kind in KINDS}
        for art in self._artifacts.values():
            listed[art.kind].add(art.id)
        removed = 0
        for kind, folder in KINDS.items():
            base = self.root / folder
            try:
                if not stat.S_ISDIR(os.lstat(base).st_mode):
                    continue  # a symlinked kind folder is never walked (writes refuse it)
            except FileNotFoundError:
                continue
            with os.scandir(base) as it:
                entries = [(e.name, e.path, e.is_dir(follow_symlinks=False)) for e in it]
            for name, path, is_dir in entries:
                try:
                    if name.startswith(TMP_PREFIX):
                        removed += _remove_dead_tmp(path)
                    elif (
                        is_dir
                        and self._listing_complete
                        and name not in listed[kind]
                        and _ID_RE.fullmatch(name)
                    ):
                        shutil.rmtree(path)  # renamed into place, never recorded
                        removed += 1
                except FileNotFoundError:
                    continue
        with os.scandir(self.root) as it:
            temps = [e.path for e in it if e.name.startswith(f".{MANIFEST}.")]
        for path in temps:  # atomic.write_text's temp files of a killed compaction
            if path.endswith(".tmp"):
                try:
                    os.unlink(path)
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed

    # -- artifacts -----------------------------------------------------------------------
    def artifacts(self, kind: str | None = None) -> list[Artifact]:
        """Artifacts in creation order, optionally of one kind."""
        with self._mutex:
            if self._order is None:
                self._order = sorted(self._artifacts.values(), key=lambda a: a.created)
            order = self._order
        if kind is None:
            return list(order)
        return [a for a in order if a.kind == kind]

    def artifact(self, artifact_id: str) -> Artifact:
        try:
            return self._artifacts[artifact_id]
        except (KeyError, TypeError):
            raise ProjectError(f"{self.root}: no artifact '{artifact_id}'") from None

    def latest(self, kind: str) -> Artifact | None:
        arts = self.artifacts(kind)
        return arts[-1] if arts else None

    def _kind_dir(self, kind: str, create: bool = False) -> Path:
        """The kind's folder, which must be a real folder inside the project (a symlink
        would send reads and writes elsewhere: refused, naming it)."""
        path = self.root / KINDS[kind]
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                return path
            try:
                os.mkdir(path)
            except FileExistsError:
                pass
            except OSError as exc:
                raise ProjectError(f"{path}: cannot create the folder ({exc.strerror})") from exc
            st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise ProjectError(
                f"{path}: is a symbolic link (to {os.readlink(path)}); artifact folders must "
                "be real folders inside the project"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise ProjectError(f"{path}: is not a folder")
        return path

    def path_of(self, artifact_id: str) -> Path:
        """The artifact's folder; always inside the project (ids are checked on open, the
        kind folder must be a real folder, and the resolved path is checked again so a
        symlink cannot lead outside)."""
        art = self.artifact(artifact_id)
        base = self._kind_dir(art.kind)
        path = base / art.id
        if path.resolve().parent != base.resolve():
            raise ProjectError(f"{self.root}: artifact '{art.id}' points outside the project")
        return path

    def lineage(self, artifact_id: str) -> list[Artifact]:
        """All ancestors of an artifact (inputs and parents, transitively), nearest first."""
        seen: dict[str, Artifact] = {}
        todo = [artifact_id]
        while todo:
            art = self.artifact(todo.pop(0))
            for ref in (*art.inputs, *([art.parent] if art.parent else [])):
                if ref not in seen and ref in self._artifacts:
                    seen[ref] = self._artifacts[ref]
                    todo.append(ref)
        return list(seen.values())

    @contextmanager
    def new_artifact(
        self,
        kind: str,
        inputs: tuple[str, ...] | list[str] = (),
        settings: Mapping[str, Any] | None = None,
        summary: str = "",
        parent: str | None = None,
        artifact_id: str | None = None,
    ) -> Iterator[Path]:
        """Write a new artifact: yields a temp folder to fill; on clean exit it is committed.

        ```
        with project.new_artifact("trajectory", inputs=[twin_id]) as folder:
            traj.save(folder)
        ```
        An exception inside the block discards the temp folder and records nothing.
        """
        if kind not in KINDS:
            raise ProjectError(f"unknown artifact kind '{kind}' (one of {', '.join(KINDS)})")
        refs = (*inputs, *([parent] if parent else []))
        if any(ref not in self._artifacts for ref in refs):
            self.refresh()  # made by another process since we opened the project?
        for ref in refs:
            if ref not in self._artifacts:
                raise ProjectError(f"{self.root}: input artifact '{ref}' does not exist")
        aid = artifact_id or _new_id(kind)
        if not isinstance(aid, str) or not _ID_RE.fullmatch(aid):
            raise ProjectError(f"artifact id '{aid}' must be letters, digits, '.', '_' or '-'")
        if aid in self._artifacts:
            raise ProjectError(
                f"{self.root}: artifact '{aid}' already exists (artifacts are immutable)"
            )
        if not isinstance(summary, str):
            raise ProjectError(f"artifact '{aid}': summary must be text")
        sets = dict(settings or {})
        try:
            json.dumps(sets, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ProjectError(f"artifact '{aid}': settings are not plain JSON ({exc})") from None
        if not _settings_ok(sets):
            raise ProjectError(f"artifact '{aid}': settings nest deeper than {_SETTINGS_DEPTH}")
        with self._mutex, _flock(self.root, exclusive=True):
            if not self._cleaned:
                self._sync_locked(replace_bad=True)
                self._clean_once_locked()
            base = self._kind_dir(kind, create=True)
            tmp = base / f"{TMP_PREFIX}{os.getpid()}-{aid}"
            try:
                if os.path.lexists(tmp) and not _remove_dead_tmp(str(tmp)):
                    raise ProjectError(f"{self.root}: artifact '{aid}' is being written already")
                os.mkdir(tmp)
                # held while it is filled: a cleaner never removes a live writer's folder
                tmp_fd = os.open(tmp, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
            except OSError as exc:
                raise ProjectError(f"{tmp}: cannot make the temp folder ({exc})") from exc
            try:
                fcntl.flock(tmp_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(tmp_fd)
                raise
        try:
            try:
                yield tmp
                try:
                    self._commit(kind, aid, tmp, (tuple(inputs), sets, summary, parent))
                except (OSError, ValueError) as exc:
                    raise ProjectError(
                        f"{self.root}: cannot record artifact '{aid}' ({exc})"
                    ) from exc
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            os.close(tmp_fd)

    def _commit(
        self,
        kind: str,
        aid: str,
        tmp: Path,
        fields: tuple[tuple[str, ...], dict[str, Any], str, str | None],
    ) -> None:
        """Move a filled temp folder into place and record it (under the lock)."""
        inputs, sets, summary, parent = fields
        _fsync_tree(tmp)
        with self._mutex, _flock(self.root, exclusive=True):
            self._sync_locked(replace_bad=True)
            if aid in self._artifacts:
                raise ProjectError(
                    f"{self.root}: artifact '{aid}' already exists (artifacts are immutable)"
                )
            base = self._kind_dir(kind, create=True)
            final = base / aid
            if os.path.lexists(final):  # renamed by a killed writer but never recorded
                _remove(str(final))
            os.rename(tmp, final)
            _fsync_dir(base)
            art = Artifact(kind, aid, time.time(), inputs, sets, summary, parent)
            try:
                if (
                    self._snap_id is None
                    or self._jid is None
                    or self._disk_version < FORMAT_VERSION
                ):
                    self._add(art)  # no snapshot or no usable journal (new, version 1, ...)
                    self._compact_locked(self._disk_meta or self._meta())
                else:
                    self._append_locked(art)
            except BaseException:
                if self._artifacts.pop(aid, None) is not None:
                    self._order = None
                shutil.rmtree(final, ignore_errors=True)
                raise
            if self._jlines > JOURNAL_COMPACT_LINES or self._joff > JOURNAL_COMPACT_BYTES:
                try:
                    self._compact_locked(self._disk_meta or self._meta())
                except (OSError, ValueError, ProjectError) as exc:
                    log.warning("%s: journal compaction failed (%s)", self.root, exc)

    def describe(self) -> str:
        """Human summary: artifacts and their lineage, one per line."""
        lines = [f"Project '{self.name}' at {self.root}", f"  {len(self._artifacts)} artifacts"]
        for a in self.artifacts():
            ins = f" <- {', '.join(a.inputs)}" if a.inputs else ""
            par = f" (edit of {a.parent})" if a.parent else ""
            try:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.created))
            except (OverflowError, OSError, ValueError):
                when = f"created={a.created!r}"
            summ = f"  {a.summary}" if a.summary else ""
            lines.append(f"  [{a.kind:<10}] {a.id}  {when}{ins}{par}{summ.replace(chr(10), ' ')}")
        return "\n".join(printable(line.replace("\n", " ")) for line in lines)
