"""Which connections a frame server keeps while they are still in the handshake.

Theory of operation
-------------------
Anyone can open a TCP connection; only a holder of the cluster key can finish the
handshake (``frames.py``). So connections still in the handshake get a small budget of
their own, apart from proven sessions, and a keyless flood can only ever compete with
other unproven connections. Within that budget the policy is the one SYN caches and
TLS terminators use against connection floods: never refuse the newcomer, shed the
oldest pending handshake instead. A legitimate client finishes its handshake within a
round trip or two; a flooding socket that sits idle is, by then, among the oldest, so
the legitimate client always gets through while the flood evicts itself.

Order of shedding when a new connection arrives:

1. its source address already has ``max_per_address`` handshakes pending: that
   address's oldest one, if it has been pending for ``grace_s`` (one host cannot hold
   the whole budget; but peers of one machine, or behind one NAT, that connect at the
   same moment all arrive before any of them could have sent its hello, so a burst
   younger than ``grace_s`` is let in, within the budget);
2. the budget of ``max_pending`` is full: the oldest connection that has sent nothing
   yet, else the oldest of those that sent their hello (sending a hello needs no key,
   so it buys a flooding socket time, never a place ahead of a newer client).

:class:`HandshakeAdmission` is a plain object over opaque connection handles; the
asyncio driver (``tcp.py``) aborts the handles it returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["HandshakeAdmission"]

K = TypeVar("K", bound=Hashable)


class HandshakeAdmission(Generic[K]):
    """The pending handshakes of one server, oldest first, and who to shed for a newcomer."""

    def __init__(self, *, max_pending: int, max_per_address: int, grace_s: float = 0.5) -> None:
        if max_pending < 1 or max_per_address < 1 or grace_s < 0:
            msg = "max_pending and max_per_address must be positive, grace_s not negative"
            raise ValueError(msg)
        self.max_pending = max_pending
        self.max_per_address = max_per_address
        self.grace_s = grace_s
        self._silent: OrderedDict[K, str] = OrderedDict()  # nothing received yet
        self._heard: OrderedDict[K, str] = OrderedDict()  # the client's hello came
        self._by_address: dict[str, OrderedDict[K, float]] = {}  # arrival times

    def __len__(self) -> int:
        return len(self._silent) + len(self._heard)

    def __contains__(self, conn: object) -> bool:
        return conn in self._silent or conn in self._heard

    def pending_from(self, address: str) -> int:
        return len(self._by_address.get(address, ()))

    def admit(self, conn: K, address: str, now: float = 0.0) -> list[K]:
        """Take ``conn`` in (arrived at ``now``); returns the pending connections to shed
        to make room."""
        shed: list[K] = []
        mine = self._by_address.get(address)
        if mine is not None and len(mine) >= self.max_per_address:
            oldest = self._oldest_of(mine)
            if now - mine[oldest] >= self.grace_s:
                shed.append(oldest)
                self.done(oldest)
        while len(self) >= self.max_pending:
            shed.append(next(iter(self._silent or self._heard)))
            self.done(shed[-1])
        self._silent[conn] = address
        self._by_address.setdefault(address, OrderedDict())[conn] = now
        return shed

    def heard(self, conn: K) -> None:
        """``conn`` sent its first bytes (a hello, or garbage that will close it)."""
        address = self._silent.pop(conn, None)
        if address is not None:
            self._heard[conn] = address

    def done(self, conn: K) -> None:
        """``conn`` finished its handshake, failed it, or was shed: forget it."""
        address = self._silent.pop(conn, None) or self._heard.pop(conn, None)
        if address is None:
            return
        mine = self._by_address[address]
        del mine[conn]
        if not mine:
            del self._by_address[address]

    def _oldest_of(self, mine: OrderedDict[K, float]) -> K:
        for conn in mine:  # an address's oldest silent connection first
            if conn in self._silent:
                return conn
        return next(iter(mine))
