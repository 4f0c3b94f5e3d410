"""The project folder (docs/ARCHITECTURE.md §6): a core capability every floor may use, so it
lives on the ground floor (stdlib and resources/ only).

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
the journal grows past `store.JOURNAL_COMPACT_LINES` lines it is compacted (under the lock: write
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

Modules:
- `artifact.py`: `Artifact` (one immutable artifact), `KINDS`, the id rule, `printable`.
- `files.py`: contained file access (plain files inside the project only), `ProjectError`.
- `journal.py`: the folder's own files: snapshot (`MANIFEST`), `JOURNAL`, `LOCK`.
- `store.py`: `Project`, the open project folder (create, open, new_artifact, lineage).
"""

from __future__ import annotations

from resources.project.artifact import KINDS, Artifact, printable
from resources.project.files import ProjectError
from resources.project.journal import FORMAT_VERSION, JOURNAL, LOCK, MANIFEST
from resources.project.store import Project

__all__ = [
    "FORMAT_VERSION",
    "JOURNAL",
    "KINDS",
    "LOCK",
    "MANIFEST",
    "Artifact",
    "Project",
    "ProjectError",
    "printable",
]
