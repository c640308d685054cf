"""A source's durable log: the messages it took from a broker, on the peer's disk.

The writer (:class:`LogWriter`, in the peer's ingest process, :mod:`.worker`) appends
messages as they arrive and writes them in group commits (one write per batch the
connection read); a QoS 1 message is acknowledged to the broker only after its
commit, so what the broker forgets, the peer holds. The reader (:class:`LogReader`,
the source in the peer) reads behind the writer at its own pace, up to the commit
count the writer reports: the engine's backpressure is the log's bound
(``max_bytes`` on disk, ``limit`` messages not yet read), never the broker's queue.
What does not fit is shed and counted.

A message has a position (0, 1, 2, ... in arrival order). On disk: segment files
``<first position>.log`` of frames ``[u32 payload length][u16 topic length][topic]
[payload]``; the writer begins a new one past ``segment_bytes``. The reader removes a
segment once it has read past it (:meth:`LogReader.release`); a checkpoint can record
a position and release only what an epoch committed, so the log can replay what came
after it. Commits are not fsynced (they survive the peer's processes dying, not the
machine's power); ``fsync=True`` makes each one durable against both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LogReader", "LogWriter"]

log = logging.getLogger(__name__)

_HEAD = struct.Struct("!IH")
#: a segment is closed and a new one begun once it holds this many bytes
SEGMENT_BYTES = 8 << 20
#: bytes read from a segment at a time
READ_CHUNK = 1 << 20


def _segment(directory: Path, first: int) -> Path:
    return directory / f"{first}.log"


@dataclass(slots=True)
class _Segment:
    first: int  #: position of its first message
    size: int = 0  #: bytes committed to it


class LogWriter:
    """Appends and group-commits messages; refuses (sheds) past its bounds."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        limit: int | None = None,
        start: int = 0,
        segment_bytes: int = SEGMENT_BYTES,
        fsync: bool = False,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.limit = limit  #: messages not yet read, at most (None: only max_bytes)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        directory.mkdir(parents=True, exist_ok=True)
        self.committed = start  #: position after the last committed message
        self.shed = 0  #: messages refused: the log was full, or the disk failed
        self.read = start  #: the reader's position, as it last said
        self._segments: list[_Segment] = []
        self._fd: int | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    @property
    def disk_bytes(self) -> int:
        """Bytes on disk in segments the reader has not released."""
        return sum(s.size for s in self._segments)

    def append(self, topic: str, payload: bytes) -> bool:
        """Queue a message for the next commit; False (counted as shed) when full."""
        t = topic.encode("utf-8")
        frame = _HEAD.pack(len(payload), len(t)) + t + payload
        held = self.committed + len(self._pending) - self.read
        if (self.limit is not None and held >= self.limit) or (
            self._pending_bytes + len(frame) + self.disk_bytes > self.max_bytes
        ):
            self.shed += 1
            return False
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        return True

    def commit(self) -> int:
        """Write what was appended since the last commit, in one write; how many
        messages that was. A failing disk sheds them (counted, logged) and says 0."""
        frames, self._pending = self._pending, []
        size, self._pending_bytes = self._pending_bytes, 0
        if not frames:
            return 0
        try:
            seg, fd = self._writable()
            view = memoryview(b"".join(frames))
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
        except OSError as exc:
            log.error("log %s: a commit failed, %d shed: %s", self.directory, len(frames), exc)
            if self._fd is not None and self._segments:  # no partial frame stays behind
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._segments[-1].size)
            self.shed += len(frames)
            return 0
        seg.size += size
        self.committed += len(frames)
        return len(frames)

    def _writable(self) -> tuple[_Segment, int]:
        if self._fd is None or self._segments[-1].size >= self.segment_bytes:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            seg = _Segment(self.committed)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            self._fd = os.open(_segment(self.directory, seg.first), flags, 0o600)
            self._segments.append(seg)
        return self._segments[-1], self._fd

    def reader_at(self, position: int) -> None:
        """The reader has read (and released) up to ``position``."""
        self.read = max(self.read, position)
        while len(self._segments) > 1 and self._segments[1].first <= position:
            del self._segments[0]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LogReader:
    """Reads committed messages in order, behind a :class:`LogWriter`."""

    def __init__(self, directory: Path, *, start: int = 0) -> None:
        self.directory = directory
        self.position = start  #: the position of the next message :meth:`read` returns
        self.committed = start  #: what the writer has committed, as it last said
        self.skipped = 0  #: messages read past unseen (a source shedding its oldest)
        self._first = start  #: the first position of the segment being read
        self._offset = 0  #: byte offset in it
        self._fd: int | None = None
        self._released = start  #: the first position not removed (in a segment kept)

    @property
    def backlog(self) -> int:
        """Committed messages not read yet."""
        return self.committed - self.position

    def restart(self, start: int) -> None:
        """The writer starts again at ``start`` (a new ingest process): forget the rest
        of the segment being read, and continue from ``<start>.log``."""
        self._close_fd()
        self.position = self.committed = self._first = start
        self._offset = 0

    def read(self, limit: int) -> list[tuple[str, bytes]]:
        """Up to ``limit`` committed messages from :attr:`position` on."""
        out: list[tuple[str, bytes]] = []
        while len(out) < limit and self.backlog > 0:
            fd = self._open()
            chunk = os.pread(fd, READ_CHUNK, self._offset)
            if not chunk:  # the end of a segment: the next begins at our position
                self._close_fd()
                self._first, self._offset = self.position, 0
                if not _segment(self.directory, self._first).exists():
                    log.error("log %s: segment %d is missing", self.directory, self._first)
                    self.skipped += self.backlog  # lost: counted, not waited for forever
                    self.position = self.committed
                continue
            plen, tlen = _HEAD.unpack_from(chunk)
            if _HEAD.size + tlen + plen > len(chunk):  # one message longer than a chunk
                chunk = os.pread(fd, _HEAD.size + tlen + plen, self._offset)
            i = 0
            room = want = min(limit - len(out), self.backlog)
            while room and len(chunk) - i >= _HEAD.size:
                plen, tlen = _HEAD.unpack_from(chunk, i)
                start = i + _HEAD.size
                end = start + tlen + plen
                if end > len(chunk):
                    break
                out.append((chunk[start : start + tlen].decode("utf-8"), chunk[start + tlen : end]))
                i = end
                room -= 1
            self._offset += i
            self.position += want - room
        return out

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(_segment(self.directory, self._first), os.O_RDONLY)
        return self._fd

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def skip(self, n: int) -> int:
        """Read past up to ``n`` messages without returning them (counted in
        :attr:`skipped`): how a source sheds its oldest. How many it skipped."""
        done = 0
        while done < n:
            got = len(self.read(min(n - done, 4096)))
            if not got:
                break
            done += got
        self.skipped += done
        return done

    def release(self) -> None:
        """Remove the segments read past (everything before :attr:`position`)."""
        if self._released == self._first:
            return
        self._released = self._first
        for path in self.directory.glob("*.log"):
            stem = path.stem
            if stem.isdigit() and int(stem) < self._first:
                path.unlink(missing_ok=True)

    def close(self, *, remove: bool = True) -> None:
        """Close its file (and remove the log: it does not outlive its source yet)."""
        self._close_fd()
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)
