"""Acknowledgements held until an epoch commits, and the broker's redeliveries told
from new messages: what makes a checkpointed mqtt source exactly-once wherever it runs.

A checkpointed app's source has its own broker session (:mod:`.pool`: a client id
fixed by app, source and broker, clean start off), so its session follows it from
peer to peer. Its ingest process logs each QoS 1 message but does not acknowledge it:
a message is PUBACKed only once the app's checkpoints cover it (its position is below
the last committed epoch's, the ``done`` position the source reports). Until then the
broker holds it too, and it is the copy that survives the peer: when the source's peer
dies for good, the source's next host resumes the session, and the broker redelivers
every message not acknowledged (DUP set, same packet id, first, in order) before the
new ones.

The redeliveries the checkpoint covers are duplicates; the others are the log's tail.
So each log keeps, per position not yet surely acknowledged, the packet id its message
came with (0 for QoS 0), in the file ``acks`` beside the log (:class:`HeldAcks`); the
checkpoint records the ids of the positions before its own that may still be unacked
(:func:`replay_ids`), and a moved source starts its (empty) log at the checkpoint's
position with those ids. A DUP redelivery is a duplicate when it continues, in order,
the ids of the positions already logged (or recorded): it is dropped (and acknowledged
once its position is done); the first redelivery that does not match, or the first
new message, ends the matching for that session.

File ``acks``: ``[u64 first position]`` then ``[u16 packet id]`` per position; it is
appended at every commit of the log and rewritten (a temporary name, renamed) when
acknowledged positions are dropped from its head.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from array import array
from collections import deque
from pathlib import Path
from typing import Any

__all__ = ["ACKS_FILE", "HeldAcks", "expand", "read_acks", "replay_ids", "runs"]

log = logging.getLogger(__name__)

ACKS_FILE = "acks"
_BASE = struct.Struct("!Q")
#: the ``acks`` file is rewritten once its head holds this many dropped positions
COMPACT = 4096


def runs(ids: array[int] | list[int]) -> list[list[int]]:
    """``[[first id, count], ...]``: runs of ids each one more than the last (65535
    wraps to 1; 0 repeats), the form a checkpoint records them in (Mosquitto numbers a
    session's messages in sequence, so a run is usually the whole list)."""
    out: list[list[int]] = []
    last = -1
    for pid in ids:
        nxt = 0 if last == 0 else (last % 0xFFFF) + 1
        if out and pid == nxt:
            out[-1][1] += 1
        else:
            out.append([pid, 1])
        last = pid
    return out


def expand(encoded: list[list[int]]) -> array[int]:
    """The ids :func:`runs` encoded."""
    out = array("H")
    for first, count in encoded:
        pid = int(first)
        for _ in range(int(count)):
            out.append(pid)
            if pid:
                pid = (pid % 0xFFFF) + 1
    return out


def read_acks(directory: Path) -> tuple[int, array[int]]:
    """``(first position, ids)`` in ``directory``'s ``acks`` file (none: ``(0, [])``)."""
    try:
        data = (directory / ACKS_FILE).read_bytes()
    except OSError:
        return 0, array("H")
    if len(data) < _BASE.size:
        return 0, array("H")
    (base,) = _BASE.unpack_from(data)
    body = data[_BASE.size :]
    ids = array("H")
    ids.frombytes(body[: len(body) - len(body) % 2])
    if struct.pack("=H", 1) != struct.pack("!H", 1):
        ids.byteswap()  # stored big-endian
    return base, ids


def replay_ids(directory: Path, position: int) -> list[Any] | None:
    """What a checkpoint at ``position`` records for a moved source: ``[first
    position, runs of ids]`` of the logged positions before ``position`` that may not
    be acknowledged yet (None when the log keeps no ids)."""
    base, ids = read_acks(directory)
    if not ids or position <= base:
        return None
    return [base, runs(ids[: position - base])]


class HeldAcks:
    """One log's held acknowledgements (in its ingest process): the packet id of every
    position not surely acknowledged, those to acknowledge when positions are done, and
    which redeliveries of a resumed session are duplicates."""

    def __init__(
        self,
        directory: Path,
        *,
        committed: int,
        done: int,
        seed: list[Any] | None = None,
    ) -> None:
        self.path = directory / ACKS_FILE
        self.done = done  #: positions below are covered by a committed epoch
        self._keep = done  #: the ids before this position are dropped
        self.base, self.ids = read_acks(directory)
        if self.base + len(self.ids) > committed:  # ids of a commit the log lost
            del self.ids[max(0, committed - self.base) :]
        if not self.ids and seed:  # a moved source: the checkpoint's ids
            self.base, self.ids = int(seed[0]), expand(seed[1])
            del self.ids[max(0, committed - self.base) :]
        if self.base + len(self.ids) < committed:  # a gap: no ids for some of the log
            if self.ids or seed:
                log.warning("%s: no packet ids for positions before %d", self.path, committed)
            self.base, self.ids = committed, array("H")
        #: (position, id) received in this session and not acknowledged
        self.unacked: deque[tuple[int, int]] = deque()
        self.matching = True  #: still among the session's first redeliveries
        self._next: int | None = None  #: the position the next redelivery should be
        self.duplicates = 0  #: redeliveries dropped
        self._rewrite()

    @property
    def end(self) -> int:
        """The position after the last one with an id."""
        return self.base + len(self.ids)

    def new_session(self) -> None:
        """A session began: what the last one received is redelivered if unacked."""
        self.unacked.clear()
        self.matching, self._next = True, None

    def redelivered(self, pid: int) -> int | None:
        """A DUP message with packet id ``pid``: the position it duplicates, else None."""
        if not self.matching or not pid:
            return None
        if self._next is None:
            try:
                at = self.ids.index(pid)
            except ValueError:
                at = -1
        else:
            at = self._next - self.base
            if not (0 <= at < len(self.ids)) or self.ids[at] != pid:
                at = -1
        if at < 0:
            self.matching = False
            return None
        position = self.base + at
        self._next = position + 1
        self.duplicates += 1
        return position

    def fresh(self) -> None:
        """A new message (no DUP): the redeliveries are over."""
        self.matching = False

    def logged(self, first: int, pids: list[int]) -> None:
        """The messages at ``first``, ``first + 1``, ... were committed to the log."""
        if first != self.end:  # never expected: start again from here
            log.warning("%s: ids from %d, the log's from %d", self.path, self.end, first)
            self.base, self.ids = first, array("H")
            self._rewrite()
        new = array("H", pids)
        self.ids.extend(new)
        for i, pid in enumerate(pids):
            if pid:
                self.unacked.append((first + i, pid))
        if struct.pack("=H", 1) != struct.pack("!H", 1):
            new.byteswap()
        try:
            with self.path.open("ab") as f:
                f.write(new.tobytes())
        except OSError as exc:
            log.warning("%s: cannot write ids: %s", self.path, exc)

    def hold(self, position: int, pid: int) -> list[int]:
        """A redelivery matched ``position``: the ids to acknowledge now."""
        if position < self.done:
            return [pid]
        self.unacked.append((position, pid))
        return []

    def release(self, done: int) -> list[int]:
        """Positions below ``done`` are covered by a committed epoch: the ids to
        acknowledge. The ids of the epoch before stay (its acknowledgements may be
        lost with the connection), older ones go."""
        if done <= self.done:
            return []
        out: list[int] = []
        while self.unacked and self.unacked[0][0] < done:
            out.append(self.unacked.popleft()[1])
        self._keep, self.done = self.done, done
        drop = min(self._keep - self.base, len(self.ids))
        if drop >= COMPACT or (drop > 0 and drop >= len(self.ids) // 2):
            del self.ids[:drop]
            self.base += drop
            self._rewrite()
        return out

    def _rewrite(self) -> None:
        ids = array("H", self.ids)
        if struct.pack("=H", 1) != struct.pack("!H", 1):
            ids.byteswap()
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_bytes(_BASE.pack(self.base) + ids.tobytes())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("%s: cannot write ids: %s", self.path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
