"""The project folder's own files (docs/ARCHITECTURE.md §6): the snapshot (`twinbench.json`,
the manifest), the journal (`twinbench.journal`, one CRC-checked JSON line per artifact added
since the snapshot) and the lock (`.twinbench.lock`, the flock target). How each is written,
read and checked; the store (`store.Project`) decides when.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import stat
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resources.project.artifact import (
    ID_RE,
    KINDS,
    MAX_JSON_DEPTH,
    Artifact,
    artifacts_from_json,
)
from resources.project.files import (
    TMP_PREFIX,
    ProjectError,
    open_plain,
    read_bounded,
    remove_dead_tmp,
)

log = logging.getLogger(__name__)

MANIFEST = "twinbench.json"
JOURNAL = "twinbench.journal"
LOCK = ".twinbench.lock"  # flock target: one manifest writer at a time (never data)
FORMAT = "twinbench-project"
JOURNAL_FORMAT = "twinbench-journal"
FORMAT_VERSION = 2  # 2: snapshot + journal; 1: snapshot only (still opens)


class ReplaceableManifest(ProjectError):
    """The snapshot is missing or not JSON: a writer replaces it with what it knows."""


# -- journal lines: "<crc32 of json, 8 hex> <json>\n" ---------------------------------------
def journal_line(obj: Mapping[str, Any]) -> bytes:
    payload = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("ascii")
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def checked_payload(line: bytes) -> bytes | None:
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


def parse_payload(payload: bytes, path: Path, where: int) -> Any:
    try:
        return json.loads(payload)
    except RecursionError:
        raise ProjectError(
            f"{path}: line at byte {where} nests deeper than the {MAX_JSON_DEPTH}-level limit"
        ) from None
    except ValueError as exc:
        raise ProjectError(f"{path}: corrupt journal line at byte {where} ({exc})") from None


def line_payload(line: bytes, path: Path, where: int) -> Any:
    """The JSON of a journal line, or None for a torn or damaged line."""
    payload = checked_payload(line)
    return None if payload is None else parse_payload(payload, path, where)


def journal_header_id(fd: int, path: Path) -> str | None:
    head = os.pread(fd, 512, 0)
    line, nl, _ = head.partition(b"\n")
    if not nl:
        return None
    obj = line_payload(line, path, 0)
    if isinstance(obj, dict) and obj.get("format") == JOURNAL_FORMAT:
        jid = obj.get("id")
        return jid if isinstance(jid, str) else None
    return None


@dataclass
class JournalRead:
    jid: str | None  # header id (only when read from the start)
    entries: list[Artifact]
    end: int  # offset after the last complete line (where the next read starts)
    lines: int  # complete lines read (header included)


def read_journal(fd: int, path: Path, start: int) -> JournalRead:
    """Parse journal lines from byte `start`; torn or damaged lines are skipped, a valid line
    that is not a valid artifact is refused (naming the file and the line's offset)."""
    data = read_bounded(fd, path, "journal", start)
    pieces = data.split(b"\n")
    tail = pieces.pop()  # b"" when the data ends with a newline; else an unfinished line
    out = JournalRead(None, [], start + len(data) - len(tail), len(pieces))
    good: list[tuple[int, bytes]] = []  # (offset, payload) of the lines whose CRC matches
    pos = start
    for line in [*pieces, tail]:
        where = pos
        pos += len(line) + 1
        payload = checked_payload(line)
        if payload is None:
            if line and where < out.end:
                log.debug("%s: skipped a torn line at byte %d (a killed writer)", path, where)
            continue
        if where == 0:
            obj = parse_payload(payload, path, where)
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
            out.entries = artifacts_from_json(objs, owned=True)
            return out
    except (ValueError, RecursionError):
        pass
    for where, payload in good:
        try:
            out.entries.append(Artifact.from_json(parse_payload(payload, path, where)))
        except ValueError as exc:
            raise ProjectError(f"{path}: corrupt journal line at byte {where}: {exc}") from None
    return out


def read_manifest(root: Path) -> tuple[dict[str, Any], tuple[int, int, int] | None]:
    """The snapshot, checked (format, version, required keys, size, nesting)."""
    mpath = root / MANIFEST
    fd = open_plain(mpath, os.O_RDONLY, "manifest")
    if fd is None:
        raise ReplaceableManifest(f"{root}: not a Twinbench project (no {MANIFEST})")
    try:
        st = os.fstat(fd)
        data = read_bounded(fd, mpath, "manifest")
    finally:
        os.close(fd)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ProjectError(
            f"{mpath}: manifest nests deeper than the {MAX_JSON_DEPTH}-level limit"
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReplaceableManifest(f"{mpath}: corrupt manifest ({exc})") from exc
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


def snapshot_text(meta: Mapping[str, Any], arts: list[Artifact]) -> str:
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
def flock(root: Path, exclusive: bool) -> Iterator[None]:
    """Hold the project's lock (an flock on LOCK): exclusive for a writer, shared for a reader
    (a reader of a project that was never written here, without a lock file, reads as is)."""
    path = root / LOCK
    flags = os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY
    fd = open_plain(path, flags, "lock file", unreadable_ok=not exclusive)
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


def remove_orphans(root: Path, listed: Mapping[str, set[str]], listing_complete: bool) -> int:
    """Remove what killed writers left in `root` (caller holds the exclusive lock): temp
    folders whose writer is gone, artifact folders renamed into place but never recorded
    (only when `listing_complete`: every recorded id of each kind is in `listed`), snapshot
    temp files. Returns how many."""
    removed = 0
    for kind, folder in KINDS.items():
        base = root / folder
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
                    removed += remove_dead_tmp(path)
                elif (
                    is_dir
                    and listing_complete
                    and name not in listed[kind]
                    and ID_RE.fullmatch(name)
                ):
                    shutil.rmtree(path)  # renamed into place, never recorded
                    removed += 1
            except FileNotFoundError:
                continue
    with os.scandir(root) as it:
        temps = [e.path for e in it if e.name.startswith(f".{MANIFEST}.")]
    for path in temps:  # atomic.write_text's temp files of a killed compaction
        if path.endswith(".tmp"):
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                pass
    return removed
