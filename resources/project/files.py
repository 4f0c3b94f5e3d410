"""Contained file access for the project store (docs/ARCHITECTURE.md §6): files are opened
only as plain files inside the project (a symlink, FIFO or device is refused, never followed),
reads are bounded in size, writes and renames are fsynced, and what killed writers left is
removed. Also the store's error, `ProjectError`. Stdlib and resources.errors only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
from pathlib import Path

from resources.errors import TwinbenchError

TMP_PREFIX = ".tmp-"  # temp artifact folders: <kind folder>/.tmp-<pid>-<id>
MAX_FILE_BYTES = 64 * 1024 * 1024  # snapshot or journal larger than this: refused
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class ProjectError(TwinbenchError):
    """A project folder cannot be created, opened or written (message names the path)."""


def open_plain(
    path: Path, flags: int, what: str, mode: int = 0o644, unreadable_ok: bool = False
) -> int | None:
    """os.open that never follows a symlink and accepts only a plain file (no FIFO, device or
    folder); None when the file does not exist (and `flags` does not create it), or, with
    `unreadable_ok`, when this user may not open it."""
    try:
        fd = os.open(path, flags | O_NOFOLLOW | O_CLOEXEC | os.O_NONBLOCK, mode)
    except FileNotFoundError:
        return None
    except PermissionError:
        if unreadable_ok:
            return None
        raise ProjectError(
            f"{path}: cannot open the project's {what} (permission denied)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProjectError(
                f"{path}: the project's {what} is a symbolic link; refusing to follow it "
                "(it must be a plain file inside the project)"
            ) from None
        raise ProjectError(f"{path}: cannot open the project's {what} ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ProjectError(f"{path}: the project's {what} is not a plain file")
    return fd


def read_bounded(fd: int, path: Path, what: str, start: int = 0) -> bytes:
    """Bytes of `fd` from `start` to its end, refusing a file over MAX_FILE_BYTES."""
    size = os.fstat(fd).st_size
    if size > MAX_FILE_BYTES:
        raise ProjectError(
            f"{path}: {what} is {size / 2**20:.1f} MiB, over the "
            f"{MAX_FILE_BYTES // 2**20} MiB limit (refusing to read it)"
        )
    chunks: list[bytes] = []
    pos = start
    while True:
        chunk = os.pread(fd, max(size - pos, 0) + 65536, pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
        if pos > MAX_FILE_BYTES:
            raise ProjectError(
                f"{path}: {what} is over the {MAX_FILE_BYTES // 2**20} MiB limit "
                "(refusing to read it)"
            )
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every plain file and folder under `folder` (symlinks are not followed)."""
    todo = [str(folder)]
    while todo:
        d = todo.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    try:
                        fd = os.open(e.path, os.O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
                    except OSError:
                        continue
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
        fsync_dir(Path(d))


def stat_id(path: Path) -> tuple[int, int, int] | None:
    """Identity of a file version (inode, size, mtime): changes when it is replaced."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def remove(path: str) -> None:
    """Remove a folder tree, or just the link/file when `path` is not a real folder."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def remove_dead_tmp(path: str) -> bool:
    """Remove a temp artifact folder whose writer is gone (its flock is free); True if removed.
    A symlink or file of that name is unlinked (never followed)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return True
    fd = os.open(path, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its writer is still filling it
        shutil.rmtree(path)
        return True
    finally:
        os.close(fd)
