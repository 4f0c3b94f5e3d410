"""One artifact of a project (docs/ARCHITECTURE.md §6): its record, the kinds, the id rule,
and the checks every entry of a snapshot or journal line passes (fast, column by column, on
open). Stdlib only.
"""

from __future__ import annotations

import math
import operator
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

KINDS: dict[str, str] = {
    "scan": "scans",
    "twin": "twins",
    "trajectory": "trajectories",
    "fit": "fits",
    "policy": "policies",
    "run": "runs",
}
MAX_JSON_DEPTH = 64  # nesting of a snapshot; settings may nest MAX_JSON_DEPTH - 4 levels
SETTINGS_DEPTH = MAX_JSON_DEPTH - 4  # manifest > artifacts > artifact > settings


def nests_deeper(obj: Any, limit: int) -> bool:
    """Whether `obj` (parsed JSON) nests more than `limit` containers deep (iterative)."""
    todo: list[tuple[Any, int]] = [(obj, 1)]
    while todo:
        o, depth = todo.pop()
        if depth > limit:
            return True
        values = o.values() if isinstance(o, dict) else o
        todo.extend((v, depth + 1) for v in values if isinstance(v, (dict, list)))
    return False


def settings_ok(settings: Mapping[str, Any]) -> bool:
    """Settings nest at most SETTINGS_DEPTH levels (fast path: a flat object)."""
    for v in settings.values():
        if type(v) is dict or type(v) is list or isinstance(v, (dict, list)):
            return not nests_deeper(dict(settings), SETTINGS_DEPTH)
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
        if not settings_ok(settings):
            raise ValueError(
                f"artifact {aid}: 'settings' nest deeper than {SETTINGS_DEPTH} levels "
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


def artifacts_from_json(entries: list[Any], owned: bool = False) -> list[Artifact]:
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
                ok = all(map(settings_ok, settings))
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


def new_id(kind: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{stamp}-{uuid.uuid4().hex[:6]}"


ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
_ID_MATCH = ID_RE.fullmatch
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
