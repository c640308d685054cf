"""Credit-based flow control between two operator instances (docs/architecture.md).

Theory of operation: the receiver owns a bounded input queue of ``capacity`` units
(records or batches: the caller picks one and sticks to it). The sender may only send
what it holds credit for. The receiver starts the sender with ``capacity`` credits and
grants more only as its queue drains, keeping the invariant

    queued + outstanding <= capacity

where *outstanding* is credit granted but not yet spent by arriving data. Data in
flight is always covered by outstanding credit, so the queue can never overflow and
memory stays bounded whatever the interleaving. Grants are coalesced (``min_grant``)
so that a busy receiver does not send one grant per record.
"""

from __future__ import annotations

from dataclasses import dataclass

from agiledart.dataplane.errors import DataPlaneUsageError, ProtocolError, WouldBlock

__all__ = [
    "CreditGrantor",
    "CreditGrantorStatistics",
    "CreditWindow",
    "CreditWindowStatistics",
]


@dataclass(frozen=True, slots=True)
class CreditWindowStatistics:
    available: int
    consumed: int  # total units spent
    granted: int  # total units granted after the initial window
    blocked: int  # consume() calls refused with WouldBlock


class CreditWindow:
    """Sender side: the credit this sender holds for one downstream edge."""

    __slots__ = ("_blocked", "_consumed", "_granted", "available", "limit")

    def __init__(self, initial: int, *, limit: int | None = None) -> None:
        if initial < 0:
            msg = f"initial credits must be >= 0, got {initial}"
            raise DataPlaneUsageError(msg)
        self.available = initial
        self.limit = initial if limit is None else limit
        if self.limit < initial:
            msg = "credit limit must be >= initial credits"
            raise DataPlaneUsageError(msg)
        self._consumed = 0
        self._granted = 0
        self._blocked = 0

    def can_send(self, n: int = 1) -> bool:
        return n <= self.available

    def consume(self, n: int = 1) -> None:
        """Spend ``n`` credits; raise :class:`WouldBlock` if the window is too small."""
        if n < 0:
            msg = f"cannot consume {n} credits"
            raise DataPlaneUsageError(msg)
        if n > self.available:
            self._blocked += 1
            msg = f"need {n} credits, have {self.available}"
            raise WouldBlock(msg)
        self.available -= n
        self._consumed += n

    def grant(self, n: int) -> None:
        """Apply a grant from the receiver; more than ``limit`` held is a protocol error."""
        if type(n) is not int or n < 1:
            msg = f"credit grant must be a positive int, got {n!r}"
            raise ProtocolError(msg)
        if self.available + n > self.limit:
            msg = (
                f"grant of {n} would hold {self.available + n} credits, over the limit {self.limit}"
            )
            raise ProtocolError(msg)
        self.available += n
        self._granted += n

    def statistics(self) -> CreditWindowStatistics:
        return CreditWindowStatistics(self.available, self._consumed, self._granted, self._blocked)


@dataclass(frozen=True, slots=True)
class CreditGrantorStatistics:
    capacity: int
    queued: int
    outstanding: int  # granted, not yet covered by arrived data
    received: int  # total units arrived
    granted: int  # total units granted after the initial window
    grants: int  # number of grant messages produced


class CreditGrantor:
    """Receiver side: decides how much credit to hand back as the input queue drains."""

    __slots__ = (
        "_granted",
        "_grants",
        "_received",
        "capacity",
        "min_grant",
        "outstanding",
        "queued",
    )

    def __init__(self, capacity: int, *, min_grant: int | None = None) -> None:
        if capacity < 1:
            msg = f"capacity must be >= 1, got {capacity}"
            raise DataPlaneUsageError(msg)
        if min_grant is None:
            min_grant = max(1, capacity // 4)
        if not 1 <= min_grant <= capacity:
            msg = f"min_grant must be in [1, {capacity}], got {min_grant}"
            raise DataPlaneUsageError(msg)
        self.capacity = capacity
        self.min_grant = min_grant
        self.queued = 0
        self.outstanding = capacity  # the sender's initial window
        self._received = 0
        self._granted = 0
        self._grants = 0

    @property
    def initial_credits(self) -> int:
        """What the sender's :class:`CreditWindow` must start with."""
        return self.capacity

    def on_receive(self, n: int) -> None:
        """``n`` units arrived and were queued; over the sender's credit: a ProtocolError."""
        if n < 0 or n > self.outstanding:
            msg = f"sender sent {n} units holding only {self.outstanding} credits"
            raise ProtocolError(msg)
        self.outstanding -= n
        self.queued += n
        self._received += n

    def on_drain(self, n: int) -> None:
        """``n`` units left the input queue (taken by the operator)."""
        if n < 0 or n > self.queued:
            msg = f"cannot drain {n} units, {self.queued} queued"
            raise DataPlaneUsageError(msg)
        self.queued -= n

    def take_grant(self) -> int:
        """Credits to send back now (0: nothing worth a message yet)."""
        free = self.capacity - self.queued - self.outstanding
        if free < self.min_grant:
            return 0
        self.outstanding += free
        self._granted += free
        self._grants += 1
        return free

    def statistics(self) -> CreditGrantorStatistics:
        return CreditGrantorStatistics(
            self.capacity,
            self.queued,
            self.outstanding,
            self._received,
            self._granted,
            self._grants,
        )
