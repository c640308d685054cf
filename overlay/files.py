"""Writing a small file so that a crash leaves either the old or the new one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir"]


def fsync_dir(directory: Path | str) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be
    opened, as on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a directory
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path | str, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to a temporary name beside ``path``, sync it, rename it over
    ``path`` and sync the directory, so the rename survives a power cut."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
