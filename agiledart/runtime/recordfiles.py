"""A peer's share of the records on disk: one file per record, written atomically.

``<dir>/<key as 40 hex digits>.rec`` holds ``[version, merge, value]`` in msgpack. A
write goes to a temporary file, which is fsynced, renamed over the record's file, and
then the directory is fsynced too, so after a power cut a record is either its old
bytes or its new ones, and a write acknowledged to its writer is on disk. Files that do
not decode (a torn temporary, a disk error) are skipped with a warning when loading.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgpack

log = logging.getLogger(__name__)

__all__ = ["RecordFiles"]

_NAME_RE = re.compile(r"[0-9a-f]{40}\.rec")


class RecordFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def apply(self, writes: Iterable[tuple[int, int, bool, Any]], deletes: Iterable[int]) -> None:
        """Write ``(key, version, merge, value)`` records and delete others, durably."""
        self.root.mkdir(parents=True, exist_ok=True)
        changed = False
        for key, version, merge, value in writes:
            path = self._path(key)
            tmp = path.with_name(f".{path.name}.tmp")
            data = msgpack.packb([version, merge, value], use_bin_type=True)
            with tmp.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
            changed = True
        for key in deletes:
            with contextlib.suppress(FileNotFoundError):
                self._path(key).unlink()
                changed = True
        if changed:
            self._sync_dir()

    def load(self) -> Iterator[tuple[int, int, bool, Any]]:
        """Every record on disk as ``(key, version, merge, value)``."""
        if not self.root.is_dir():
            return
        for path in sorted(self.root.iterdir()):
            if path.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if not _NAME_RE.fullmatch(path.name):
                continue
            try:
                version, merge, value = msgpack.unpackb(path.read_bytes(), raw=False)
                if not isinstance(version, int) or not isinstance(merge, bool):
                    raise ValueError("not a record")  # noqa: EM101
            except (OSError, ValueError, TypeError, msgpack.UnpackException) as exc:
                log.warning("records: skipping %s, which does not decode: %s", path, exc)
                continue
            yield int(path.name[:40], 16), version, merge, value

    def _path(self, key: int) -> Path:
        return self.root / f"{key:040x}.rec"

    def _sync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
