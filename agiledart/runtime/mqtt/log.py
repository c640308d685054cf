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
[payload]``; the writer begins a new one past ``segment_bytes``.

A log outlives the processes that write and read it: a writer opened on a directory
that holds segments continues after their last whole frame (a torn tail is cut off),
and a reader opened at a position seeks to it. So the position a checkpoint records
can be replayed from, whoever restarts. Segments are removed only below a position
the caller says is done with (:meth:`LogReader.release`): the last read one, or, for
a checkpointed source, the position of the last committed epoch.
Commits are not fsynced (they survive the peer's processes dying, not the
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

__all__ = ["LogReader", "LogWriter", "scan", "segments"]

log = logging.getLogger(__name__)

_HEAD = struct.Struct("!IH")
#: a segment is closed and a new one begun once it holds this many bytes
SEGMENT_BYTES = 8 << 20
#: bytes read from a segment at a time
READ_CHUNK = 1 << 20


def _segment(directory: Path, first: int) -> Path:
    return directory / f"{first}.log"


def segments(directory: Path) -> list[int]:
    """The first positions of the segments in ``directory``, in order."""
    if not directory.is_dir():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())


def scan(path: Path, limit: int | None = None) -> tuple[int, int]:
    """``(frames, bytes)``: how many whole frames a segment begins with (at most
    ``limit``), and the bytes they take."""
    frames = offset = 0
    with path.open("rb") as f:
        data = b""
        while limit is None or frames < limit:
            if len(data) < _HEAD.size:
                more = f.read(READ_CHUNK)
                if not more:
                    break
                data += more
                continue
            plen, tlen = _HEAD.unpack_from(data)
            size = _HEAD.size + tlen + plen
            if len(data) < size:
                more = f.read(max(READ_CHUNK, size - len(data)))
                if not more:
                    break
                data += more
                continue
            data = data[size:]
            offset += size
            frames += 1
    return frames, offset


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
        self._recover()

    def _recover(self) -> None:
        """Continue a log already in the directory, after its last whole frame."""
        firsts = segments(self.directory)
        for first in firsts[:-1]:
            size = _segment(self.directory, first).stat().st_size
            self._segments.append(_Segment(first, size))
        if not firsts:
            return
        last = firsts[-1]
        path = _segment(self.directory, last)
        frames, size = scan(path)
        if size < path.stat().st_size:  # a commit torn by the process dying: never acked
            os.truncate(path, size)
        self._segments.append(_Segment(last, size))
        self.committed = last + frames
        self.read = firsts[0]  # until the reader says how far it is

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
        if self._fd is None and self._segments and self._segments[-1].size < self.segment_bytes:
            seg = self._segments[-1]  # a recovered log: append to its last segment
            self._fd = os.open(_segment(self.directory, seg.first), os.O_WRONLY | os.O_APPEND)
            return seg, self._fd
        if self._fd is None or self._segments[-1].size >= self.segment_bytes:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            seg = _Segment(self.committed)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            self._fd = os.open(_segment(self.directory, seg.first), flags, 0o600)
            self._segments.append(seg)
        return self._segments[-1], self._fd

    def reader_at(self, position: int, released: int | None = None) -> None:
        """The reader has read up to ``position``, and removed the segments wholly
        before ``released`` (default: ``position``)."""
        self.read = max(self.read, position)
        released = position if released is None else int(released)
        while len(self._segments) > 1 and self._segments[1].first <= released:
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
        self._asked: int | None = None  #: the position :meth:`release` was last given
        self.seek(start)

    def seek(self, position: int) -> None:
        """Read on from ``position`` (a checkpoint's) in the segments on disk; what is
        missing from the log before it is lost, logged and counted in ``skipped``."""
        self._close_fd()
        self.skipped = 0  # what was skipped before ``position`` is counted in it
        firsts = segments(self.directory)
        before = [f for f in firsts if f <= position]
        self.position = self.committed = self._released = self._first = position
        self._offset = 0
        if not before:
            if firsts:  # the log begins after the position: what came between is gone
                log.error("log %s: positions %d-%d are gone", self.directory, position, firsts[0])
                self.skipped += firsts[0] - position
                self.position = self.committed = self._released = self._first = firsts[0]
            return
        first = before[-1]
        frames, offset = scan(_segment(self.directory, first), position - first)
        self._first = self._released = first
        self._offset = offset
        self.position = self.committed = first + frames
        if self.position < position:
            log.error("log %s: it ends at %d, before %d", self.directory, self.position, position)

    @property
    def released(self) -> int:
        """The first position of the oldest segment kept."""
        return self._released

    @property
    def backlog(self) -> int:
        """Committed messages not read yet."""
        return self.committed - self.position

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

    def release(self, position: int | None = None) -> None:
        """Remove the segments wholly before ``position`` (default: :attr:`position`,
        all read past); the one holding it stays, and so does everything after."""
        if position is not None and position == self._asked:
            return  # asked again (every batch, between two commits)
        self._asked = position
        if position is None or position >= self._first:
            keep = self._first  # the segment being read holds the position, or one before
        else:
            before = [f for f in segments(self.directory) if f <= position]
            keep = before[-1] if before else self._released
        if keep <= self._released:
            return
        self._released = keep
        for first in segments(self.directory):
            if first < keep:
                _segment(self.directory, first).unlink(missing_ok=True)

    def close(self, *, remove: bool = True) -> None:
        """Close its file (and, with ``remove``, the log: its source has ended)."""
        self._close_fd()
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)
