"""TLS for robot links that leave the machine: a self-signed certificate made on first use,
and fingerprint pinning on the client, like SSH host keys.

    cert, key = ensure_certificate(Path("~/.config/twinbench/tls").expanduser())
    ctx = server_context(cert, key)             # RobotServer(..., tls=ctx)
    fingerprint(cert)                           # "sha256:ab12…" — give it to the clients

The client (devices/robots/client.py) checks the server's certificate by fingerprint only:
either the one it was given, or the one recorded in its known-robots file on first contact
(trust on first use); a different certificate later is refused. The certificate is made
with the `openssl` command line tool (Python's `ssl` cannot create one).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import ssl
import subprocess
from pathlib import Path

from devices.errors import DeviceError

CERT_NAME, KEY_NAME = "robot-cert.pem", "robot-key.pem"
KNOWN_ROBOTS = Path("~/.config/twinbench/known_robots")


def default_tls_dir() -> Path:
    """Where `lab serve` keeps its certificate unless told otherwise."""
    return Path("~/.config/twinbench/tls").expanduser()


def ensure_certificate(folder: Path, common_name: str = "twinbench-robot") -> tuple[Path, Path]:
    """(certificate, key) PEM files in `folder`, made (self-signed, EC P-256, 10 years) if
    missing. The key is written owner-only. Raises DeviceError naming the folder."""
    folder = Path(folder)
    cert, key = folder / CERT_NAME, folder / KEY_NAME
    if cert.is_file() and key.is_file():
        if os.name == "posix" and key.stat().st_mode & 0o077:
            raise DeviceError(f"TLS key {key} is readable by group/others; run: chmod 600 {key}")
        return cert, key
    exe = shutil.which("openssl")
    if exe is None:
        raise DeviceError(
            f"cannot make a TLS certificate in {folder}: the openssl command is not installed "
            "(apt-get install openssl)"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = os.umask(0o077)
        try:
            subprocess.run(
                [exe, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-days", "3650", "-subj", f"/CN={common_name}",
                 "-keyout", str(key), "-out", str(cert)],
                check=True,
                capture_output=True,
                timeout=60,
            )  # fmt: skip
        finally:
            os.umask(old)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise DeviceError(
            f"cannot make a TLS certificate in {folder}: {exc} {detail.decode(errors='replace')}"
        ) from exc
    return cert, key


def fingerprint_der(der: bytes) -> str:
    """ "sha256:<hex>" of a DER certificate."""
    return "sha256:" + hashlib.sha256(der).hexdigest()


def fingerprint(cert: Path) -> str:
    """Fingerprint of a PEM certificate file (what a client pins)."""
    try:
        pem = Path(cert).read_text(encoding="ascii")
    except OSError as exc:
        raise DeviceError(f"TLS certificate {cert}: cannot read it ({exc})") from exc
    return fingerprint_der(ssl.PEM_cert_to_DER_cert(pem))


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context for the robot server."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise DeviceError(f"TLS certificate {cert} / key {key}: cannot load ({exc})") from exc
    return ctx


def client_context() -> ssl.SSLContext:
    """A client context that checks the server by pinned fingerprint (see `check_pinned`),
    not by a certificate authority: robots have self-signed certificates."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_pinned(
    address: str, der: bytes | None, pinned: str | None, known_file: Path | None
) -> str:
    """Check the server certificate `der` against `pinned`, else against `known_file` (the
    first certificate seen for `address` is recorded there). Returns the fingerprint;
    raises DeviceError on a mismatch, naming both fingerprints and the file."""
    if der is None:
        raise DeviceError(f"robot at {address}: the server sent no TLS certificate")
    got = fingerprint_der(der)
    if pinned is not None:
        if got.lower() != pinned.lower().strip():
            raise DeviceError(
                f"robot at {address}: TLS certificate fingerprint {got} does not match the "
                f"pinned {pinned}; someone may be in the middle — refusing to connect"
            )
        return got
    path = (known_file or KNOWN_ROBOTS).expanduser()
    known: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 2:
                known[parts[0]] = parts[1]
    if address in known:
        if known[address] != got:
            raise DeviceError(
                f"robot at {address}: TLS certificate changed (now {got}, {path} has "
                f"{known[address]}); if the robot really has a new certificate, remove its "
                f"line from {path}"
            )
        return got
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with path.open("a", encoding="utf-8") as f:
        f.write(f"{address} {got}\n")
    return got
