"""Error family of the reconstruction layer."""

from __future__ import annotations

import re

from resources.errors import TwinbenchError


class ReconstructionError(TwinbenchError):
    """A scan could not be reconstructed, segmented or calibrated (message says why)."""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def clean_message(text: object) -> str:
    """Text for people: colour/escape codes (Open3D's log colours) and '[Open3D ...]'
    prefixes removed, whitespace collapsed."""
    s = _ANSI.sub("", str(text))
    s = re.sub(r"\[Open3D (?:WARNING|ERROR|INFO|DEBUG)\]\s*", "", s)
    return " ".join(s.split())
