"""The design the code relies on lives in the repository: comments cite sections of
docs/ARCHITECTURE.md, never the design spec that lived outside it, and every cited section
exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
SUFFIXES = (".py", ".sh", ".toml", ".md")
# Spelled in two pieces so that this file does not cite what it forbids.
OUTSIDE = re.compile("DESIGN" + r"(?: §|\.md)")
CITED = re.compile(r"ARCHITECTURE\.md\s+(§\d+(?:\s*,\s*§\d+)*)")
HEADING = re.compile(r"^## (\d+)\. \S", re.MULTILINE)


def _files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=30
        ).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.SubprocessError):  # not a git checkout: walk the tree
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()]
    return [
        REPO / n
        for n in names
        if n.endswith(SUFFIXES)
        and not n.startswith((".venv/", ".git/"))
        and "/.venv/" not in n
        and (REPO / n).is_file()
    ]


def _sections() -> set[int]:
    return {int(n) for n in HEADING.findall(ARCHITECTURE.read_text(encoding="utf-8"))}


def test_architecture_sections_are_numbered() -> None:
    numbers = [int(n) for n in HEADING.findall(ARCHITECTURE.read_text(encoding="utf-8"))]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_no_citation_of_the_design_spec_outside_the_repository() -> None:
    bad = []
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in OUTSIDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{path.relative_to(REPO)}:{line}")
    assert not bad, "cite docs/ARCHITECTURE.md sections instead: " + ", ".join(bad)


def test_cited_architecture_sections_exist() -> None:
    sections = _sections()
    bad = []
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in CITED.finditer(text):
            for n in re.findall(r"§(\d+)", m.group(1)):
                if int(n) not in sections:
                    line = text.count("\n", 0, m.start()) + 1
                    bad.append(f"{path.relative_to(REPO)}:{line} §{n}")
    # ARCHITECTURE.md's own cross-references ("(§6)")
    for n in re.findall(r"§(\d+)", ARCHITECTURE.read_text(encoding="utf-8")):
        if int(n) not in sections:
            bad.append(f"docs/ARCHITECTURE.md §{n}")
    assert not bad, f"no such section in docs/ARCHITECTURE.md (sections {sorted(sections)}): {bad}"
