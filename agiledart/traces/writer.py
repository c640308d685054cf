"""One trace writer per peer: buffered NDJSON, rotated by size, written off the loop.

:meth:`TraceWriter.emit` is what the hot path calls: it serialises one record and
appends the line to an in-memory buffer (a few microseconds). A flush writes the buffer
out, in a thread when called from the event loop (:meth:`TraceWriter.aflush`, run every
``flush_s`` by :meth:`TraceWriter.start` and whenever ``flush_bytes`` are waiting), so
the peer's loop never blocks on the disk. Files are ``<dir>/<peer>/trace-NNNNNN.ndjson``
(``.ndjson.gz`` with ``compress``), a new one once ``max_bytes`` (uncompressed) have
gone into the current one; numbering continues after files already there, so a restart
never overwrites a trace. Every file starts with a ``meta`` record.

A writer that cannot write (disk full, directory removed) logs the error once, counts
the lines it dropped and goes on: tracing never takes a peer down.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import IO, Any

from agiledart.traces.schema import SCHEMA_VERSION

__all__ = ["NullTraceWriter", "TraceWriter", "trace_files"]

log = logging.getLogger("agiledart.traces")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_FILE = re.compile(r"^trace-(\d{6})\.ndjson(\.gz)?$")


def _folder(peer: str) -> str:
    return _UNSAFE.sub("_", peer) or "peer"


def trace_files(directory: Path) -> list[Path]:
    """Every trace file under ``directory`` (all peers), in name order."""
    return sorted(p for p in directory.glob("*/trace-*.ndjson*") if _FILE.match(p.name))


class TraceWriter:
    enabled = True

    def __init__(
        self,
        directory: Path,
        peer: str,
        *,
        node_id: str | None = None,
        zone: str | None = None,
        max_bytes: int = 64 << 20,
        compress: bool = False,
        flush_bytes: int = 256 << 10,
        flush_s: float = 1.0,
    ) -> None:
        from agiledart import __version__

        self.peer = peer
        self.folder = Path(directory) / _folder(peer)
        self.max_bytes = max_bytes
        self.compress = compress
        self.flush_bytes = flush_bytes
        self.flush_s = flush_s
        self.written = 0  #: lines written to disk
        self.dropped = 0  #: lines lost to write errors
        self._meta = {"schema": SCHEMA_VERSION, "version": __version__}
        self._meta.update({"node_id": node_id, "zone": zone})
        self._lines: list[str] = []
        self._pending = 0
        self._io = threading.Lock()
        self._file: IO[bytes] | gzip.GzipFile | None = None
        self._file_bytes = 0
        self._index = 0
        self._failed = False
        self._task: asyncio.Task[None] | None = None
        self._flushing: asyncio.Task[None] | None = None

    # -- the hot path -----------------------------------------------------------------

    def emit(self, type: str, **fields: Any) -> None:
        record = {"v": SCHEMA_VERSION, "type": type, "ts": time.time() * 1000.0}
        record["peer"] = self.peer
        record.update(fields)
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        self._lines.append(line)
        self._pending += len(line)
        if self._pending >= self.flush_bytes and self._task is not None:
            self._kick()

    def _kick(self) -> None:
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self.aflush())

    # -- flushing ---------------------------------------------------------------------

    async def start(self) -> None:
        """Flush every ``flush_s`` in the background until :meth:`aclose`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._periodic())

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            await self.aflush()

    async def aflush(self) -> None:
        if self._lines:
            lines, self._lines, self._pending = self._lines, [], 0
            await asyncio.to_thread(self._write, lines)

    def flush(self) -> None:
        lines, self._lines, self._pending = self._lines, [], 0
        if lines:
            self._write(lines)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._flushing is not None:
            with contextlib.suppress(Exception):
                await self._flushing
        await self.aflush()
        await asyncio.to_thread(self._close_file)

    def close(self) -> None:
        self.flush()
        self._close_file()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- files (under self._io, possibly in a thread) ---------------------------------

    def _write(self, lines: list[str]) -> None:
        with self._io:
            try:
                for line in lines:
                    data = line.encode()
                    if self._file is None or self._file_bytes + len(data) > self.max_bytes:
                        self._open_next()
                    assert self._file is not None
                    self._file.write(data)
                    self._file_bytes += len(data)
                    self.written += 1
                assert self._file is not None
                self._file.flush()
            except OSError as exc:
                self.dropped += len(lines)
                if not self._failed:
                    self._failed = True
                    log.error("trace writer for %s cannot write: %s", self.peer, exc)
                self._close_quietly()

    def _open_next(self) -> None:
        self._close_quietly()
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._index == 0:
            taken = [int(m.group(1)) for p in self.folder.iterdir() if (m := _FILE.match(p.name))]
            self._index = max(taken, default=0)
        self._index += 1
        name = f"trace-{self._index:06d}.ndjson" + (".gz" if self.compress else "")
        path = self.folder / name
        opener = gzip.open if self.compress else open
        raw: IO[bytes] | gzip.GzipFile = opener(path, "wb")  # closed by _close_quietly
        self._file = raw
        meta = {"v": SCHEMA_VERSION, "type": "meta", "ts": time.time() * 1000.0}
        meta["peer"] = self.peer
        meta.update(self._meta)
        data = (json.dumps(meta, separators=(",", ":")) + "\n").encode()
        raw.write(data)
        self._file_bytes = len(data)

    def _close_quietly(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()

    def _close_file(self) -> None:
        with self._io:
            self._close_quietly()


class NullTraceWriter:
    """What a peer without ``--trace-dir`` has: every call does nothing."""

    enabled = False
    written = 0
    dropped = 0

    def emit(self, type: str, **fields: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def aflush(self) -> None:
        pass

    def flush(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        pass
