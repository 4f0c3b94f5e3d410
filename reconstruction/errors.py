"""Error family of the reconstruction layer."""

from __future__ import annotations

from resources.errors import TwinbenchError


class ReconstructionError(TwinbenchError):
    """A scan could not be reconstructed, segmented or calibrated (message says why)."""
