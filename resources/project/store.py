"""The project store (docs/ARCHITECTURE.md §6): `Project`, the open project folder, its
artifact registry and lineage; how it stays whole under crashes and concurrent writers is in
the package's docstring (`resources/project/__init__.py`).
"""

from __future__ import annotations

import fcntl
import gc
import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from resources import atomic
from resources.project.artifact import (
    ID_RE,
    KINDS,
    MAX_TIMESTAMP,
    SETTINGS_DEPTH,
    Artifact,
    artifacts_from_json,
    nests_deeper,
    new_id,
    printable,
    settings_ok,
)
from resources.project.files import (
    O_CLOEXEC,
    O_DIRECTORY,
    O_NOFOLLOW,
    TMP_PREFIX,
    ProjectError,
    fsync_dir,
    fsync_tree,
    open_plain,
    remove,
    remove_dead_tmp,
    stat_id,
    write_all,
)
from resources.project.journal import (
    FORMAT,
    FORMAT_VERSION,
    JOURNAL,
    JOURNAL_FORMAT,
    MANIFEST,
    ReplaceableManifest,
    flock,
    journal_header_id,
    journal_line,
    read_journal,
    read_manifest,
    remove_orphans,
    snapshot_text,
)

log = logging.getLogger(__name__)

JOURNAL_COMPACT_LINES = 1000  # compact the journal into the snapshot beyond this many lines
JOURNAL_COMPACT_BYTES = 8 * 1024 * 1024  # ... or this many bytes


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
        if nests_deeper(settings, SETTINGS_DEPTH):
            raise ValueError(f"'settings' nest deeper than {SETTINGS_DEPTH} levels")
        self.settings: dict[str, Any] = dict(settings)
        arts = manifest.get("artifacts", [])
        if not isinstance(arts, list):
            raise ValueError("'artifacts' must be a list")
        listed = artifacts_from_json(arts, owned=_owned)
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
        with flock(root, exclusive=False):
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
            manifest, snap_id = read_manifest(root)
        except ReplaceableManifest:
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
        fd = open_plain(jpath, os.O_RDONLY, "journal")
        if fd is not None:
            try:
                read = read_journal(fd, jpath, 0)
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
        if self._snap_id is not None and stat_id(self.root / MANIFEST) == self._snap_id:
            jpath = self.root / JOURNAL
            fd = open_plain(jpath, os.O_RDONLY, "journal")
            if fd is None and self._jid is None:
                return  # a version-1 snapshot, unchanged, and no journal
            if fd is not None:
                try:
                    size = os.fstat(fd).st_size
                    if (
                        self._jid is not None
                        and size >= self._joff
                        and journal_header_id(fd, jpath) == self._jid
                    ):
                        read = read_journal(fd, jpath, self._joff)
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
        atomic.write_text(self.root / MANIFEST, snapshot_text(full, self.artifacts()))
        self._snap_id = stat_id(self.root / MANIFEST)
        self._disk_version = FORMAT_VERSION
        self._disk_meta = dict(meta)
        self._listing_complete = True
        jid = uuid.uuid4().hex
        header = journal_line({"format": JOURNAL_FORMAT, "id": jid})
        jpath = self.root / JOURNAL
        fd = open_plain(jpath, os.O_RDWR | os.O_CREAT, "journal")
        if fd is None:
            raise ProjectError(f"{jpath}: cannot create the journal")
        try:
            os.ftruncate(fd, 0)
            write_all(fd, header)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.root)
        self._jid, self._joff, self._jlines = jid, len(header), 1

    def _append_locked(self, art: Artifact) -> None:
        """Record `art` by appending one self-checking line to the journal (the commit)."""
        line = journal_line(art.to_json())
        jpath = self.root / JOURNAL
        fd = open_plain(jpath, os.O_RDWR | os.O_APPEND, "journal")
        if fd is None:
            raise ProjectError(f"{jpath}: the journal vanished")
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # end a torn line of a killed writer: it stays skipped
            write_all(fd, line)
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
        if nests_deeper(self.settings, SETTINGS_DEPTH):
            raise ProjectError(
                f"{self.root / MANIFEST}: project settings nest deeper than {SETTINGS_DEPTH} levels"
            )
        try:
            with self._mutex, flock(self.root, exclusive=True):
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
            with self._mutex, flock(self.root, exclusive=False):
                self._sync_locked()
        except ProjectError as exc:
            log.warning("%s: cannot refresh the project (%s)", self.root, exc)

    # -- orphans -------------------------------------------------------------------------
    def clean_orphans(self) -> int:
        """Remove what killed writers left: temp folders whose writer is gone, artifact
        folders renamed into place but never recorded, snapshot temp files. Returns how many.
        Safe while others write (under the lock; a live writer's temp folder is flocked)."""
        with self._mutex, flock(self.root, exclusive=True):
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
        return remove_orphans(self.root, listed, self._listing_complete)

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
        aid = artifact_id or new_id(kind)
        if not isinstance(aid, str) or not ID_RE.fullmatch(aid):
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
        if not settings_ok(sets):
            raise ProjectError(f"artifact '{aid}': settings nest deeper than {SETTINGS_DEPTH}")
        with self._mutex, flock(self.root, exclusive=True):
            if not self._cleaned:
                self._sync_locked(replace_bad=True)
                self._clean_once_locked()
            base = self._kind_dir(kind, create=True)
            tmp = base / f"{TMP_PREFIX}{os.getpid()}-{aid}"
            try:
                if os.path.lexists(tmp) and not remove_dead_tmp(str(tmp)):
                    raise ProjectError(f"{self.root}: artifact '{aid}' is being written already")
                os.mkdir(tmp)
                # held while it is filled: a cleaner never removes a live writer's folder
                tmp_fd = os.open(tmp, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
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
        fsync_tree(tmp)
        with self._mutex, flock(self.root, exclusive=True):
            self._sync_locked(replace_bad=True)
            if aid in self._artifacts:
                raise ProjectError(
                    f"{self.root}: artifact '{aid}' already exists (artifacts are immutable)"
                )
            base = self._kind_dir(kind, create=True)
            final = base / aid
            if os.path.lexists(final):  # renamed by a killed writer but never recorded
                remove(str(final))
            os.rename(tmp, final)
            fsync_dir(base)
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
