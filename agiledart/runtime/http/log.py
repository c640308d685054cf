"""The webhook source's durable log: the requests it took, on the peer's disk.

A thin layer over the mqtt source's log (:mod:`agiledart.runtime.mqtt.log`: segments,
group commits, positions, release below a committed epoch's position). One frame per
request: its payload the request's records in JSON (its body as it came, when the
source took the records unchanged: no encoding on the way in), its topic
``"<seq>:<idempotency key>"``, where ``seq`` is the number of records logged before
it. So a request is in the log whole or not at all (the log cuts a torn frame when
opened again: a request whose write the peer's death cut short was never answered
2xx, and its client sends it again), and a record count (what a checkpoint records,
and ``count``) finds the frame it begins at.

Theory of operation. The receiver appends a request (:meth:`RequestLog.offer`) and
awaits :meth:`RequestLog.commit`: the first waiter of an event-loop turn schedules
one write for every request appended in that turn (a group commit), and all of them
are answered once it is on disk. Opening a log reads the topics of what it retains
(from the segment holding the last committed epoch's position on) to find the
frame a record count begins at, and the idempotency keys it holds. What was there
when it opened is read from the disk (a replay); what this process commits is also
kept in memory until read (at most ``limit`` records), so reading it costs no decoding.

Idempotency keys: the last ``keys`` keys taken are kept in memory (the oldest
forgotten first); a log opened again (its peer restarted, or the app recovered)
finds those of the requests it retains. A request with a key among them is answered
as taken and not logged again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import struct
from collections import OrderedDict, deque
from collections.abc import Sequence
from enum import Enum
from pathlib import Path

from agiledart.operators import Record
from agiledart.runtime.mqtt.log import SEGMENT_BYTES, LogReader, LogWriter, segments

__all__ = ["Offer", "RequestLog", "http_log_dir"]

log = logging.getLogger(__name__)

_HEAD = struct.Struct("!IH")  # the frame head of agiledart.runtime.mqtt.log
#: the longest ``Idempotency-Key`` taken (bytes)
MAX_KEY = 200


def http_log_dir(root: Path, app_id: str | None, source_id: str) -> Path:
    """Where a webhook source logs under ``root`` (``<state dir>/http``): the same
    directory for every generation of app ``app_id`` (a durable log), or, without an
    app, a new one (removed when its source ends)."""
    if app_id is None:
        return root / "once" / f"{source_id}-{secrets.token_hex(6)}"
    return root / "apps" / app_id / source_id


class Offer(Enum):
    """What became of a request offered to the log."""

    TAKEN = "taken"  #: appended: answered once :meth:`RequestLog.commit` returns True
    SEEN = "seen"  #: its key is in the retained log: answered, not logged again
    FULL = "full"  #: past ``limit`` unread records or ``max_bytes`` on disk (429)


def _records(payload: bytes) -> list[Record]:
    value = json.loads(payload)
    return value if isinstance(value, list) else [value]


def _topic(topic: str) -> tuple[int, str]:
    seq, _, key = topic.partition(":")
    return int(seq), key


class RequestLog:
    """The log of one webhook source, read on from record ``start`` (see the module)."""

    def __init__(
        self,
        directory: Path,
        *,
        start: int,
        limit: int,
        max_bytes: int,
        keys: int,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        self.directory = directory
        self.limit = limit  #: records logged and not yet read, at most
        self.max_keys = keys
        self._writer = w = LogWriter(directory, max_bytes=max_bytes, segment_bytes=segment_bytes)
        self._keys: OrderedDict[str, None] = OrderedDict()
        #: records before the next frame to read, and before the next one appended
        self.records_read = self.records_logged = start
        frame = self._find(start)
        self.reader = LogReader(directory, start=frame)  #: reads what was there (a replay)
        self.reader.committed = self._disk_end = w.committed
        self.position = self.reader.position  #: the next frame to read
        w.reader_at(frame)
        self._pending = self._pending_frames = 0  #: appended, not yet committed
        self._pending_bytes = 0
        self._appended: list[tuple[int, list[Record]]] = []  #: (seq, records), uncommitted
        self._tail: deque[tuple[int, list[Record]]] = deque()  #: committed here, unread
        self._commit: asyncio.Future[bool] | None = None
        self._batch_frames = 1  #: frames to read for a batch (from the last request's size)

    def _find(self, start: int) -> int:
        """The frame record ``start`` begins at (learning the retained keys and how
        many records are logged on the way)."""
        firsts = segments(self.directory)
        committed = self._writer.committed
        if not firsts:
            return committed
        scan = LogReader(self.directory, start=firsts[0])
        scan.committed = committed
        frame, found, last = scan.position, None, None
        while batch := scan.read(1024):
            for topic, payload in batch:
                seq, key = _topic(topic)
                if found is None and seq >= start:
                    found = frame
                    if seq != start:
                        log.error("log %s: no request begins at record %d", self.directory, start)
                        self.records_read = seq
                if key:
                    self._remember(key)
                last = (seq, payload)
                frame += 1
        scan.close(remove=False)
        if last is not None:
            seq, payload = last
            self.records_logged = max(start, seq + len(_records(payload)))
        return committed if found is None else found

    def _remember(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    @property
    def logged(self) -> int:
        """Records logged or being logged (counted from the app's first: toward ``count``)."""
        return self.records_logged

    @property
    def backlog(self) -> int:
        """Records logged and not yet read."""
        return self.records_logged - self._pending - self.records_read

    def seen(self, key: str) -> bool:
        return bool(key) and key in self._keys

    def offer(self, records: Sequence[Record], key: str = "", body: bytes | None = None) -> Offer:
        """Append a request's records, all or none (see :class:`Offer`); ``body``: the
        request's JSON, when it holds exactly ``records``."""
        if self.seen(key):
            return Offer.SEEN
        w = self._writer
        payload = body if body is not None else json.dumps(records).encode()
        topic = f"{self.records_logged}:{key}"
        size = _HEAD.size + len(topic.encode()) + len(payload)
        if self.records_logged + len(records) - self.records_read > self.limit or (
            w.disk_bytes + self._pending_bytes + size > w.max_bytes
        ):
            return Offer.FULL
        w.append(topic, payload)
        self._appended.append((self.records_logged, list(records)))
        self._pending += len(records)
        self._pending_frames += 1
        self._pending_bytes += size
        self.records_logged += len(records)
        if key:
            self._remember(key)
        return Offer.TAKEN

    async def commit(self) -> bool:
        """Wait for the group commit of what was appended: True once it is on disk."""
        if self._commit is None:
            loop = asyncio.get_running_loop()
            self._commit = loop.create_future()
            loop.call_soon(self._flush)
        return await asyncio.shield(self._commit)

    def _flush(self) -> None:
        done, self._commit = self._commit, None
        frames, lost = self._pending_frames, self._pending
        self._pending = self._pending_frames = self._pending_bytes = 0
        appended, self._appended = self._appended, []
        ok = self._writer.commit() == frames
        if ok:
            self._tail.extend(appended)
        else:  # the disk failed: what was appended is shed (its keys stay: rare)
            self.records_logged -= lost
        if done is not None and not done.done():
            done.set_result(ok)

    def read(self, limit: int) -> list[Record]:
        """About ``limit`` committed records (whole requests) from :attr:`position`."""
        out: list[Record] = []
        if self.position < self._disk_end:  # a replay of what the log held when opened
            for topic, payload in self.reader.read(self._batch_frames):
                records = _records(payload)
                self.records_read = _topic(topic)[0] + len(records)
                out.extend(records)
                self._batch_frames = max(1, limit // max(1, len(records)))
            self.position = self.reader.position
            return out
        tail = self._tail
        while tail and len(out) < limit:
            seq, records = tail.popleft()
            self.records_read = seq + len(records)
            out.extend(records)
            self.position += 1
        return out

    def read_to(self, released: int | None) -> None:
        """The frames before :attr:`position` are handed on; remove the segments
        wholly before frame ``released`` (None: :attr:`position`)."""
        released = self.position if released is None else released
        held = self._writer.disk_bytes
        self._writer.reader_at(self.position, released)
        if self._writer.disk_bytes == held:  # no segment let go of: none to remove
            return
        firsts = segments(self.directory)
        keep = max((f for f in firsts if f <= released), default=None)
        for first in firsts:
            if keep is not None and first < keep:
                (self.directory / f"{first}.log").unlink(missing_ok=True)

    def close(self, *, remove: bool) -> None:
        self._writer.close()
        self.reader.close(remove=remove)
