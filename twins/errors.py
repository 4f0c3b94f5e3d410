"""Error family of the twins layer."""

from __future__ import annotations

from resources.errors import TwinbenchError


class TwinError(TwinbenchError):
    """A twin cannot be built, edited or simulated; the message names the parameter,
    body, joint or file and says what is wrong."""


class RecordingMismatch(TwinError):
    """A recording does not fit the twin it is matched to (for an import with a twin, a fit
    or a replay): from another robot, with joints the twin lacks, or with commands its
    actuators cannot take. The message names the recording, the twin and the mismatch."""
