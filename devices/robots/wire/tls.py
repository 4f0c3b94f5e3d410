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

import errno
import hashlib
import math
import os
import select
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

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


class SerialTLS:
    """An established TLS connection that one thread may read while another writes.

    OpenSSL forbids using one SSL object from two threads at once, and the robot link does
    exactly that (a reader thread, and a writer or heartbeat thread). The failure is quiet:
    a read that found no data while a write finished reports a clean end of stream (both
    sides then see the other hang up), or a write reports "EOF occurred in violation of
    protocol" — about 2 in 100 TLS connections in one process. Here every SSL call runs
    non-blocking under one lock, and waiting for the socket happens outside it, so a read
    that waits for data never holds up a write.

    It offers what the link uses of a socket: recv, sendall, settimeout/gettimeout,
    getpeercert, shutdown, close (a timeout raises TimeoutError, as a socket's does).
    """

    def __init__(self, tls: ssl.SSLSocket) -> None:
        self._tls, self._lock = tls, threading.Lock()
        self._timeout = tls.gettimeout()
        tls.setblocking(False)

    def settimeout(self, timeout: float | None, /) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def getpeercert(self, binary_form: bool = False) -> Any:
        return self._tls.getpeercert(binary_form)

    def recv(self, bufsize: int, /) -> bytes:
        deadline = self._deadline()
        while True:
            with self._lock:
                try:
                    return self._tls.recv(bufsize)
                except ssl.SSLWantReadError:
                    events = select.POLLIN
                except ssl.SSLWantWriteError:
                    events = select.POLLOUT
            self._wait(events, deadline, "read")

    def sendall(self, data: bytes | bytearray | memoryview, /) -> None:
        view, deadline = memoryview(data).cast("B"), self._deadline()
        while len(view):
            with self._lock:
                try:
                    view = view[self._tls.send(view) :]
                    continue
                except ssl.SSLWantWriteError:
                    events = select.POLLOUT
                except ssl.SSLWantReadError:
                    events = select.POLLIN
            self._wait(events, deadline, "write")

    def shutdown(self, how: int, /) -> None:
        # the TCP connection only (no TLS close_notify): wakes a thread waiting in _wait
        socket.socket.shutdown(self._tls, how)

    def close(self) -> None:
        with self._lock:
            self._tls.close()

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def _wait(self, events: int, deadline: float | None, what: str) -> None:
        fd = self._tls.fileno()
        if fd < 0:
            raise OSError(errno.EBADF, "TLS socket is closed")
        poller = select.poll()
        poller.register(fd, events)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError(f"the {what} operation timed out")
        if not poller.poll(None if left is None else max(1, math.ceil(left * 1000))):
            raise TimeoutError(f"the {what} operation timed out")
