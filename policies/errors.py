"""Error family of the policies layer."""

from __future__ import annotations

from resources.errors import TwinbenchError


class PolicyError(TwinbenchError):
    """A task, trainer, policy file or evaluation cannot do what was asked; the message
    names the task, parameter, file or spec entry and says what is wrong."""
