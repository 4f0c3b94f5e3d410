"""Error families of the devices layer."""

from __future__ import annotations

from resources.errors import TwinbenchError


class DeviceError(TwinbenchError):
    """A camera, robot or lab could not be reached or misbehaved (message names the device)."""


class DataFileError(TwinbenchError):
    """A recording or data file is missing, corrupt or in the wrong units (message names it)."""
