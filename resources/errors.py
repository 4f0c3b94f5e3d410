"""The one root of every error Twinbench raises on purpose.

Each package derives its own families (`DeviceError`, `TwinError`, ...) from
`TwinbenchError`. Messages are written for people: they name the file, device or parameter
and say what is wrong. The CLI prints them and exits non-zero; the GUI shows them.
"""

from __future__ import annotations


class TwinbenchError(Exception):
    """Base of all deliberate Twinbench errors; the message is shown to the user as is."""
