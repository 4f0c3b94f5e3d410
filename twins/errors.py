"""Error family of the twins layer."""

from __future__ import annotations

from resources.errors import TwinbenchError


class TwinError(TwinbenchError):
    """A twin cannot be built, edited or simulated; the message names the parameter,
    body, joint or file and says what is wrong."""
