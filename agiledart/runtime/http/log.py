"""The webhook source's durable log: the records its requests brought, on the peer's disk.

A thin layer over the mqtt source's log (:mod:`agiledart.runtime.mqtt.log`: segments,
group commits, positions, release below a committed epoch's position). One frame per
record (its payload the record in msgpack), so a log position counts records: the
position a checkpoint records, and ``count``, are the same number. A request's
records are appended whole (:meth:`RequestLog.offer`, all of them or none) and the
last frame of each request carries a mark (its topic ``"." + idempotency key``).

Theory of operation. The receiver appends a request's frames and awaits
:meth:`RequestLog.commit`: the first waiter of an event-loop turn schedules one write
for every request appended in that turn (a group commit), and all of them are
answered once it is on disk. Opening a log cuts a torn tail, and then any frames
after the last request mark: a request whose write the peer's death cut short was
never answered 2xx, and its client sends it again whole.

Idempotency keys: the last ``keys`` keys taken are kept in memory (the oldest
forgotten first); a log opened again (its peer restarted) finds those of the requests
in the retained log (from the last committed epoch's position on). A request with a
key among them is answered as taken and not logged again.
"""

from __future__ import annotations

import asyncio
import secrets
import struct
from collections import OrderedDict
from collections.abc import Sequence
from enum import Enum
from pathlib import Path

import msgpack

from agiledart.operators import Record
from agiledart.runtime.mqtt.log import LogReader, LogWriter, segments

__all__ = ["Offer", "RequestLog", "http_log_dir"]

_HEAD = struct.Struct("!IH")  # the frame head of agiledart.runtime.mqtt.log
_END = "."  #: the topic of a request's last frame begins with it
#: the longest ``Idempotency-Key`` taken (bytes)
MAX_KEY = 200


class Offer(Enum):
    """What became of a request offered to the log."""

    TAKEN = "taken"  #: appended: answered once :meth:`RequestLog.commit` returns True
    SEEN = "seen"  #: its key is in the retained log: answered, not logged again
    FULL = "full"  #: past ``limit`` unread records or ``max_bytes`` on disk (429)


def http_log_dir(root: Path, app_id: str | None, source_id: str) -> Path:
    """Where a webhook source logs under ``root`` (``<state dir>/http``): the same
    directory for every generation of app ``app_id`` (a durable log), or, without an
    app, a new one (removed when its source ends)."""
    if app_id is None:
        return root / "once" / f"{source_id}-{secrets.token_hex(6)}"
    return root / "apps" / app_id / source_id


def _cut_partial_request(directory: Path) -> None:
    """Cut the frames after the last request mark in the log's last segment (a
    request torn by the peer dying: the writer keeps only whole frames)."""
    firsts = segments(directory)
    if not firsts:
        return
    path = directory / f"{firsts[-1]}.log"
    data = path.read_bytes()
    offset = keep = 0
    while len(data) - offset >= _HEAD.size:
        plen, tlen = _HEAD.unpack_from(data, offset)
        end = offset + _HEAD.size + tlen + plen
        if end > len(data):
            break
        if data[offset + _HEAD.size : offset + _HEAD.size + tlen].startswith(_END.encode()):
            keep = end
        offset = end
    if keep < len(data):  # a segment begins with a commit, a commit with a request
        with path.open("r+b") as f:
            f.truncate(keep)


class RequestLog:
    """The log of one webhook source (see the module)."""

    def __init__(
        self, directory: Path, *, start: int, limit: int, max_bytes: int, keys: int
    ) -> None:
        _cut_partial_request(directory)
        self.directory = directory
        self.limit = limit  #: records logged and not yet read, at most
        self.max_keys = keys
        self._writer = LogWriter(directory, max_bytes=max_bytes, start=start)
        self.reader = LogReader(directory, start=start)
        self.reader.committed = self._writer.committed
        self._writer.reader_at(self.reader.position, start)
        self._pending = 0  #: records appended, not yet committed
        self._pending_bytes = 0
        self._keys: OrderedDict[str, int] = OrderedDict()  #: key -> its request's end
        self._commit: asyncio.Future[bool] | None = None
        self._find_keys()

    def _find_keys(self) -> None:
        scan = LogReader(self.directory, start=self.reader.position)
        scan.committed = self._writer.committed
        while batch := scan.read(4096):
            for i, (topic, _) in enumerate(batch, start=scan.position - len(batch) + 1):
                if len(topic) > 1 and topic.startswith(_END):
                    self._remember(topic[1:], i)
        scan.close(remove=False)

    def _remember(self, key: str, end: int) -> None:
        self._keys[key] = end
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    @property
    def logged(self) -> int:
        """Records logged or being logged (positions are absolute: toward ``count``)."""
        return self._writer.committed + self._pending

    @property
    def backlog(self) -> int:
        """Records committed and not yet read."""
        return self.reader.backlog

    def offer(self, records: Sequence[Record], key: str = "") -> Offer:
        """Append a request's records, all or none (see :class:`Offer`)."""
        if key and key in self._keys:
            return Offer.SEEN
        w = self._writer
        payloads = [msgpack.packb(r) for r in records]
        size = sum(len(p) for p in payloads) + _HEAD.size * len(payloads) + len(key) + 1
        unread = w.committed + self._pending - self.reader.position
        if unread + len(payloads) > self.limit or (
            w.disk_bytes + self._pending_bytes + size > w.max_bytes
        ):
            return Offer.FULL
        for i, p in enumerate(payloads):
            w.append(_END + key if i == len(payloads) - 1 else "", p)
        self._pending += len(payloads)
        self._pending_bytes += size
        if key:
            self._remember(key, self.logged)
        return Offer.TAKEN

    async def commit(self) -> bool:
        """Wait for the group commit of what was appended: True once it is on disk."""
        if self._commit is None:
            self._commit = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(self._flush)
        return await asyncio.shield(self._commit)

    def _flush(self) -> None:
        done, self._commit = self._commit, None
        want, self._pending, self._pending_bytes = self._pending, 0, 0
        ok = self._writer.commit() == want
        self.reader.committed = self._writer.committed
        if not ok:  # the disk failed: what was appended is shed; forget its keys
            for key in [k for k, end in self._keys.items() if end > self._writer.committed]:
                del self._keys[key]
        if done is not None and not done.done():
            done.set_result(ok)

    def read(self, limit: int) -> list[Record]:
        """Up to ``limit`` committed records from :attr:`reader`'s position on."""
        return [msgpack.unpackb(p) for _, p in self.reader.read(limit)]

    def read_to(self, released: int | None) -> None:
        """The records before the reader's position are handed on; remove the
        segments wholly before ``released`` (None: the reader's position)."""
        position = self.reader.position
        self.reader.release(released)
        self._writer.reader_at(position, position if released is None else released)

    def close(self, *, remove: bool) -> None:
        self._writer.close()
        self.reader.close(remove=remove)
