"""A peer's state directory: where it is by default, and one live peer per directory.

The state directory holds the peer's node id, its share of the records store, cached
code and checkpoint fragments. Two peers sharing one would come up with the same node
id, so a running peer holds an exclusive ``flock`` on ``<dir>/lock`` (released by the
kernel when the process ends, however it ends) and a second peer is refused with the
holder's name and pid.

The default directory is ``./state/<name>``, so peers with different names started in
one working directory do not collide; a ``./state`` that already holds a node id (the
layout before names were part of the default) is still used as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path

from agiledart.overlay.errors import ConfigError

__all__ = ["StateDirLock", "default_state_dir"]


def default_state_dir(name: str, base: Path = Path("state")) -> Path:
    """``base/<name>`` (a file-name-safe form of it), or ``base`` in the older layout."""
    if (base / "node_id").exists():
        return base
    return base / (re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "peer")


class StateDirLock:
    """The exclusive hold of one live peer on its state directory."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        self.state_dir = state_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: Path, *, name: str) -> StateDirLock:
        """Hold ``state_dir``; ConfigError naming the peer that holds it already."""
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            msg = f"cannot use the state directory {state_dir}: {exc.strerror or exc}"
            raise ConfigError(msg) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another peer"
            os.close(fd)
            msg = (
                f"the state directory {state_dir} is in use by {holder}; give each peer "
                "its own --state-dir (two peers sharing one would have the same node id)"
            )
            raise ConfigError(msg) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"peer {name!r} (pid {os.getpid()})\n".encode(), 0)
        return cls(state_dir, fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
