"""Overload policy at a source: what happens when tuples arrive faster than credit.

A :class:`SourceBuffer` is the bounded queue between an external source (sensor, MQTT,
file) and the edge's :class:`~agiledart.dataplane.batcher.Batcher`. When it is full:

* ``BLOCK`` — backpressure: ``send_nowait`` raises :class:`WouldBlock` and the driver
  stops reading its input until space frees. Each tuple that had to wait is counted
  once in ``delayed`` (however many times it is retried).
* ``SHED_NEWEST`` — the arriving tuple is dropped; counted in ``shed``.
* ``SHED_OLDEST`` — the oldest queued tuple is evicted to make room; counted in ``shed``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from agiledart.dataplane.batch import Record
from agiledart.dataplane.errors import ClosedResourceError, DataPlaneUsageError, WouldBlock

__all__ = ["OverloadPolicy", "SourceBuffer", "SourceBufferStatistics"]


class OverloadPolicy(enum.Enum):
    BLOCK = "block"
    SHED_NEWEST = "shed-newest"
    SHED_OLDEST = "shed-oldest"


@dataclass(frozen=True, slots=True)
class SourceBufferStatistics:
    capacity: int
    queued: int
    accepted: int
    shed: int
    delayed: int
    closed: bool


class SourceBuffer:
    """Bounded FIFO with an overload policy; sans-IO (the driver does the waiting)."""

    __slots__ = (
        "_accepted",
        "_blocked",
        "_closed",
        "_delayed",
        "_q",
        "_shed",
        "capacity",
        "policy",
    )

    def __init__(self, capacity: int, policy: OverloadPolicy = OverloadPolicy.BLOCK) -> None:
        if capacity < 1:
            msg = f"capacity must be >= 1, got {capacity}"
            raise DataPlaneUsageError(msg)
        self.capacity = capacity
        self.policy = policy
        self._q: deque[Record] = deque()
        self._accepted = 0
        self._shed = 0
        self._delayed = 0
        self._blocked = False
        self._closed = False

    def __len__(self) -> int:
        return len(self._q)

    def send_nowait(self, record: Record) -> bool:
        """Offer one tuple. True: queued. False: shed. Raises WouldBlock under BLOCK when full."""
        if self._closed:
            msg = "source buffer is closed"
            raise ClosedResourceError(msg)
        q = self._q
        if len(q) >= self.capacity:
            policy = self.policy
            if policy is OverloadPolicy.BLOCK:
                if not self._blocked:
                    self._blocked = True
                    self._delayed += 1
                msg = "source buffer full"
                raise WouldBlock(msg)
            self._shed += 1
            if policy is OverloadPolicy.SHED_NEWEST:
                return False
            q.popleft()
        self._blocked = False
        q.append(record)
        self._accepted += 1
        return True

    def receive_nowait(self) -> Record:
        """Take the oldest tuple; WouldBlock when empty, ClosedResourceError once closed+drained."""
        if self._q:
            return self._q.popleft()
        if self._closed:
            msg = "source buffer is closed and drained"
            raise ClosedResourceError(msg)
        msg = "source buffer empty"
        raise WouldBlock(msg)

    def take(self, n: int) -> list[Record]:
        """Take up to ``n`` tuples (e.g. as many as the credit window allows)."""
        q = self._q
        k = min(n, len(q))
        return [q.popleft() for _ in range(k)]

    def close(self) -> None:
        """No more tuples will be sent; queued ones can still be received."""
        self._closed = True

    def statistics(self) -> SourceBufferStatistics:
        return SourceBufferStatistics(
            self.capacity, len(self._q), self._accepted, self._shed, self._delayed, self._closed
        )
