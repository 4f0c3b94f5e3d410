"""Shared-secret tokens for the robot protocol, and the challenge-response that proves
knowledge of the token without sending it.

A token comes from a file (first line, whitespace stripped; the file must not be readable
by group or others) or from the environment variable TWINBENCH_TOKEN. The server sends a
fresh random nonce; the client answers HMAC-SHA256(token, "client" | nonce | client nonce |
version) and the server answers HMAC-SHA256(token, "server" | nonce | client nonce), so a
captured handshake is useless on any other connection and the client knows it reached a
server holding the token. Comparisons are constant-time (`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from devices.errors import DeviceError

TOKEN_ENV = "TWINBENCH_TOKEN"
MIN_TOKEN_CHARS = 16
NONCE_BYTES = 32


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
            mode = path.stat().st_mode
        except OSError as exc:
            raise DeviceError(f"robot token file {path}: cannot read it ({exc})") from exc
        if os.name == "posix" and mode & 0o077:
            raise DeviceError(
                f"robot token file {path} is readable or writable by group/others "
                f"(mode {stat.S_IMODE(mode):04o}); anyone on this machine could take the "
                f"robot. Run: chmod 600 {path}"
            )
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


def new_nonce() -> bytes:
    """A fresh random challenge (NONCE_BYTES bytes)."""
    return secrets.token_bytes(NONCE_BYTES)


def _mac(token: str, *parts: bytes) -> bytes:
    h = hmac.new(token.encode("utf-8"), digestmod=hashlib.sha256)
    for p in parts:
        h.update(len(p).to_bytes(4, "big") + p)  # length-prefixed: no ambiguity between parts
    return h.digest()


def client_proof(token: str, nonce: bytes, client_nonce: bytes, version: int) -> bytes:
    """What the client sends in its hello: proves the token for this connection only."""
    return _mac(token, b"twinbench-robot client", nonce, client_nonce, str(version).encode())


def server_proof(token: str, nonce: bytes, client_nonce: bytes) -> bytes:
    """What the server sends in its welcome: proves the server holds the token too."""
    return _mac(token, b"twinbench-robot server", nonce, client_nonce)


def proof_matches(expected: bytes, given: object) -> bool:
    """Constant-time comparison; anything that is not bytes never matches."""
    return isinstance(given, bytes) and hmac.compare_digest(expected, given)
