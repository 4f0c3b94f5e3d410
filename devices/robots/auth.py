"""Shared-secret tokens for the robot protocol.

A token comes from a file (first line, whitespace stripped) or from the environment variable
TWINBENCH_TOKEN. Comparison is constant-time (`hmac.compare_digest`).
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from devices.errors import DeviceError

TOKEN_ENV = "TWINBENCH_TOKEN"
MIN_TOKEN_CHARS = 16


def new_token() -> str:
    """A fresh random token (URL-safe text, 256 bits)."""
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, token: str) -> None:
    """Write `token` to `path`, readable by the owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def load_token(token_file: Path | str | None = None) -> str:
    """The token from `token_file`, else from $TWINBENCH_TOKEN.

    Raises DeviceError naming the file or variable when neither gives a usable token.
    """
    if token_file is not None:
        path = Path(token_file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DeviceError(f"robot token file {path}: cannot read it ({exc})") from exc
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        source = f"token file {path}"
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        source = f"environment variable {TOKEN_ENV}"
        if not token:
            raise DeviceError(f"no robot token: pass a token file or set {TOKEN_ENV}")
    if len(token) < MIN_TOKEN_CHARS:
        raise DeviceError(
            f"robot token from {source} is too short ({len(token)} < {MIN_TOKEN_CHARS} characters)"
        )
    return token


def token_matches(expected: str, given: object) -> bool:
    """Constant-time comparison; anything that is not a str never matches."""
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8"))
