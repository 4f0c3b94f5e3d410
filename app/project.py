"""The open project folder (DESIGN §4): manifest, artifact registry, lineage.

```
myproject/
  twinbench.json        manifest: format version, settings, artifacts and their inputs
  scans/<id>/ twins/<id>/ trajectories/<id>/ fits/<id>/ policies/<id>/ runs/<id>/
```

Artifacts are immutable once written. A new artifact is written into a hidden temp folder,
renamed into place, and only then recorded in the manifest (itself written atomically), so
killing the program at any moment leaves a project that opens with everything committed
before. Folders not in the manifest (a crash between rename and manifest write) are ignored.
Several processes may add artifacts to one project at once (the app, a training subprocess, a
CLI command): each manifest write holds a lock (`.twinbench.lock`) and merges what the others
recorded, so none of their artifacts is lost.
"""

from __future__ import annotations

import fcntl
import json
import math
import re
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resources import atomic
from resources.errors import TwinbenchError

MANIFEST = "twinbench.json"
LOCK = ".twinbench.lock"  # flock target: one manifest writer at a time (never data)
FORMAT = "twinbench-project"
FORMAT_VERSION = 1
KINDS: dict[str, str] = {
    "scan": "scans",
    "twin": "twins",
    "trajectory": "trajectories",
    "fit": "fits",
    "policy": "policies",
    "run": "runs",
}


class ProjectError(TwinbenchError):
    """A project folder cannot be created, opened or written (message names the path)."""


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
        """An artifact entry of a manifest; raises ValueError naming the field that is wrong."""
        if not isinstance(d, Mapping):
            raise ValueError(f"artifact entry must be an object, not {type(d).__name__}")
        for key in ("kind", "id", "created"):
            if key not in d:
                raise ValueError(f"artifact entry is missing '{key}'")
        kind, aid, created = d["kind"], d["id"], d["created"]
        if kind not in KINDS:
            raise ValueError(f"artifact {aid!r}: unknown kind {kind!r}")
        if not isinstance(aid, str) or not _ID_RE.fullmatch(aid):
            raise ValueError(
                f"artifact id {aid!r} is not a plain name (letters, digits, '.', '_', '-'; "
                "no path separators or '..')"
            )
        if (
            isinstance(created, bool)
            or not isinstance(created, (int, float))
            or not math.isfinite(created)
            or not 0 <= created <= MAX_TIMESTAMP
        ):
            raise ValueError(
                f"artifact {aid}: 'created' must be a time in seconds since 1970, got {created!r}"
            )
        inputs = d.get("inputs", ())
        parent = d.get("parent")
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(i, str) for i in inputs):
            raise ValueError(f"artifact {aid}: 'inputs' must be a list of artifact ids")
        if parent is not None and not isinstance(parent, str):
            raise ValueError(f"artifact {aid}: 'parent' must be an artifact id or null")
        settings = d.get("settings", {})
        if not isinstance(settings, Mapping):
            raise ValueError(f"artifact {aid}: 'settings' must be an object")
        summary = d.get("summary", "")
        if not isinstance(summary, str):
            raise ValueError(f"artifact {aid}: 'summary' must be text")
        return cls(
            kind=kind,
            id=aid,
            created=float(created),
            inputs=tuple(inputs),
            settings=dict(settings),
            summary=summary,
            parent=parent,
        )


def _new_id(kind: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{stamp}-{uuid.uuid4().hex[:6]}"


_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
MAX_TIMESTAMP = 253402300799.0  # 9999-12-31T23:59:59Z: later "times" are corrupt data
# Terminal control sequences (CSI/OSC/other ESC) and C0/C1 control characters: text from a
# manifest is data, never instructions to the terminal that prints it.
_CONTROL_RE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def printable(text: str) -> str:
    """`text` without terminal escape sequences or control characters (safe to print)."""
    return _CONTROL_RE.sub("", text)


class Project:
    """An open project folder. Create with `Project.create`, open with `Project.open`."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = Path(root)
        name = manifest.get("name", self.root.name)
        if not isinstance(name, str):
            raise ValueError(f"'name' must be text, not {type(name).__name__}")
        self.name: str = name
        created = manifest.get("created", time.time())
        if (
            isinstance(created, bool)
            or not isinstance(created, (int, float))
            or not math.isfinite(created)
            or not 0 <= created <= MAX_TIMESTAMP
        ):
            raise ValueError(f"'created' must be a time in seconds since 1970, got {created!r}")
        self.created: float = float(created)
        settings = manifest.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("'settings' must be an object")
        self.settings: dict[str, Any] = dict(settings)
        arts = manifest.get("artifacts", [])
        if not isinstance(arts, list):
            raise ValueError("'artifacts' must be a list")
        self._artifacts: dict[str, Artifact] = {}
        for a in arts:
            art = Artifact.from_json(a)
            if art.id in self._artifacts:
                raise ValueError(f"artifact id {art.id} appears twice")
            self._artifacts[art.id] = art

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
        mpath = root / MANIFEST
        if not root.is_dir():
            raise ProjectError(f"{root}: no such folder")
        if not mpath.is_file():
            raise ProjectError(f"{root}: not a Twinbench project (no {MANIFEST})")
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ProjectError(f"{mpath}: corrupt manifest ({exc})") from exc
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
        try:
            return cls(root, manifest)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProjectError(f"{mpath}: corrupt manifest: {exc}") from exc

    def to_manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "created": self.created,
            "settings": self.settings,
            "artifacts": [a.to_json() for a in self._artifacts.values()],
        }

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the project's manifest lock (an flock on LOCK beside the manifest): the app, a
        training subprocess and a CLI command may add artifacts to one project at once."""
        try:
            fd = open(self.root / LOCK, "a+b")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise ProjectError(f"{self.root / LOCK}: cannot lock the project ({exc})") from exc
        try:
            fcntl.flock(fd.fileno(), fcntl.LOCK_EX)
            yield
        finally:
            fd.close()  # releases the lock

    def _merge_from_disk(self) -> None:
        """Add the artifacts another process recorded since this one read the manifest
        (artifacts are immutable and never removed, so a union loses nothing)."""
        try:
            disk = Project.open(self.root)
        except ProjectError:
            return  # a missing or broken manifest is replaced by ours
        for aid, art in disk._artifacts.items():
            self._artifacts.setdefault(aid, art)

    def save(self) -> None:
        """Write the manifest atomically, merged with artifacts other processes recorded
        meanwhile (never drops one of theirs)."""
        try:
            with self._locked():
                self._merge_from_disk()
                atomic.write_json(self.root / MANIFEST, self.to_manifest())
        except (OSError, ValueError) as exc:
            raise ProjectError(f"{self.root / MANIFEST}: cannot write manifest ({exc})") from exc

    def refresh(self) -> None:
        """Pick up artifacts other processes recorded since this project was opened."""
        with self._locked():
            self._merge_from_disk()

    # -- artifacts -----------------------------------------------------------------------
    def artifacts(self, kind: str | None = None) -> list[Artifact]:
        """Artifacts in creation order, optionally of one kind."""
        arts = sorted(self._artifacts.values(), key=lambda a: a.created)
        return [a for a in arts if kind is None or a.kind == kind]

    def artifact(self, artifact_id: str) -> Artifact:
        try:
            return self._artifacts[artifact_id]
        except KeyError:
            raise ProjectError(f"{self.root}: no artifact '{artifact_id}'") from None

    def latest(self, kind: str) -> Artifact | None:
        arts = self.artifacts(kind)
        return arts[-1] if arts else None

    def path_of(self, artifact_id: str) -> Path:
        """The artifact's folder; always inside the project (ids are checked on open, and
        the resolved path is checked again so a symlink cannot lead outside)."""
        art = self.artifact(artifact_id)
        path = self.root / KINDS[art.kind] / art.id
        base = (self.root / KINDS[art.kind]).resolve()
        if path.resolve().parent != base:
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
        if not _ID_RE.fullmatch(aid):
            raise ProjectError(f"artifact id '{aid}' must be letters, digits, '.', '_' or '-'")
        if aid in self._artifacts:
            raise ProjectError(
                f"{self.root}: artifact '{aid}' already exists (artifacts are immutable)"
            )
        base = self.root / KINDS[kind]
        base.mkdir(parents=True, exist_ok=True)
        tmp = base / f".tmp-{aid}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        final = base / aid
        if final.exists():  # orphan from a crash between rename and manifest write
            shutil.rmtree(final)
        tmp.rename(final)
        art = Artifact(kind, aid, time.time(), tuple(inputs), dict(settings or {}), summary, parent)
        self._artifacts[aid] = art
        try:
            self.save()
        except BaseException:
            del self._artifacts[aid]
            raise

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
