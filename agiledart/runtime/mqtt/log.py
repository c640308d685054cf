"""A source's durable log: the messages it took from a broker, on the peer's disk.

Messages are appended as they arrive and written in group commits (one write per
batch the connection read, :meth:`SourceLog.commit`); a QoS 1 message is acknowledged
to the broker only after its commit, so what the broker forgets, the peer holds. The
source reads the log behind the writer at its own pace (:meth:`SourceLog.read`): the
engine's backpressure is this bound on disk (``max_bytes``), never the broker's queue.
What does not fit is shed and counted (:attr:`SourceLog.shed`).

A message has a position (0, 1, 2, ... in arrival order); positions before
:meth:`SourceLog.release`'s are given up and their segment files removed. A checkpoint
can record a position and release only what an epoch committed, so the log can replay
what came after it; today the source releases what it has handed on.

On disk: segment files ``<first position>.log`` of frames
``[u32 payload length][u16 topic length][topic][payload]``. The writer is not fsynced
per commit (a commit survives the peer's process dying, not the machine's power):
``fsync=True`` makes each commit durable against both, at a disk flush per commit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SourceLog", "SourceLogStatistics"]

log = logging.getLogger(__name__)

_HEAD = struct.Struct("!IH")
#: a segment is closed and a new one begun once it holds this many bytes
SEGMENT_BYTES = 8 << 20
#: bytes read from a segment at a time
READ_CHUNK = 1 << 20


@dataclass(slots=True)
class _Segment:
    first: int  #: position of its first message
    path: Path
    size: int = 0  #: bytes committed to it
    count: int = 0  #: messages committed to it


@dataclass(slots=True)
class SourceLogStatistics:
    appended: int = 0  #: messages in the log so far (committed or pending)
    committed: int = 0  #: of them, written
    read: int = 0  #: of them, read back
    shed: int = 0  #: messages refused: the log was full (or the disk failed)
    commits: int = 0  #: group commits (writes)
    bytes: int = 0  #: bytes on disk now (segments not yet released)


class SourceLog:
    """An append-only, segmented, bounded log of ``(topic, payload)`` messages."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        segment_bytes: int = SEGMENT_BYTES,
        fsync: bool = False,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.stats = SourceLogStatistics()
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.log"):  # a log is never reopened (yet)
            stale.unlink()
        self._segments: list[_Segment] = []
        self._fd: int | None = None  #: the last segment's, for appending
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._read_seg = 0  #: index in _segments of the segment being read
        self._read_off = 0  #: byte offset in it
        self._read_fd: tuple[Path, int] | None = None
        self._closed = False

    # -- writing ----------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Messages in the log not read yet, committed or not."""
        return self.backlog + len(self._pending)

    def append(self, topic: str, payload: bytes, *, limit: int | None = None) -> bool:
        """Queue a message for the next commit; False (counted as shed) when the log
        is full: ``max_bytes``, or ``limit`` messages :attr:`held`."""
        st = self.stats
        t = topic.encode("utf-8")
        frame = _HEAD.pack(len(payload), len(t)) + t + payload
        full = st.bytes + self._pending_bytes + len(frame) > self.max_bytes
        if self._closed or full or (limit is not None and self.held >= limit):
            st.shed += 1
            return False
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        st.appended += 1
        return True

    def commit(self) -> int:
        """Write what was appended since the last commit, in one write; how many
        messages that was. A failing disk sheds them (counted) and says 0."""
        frames, self._pending = self._pending, []
        size, self._pending_bytes = self._pending_bytes, 0
        if not frames:
            return 0
        st = self.stats
        try:
            seg = self._writable()
            data = b"".join(frames)
            view = memoryview(data)
            while view:
                view = view[os.write(seg[1], view) :]
            if self.fsync:
                os.fsync(seg[1])
        except OSError as exc:
            log.error(
                "source log %s: a commit failed, %d messages shed: %s",
                self.directory,
                len(frames),
                exc,
            )
            if self._fd is not None:  # no partial frame stays behind
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._segments[-1].size)
            st.shed += len(frames)
            st.appended -= len(frames)
            return 0
        segment = seg[0]
        segment.size += size
        segment.count += len(frames)
        st.committed += len(frames)
        st.bytes += size
        st.commits += 1
        return len(frames)

    def _writable(self) -> tuple[_Segment, int]:
        last = self._segments[-1] if self._segments else None
        if last is None or last.size >= self.segment_bytes or self._fd is None:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            last = _Segment(self.stats.committed, self.directory / f"{self.stats.committed}.log")
            self._fd = os.open(last.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._segments.append(last)
        return last, self._fd

    # -- reading ----------------------------------------------------------------------

    @property
    def position(self) -> int:
        """The position of the next message :meth:`read` returns."""
        return self.stats.read

    @property
    def backlog(self) -> int:
        """Committed messages not read yet."""
        return self.stats.committed - self.stats.read

    def read(self, limit: int) -> list[tuple[str, bytes]]:
        """Up to ``limit`` committed messages from :attr:`position` on."""
        out: list[tuple[str, bytes]] = []
        while len(out) < limit and self.backlog:
            seg = self._segments[self._read_seg]
            if self._read_off >= seg.size:  # read to the end of a closed segment
                self._read_seg += 1
                self._read_off = 0
                continue
            fd = self._reader(seg.path)
            chunk = os.pread(fd, min(READ_CHUNK, seg.size - self._read_off), self._read_off)
            plen, tlen = _HEAD.unpack_from(chunk)
            if _HEAD.size + tlen + plen > len(chunk):  # one message longer than a chunk
                chunk = os.pread(fd, _HEAD.size + tlen + plen, self._read_off)
            i, before = 0, len(out)
            while len(out) < limit and len(chunk) - i >= _HEAD.size:
                plen, tlen = _HEAD.unpack_from(chunk, i)
                start = i + _HEAD.size
                end = start + tlen + plen
                if end > len(chunk):
                    break
                out.append((chunk[start : start + tlen].decode("utf-8"), chunk[start + tlen : end]))
                i = end
            self._read_off += i
            self.stats.read += len(out) - before
        return out

    def _reader(self, path: Path) -> int:
        if self._read_fd is None or self._read_fd[0] != path:
            if self._read_fd is not None:
                os.close(self._read_fd[1])
            self._read_fd = (path, os.open(path, os.O_RDONLY))
        return self._read_fd[1]

    def skip(self, n: int) -> int:
        """Read past up to ``n`` messages without returning them (counted as shed):
        how a source sheds its oldest. How many it skipped."""
        skipped = 0
        while skipped < n:
            got = len(self.read(min(n - skipped, 4096)))
            if not got:
                break
            skipped += got
        self.stats.shed += skipped
        return skipped

    def release(self, position: int) -> None:
        """Give up the messages before ``position`` (at most :attr:`position`):
        segments holding only those are removed."""
        position = min(position, self.stats.read)
        while len(self._segments) > 1 and self._read_seg > 0:
            seg = self._segments[0]
            if seg.first + seg.count > position:
                return
            if self._read_fd is not None and self._read_fd[0] == seg.path:
                os.close(self._read_fd[1])
                self._read_fd = None
            seg.path.unlink(missing_ok=True)
            self.stats.bytes -= seg.size
            del self._segments[0]
            self._read_seg -= 1

    def close(self, *, remove: bool = True) -> None:
        """Close its files (and remove them: the log does not outlive its source yet)."""
        self._closed = True
        for fd in (self._fd, None if self._read_fd is None else self._read_fd[1]):
            if fd is not None:
                os.close(fd)
        self._fd = self._read_fd = None
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)
