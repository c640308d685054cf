"""Who holds a record, and what to hand to whom: the records store's upkeep, without I/O.

Theory of operation (Kademlia §2.5, "store-on-join" and republishing)
----------------------------------------------------------------------
A record's *holders* are the ``copies`` peers closest to its key (XOR distance) among
the live peers; the closest is its *owner*. Each peer computes them from what it knows
(:func:`holders`): itself and its contacts. The ring changes under the records: a peer
that joins near a key becomes one of its holders, and one that dies leaves a key with
one copy fewer. So every peer keeps handing its records on:

* on a leaf-set change (a peer joined, left or died near us) it offers each record it
  holds to the holders it has not yet seen confirm that version (**store-on-join**,
  **re-replication**);
* every republish interval (jittered) it offers *all* of them again, confirmed or not
  (**republish**): what one peer's view missed, another's catches.

An offer carries only ``(key, stamp)`` pairs; the receiver answers which it wants
(those it lacks or holds older), and only those values travel. A record this peer holds
but is not a holder of by its own view (it was, before closer peers joined) is offered
to the key's owner, found by routing, until the owner confirms it.

A :class:`Stamp` orders versions of a record totally: the writer's hybrid logical clock
(:class:`HybridClock`), then the digest of the value, so two writes with the same clock
reading resolve the same way on every peer.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = ["HybridClock", "Plan", "Stamp", "Upkeep", "digest_of", "holders"]

#: ``(version, digest of the value)``: compared as a tuple, the larger is newer
Stamp = tuple[int, bytes]


class HybridClock:
    """Versions that never go backwards: ``max(wall clock, last seen + 1)`` in ns.

    ``observe`` moves the clock past a version seen elsewhere (a refused write's stored
    version, a record read or reloaded), so the next write from here is newer than
    anything this peer has seen, whatever the wall clock does after a step back.
    """

    def __init__(self, wall: Callable[[], int] = time.time_ns) -> None:
        self.wall = wall
        self.last = 0

    def now(self) -> int:
        self.last = max(self.wall(), self.last + 1)
        return self.last

    def observe(self, version: int) -> None:
        self.last = max(self.last, version)


def digest_of(value: Any, *, merge: bool = False) -> bytes:
    """8 bytes of SHA-1 over the value's msgpack form (a set's members sorted first)."""
    if merge and isinstance(value, list):
        parts = sorted(msgpack.packb(m, use_bin_type=True) for m in value)
        return hashlib.sha1(b"".join(parts)).digest()[:8]
    return hashlib.sha1(msgpack.packb(value, use_bin_type=True)).digest()[:8]


def holders(key: int, me: int, peers: Iterable[int], copies: int) -> list[int]:
    """The ``copies`` ids closest to ``key`` among ``me`` and ``peers``, closest first."""
    return sorted({me, *peers}, key=lambda p: p ^ key)[:copies]


@dataclass
class Plan:
    """What one upkeep round sends: offers to holders, and records for their owners."""

    offers: dict[int, list[int]] = field(default_factory=dict)  #: peer id -> keys
    to_owner: list[int] = field(default_factory=list)  #: keys held here by no right

    def __bool__(self) -> bool:
        return bool(self.offers or self.to_owner)


class Upkeep:
    """Which holders have confirmed which versions; the offers a round should make."""

    def __init__(self, me: int, copies: int) -> None:
        if copies < 1:
            msg = "a record needs at least one copy"
            raise ValueError(msg)
        self.me = me
        self.copies = copies
        #: peer id -> key -> the stamp it confirmed holding (or newer)
        self.confirmed: dict[int, dict[int, Stamp]] = {}
        #: keys handed to their owner, with the stamp handed
        self.handed: dict[int, Stamp] = {}

    def plan(self, items: Iterable[tuple[int, Stamp]], peers: Iterable[int], *, full: bool) -> Plan:
        """Offers for the records ``items`` given the live ``peers`` known here; a
        ``full`` round (republish) offers again what was confirmed."""
        known = [p for p in peers if p != self.me]
        plan = Plan()
        for key, stamp in items:
            hold = holders(key, self.me, known, self.copies)
            if self.me not in hold:
                if full or self.handed.get(key) != stamp:
                    plan.to_owner.append(key)
                continue
            for peer in hold:
                if peer == self.me:
                    continue
                seen = self.confirmed.get(peer, {}).get(key)
                if full or seen is None or seen < stamp:
                    plan.offers.setdefault(peer, []).append(key)
        return plan

    def confirm(self, peer: int, key: int, stamp: Stamp) -> None:
        """``peer`` holds ``key`` at ``stamp`` or newer."""
        self.confirmed.setdefault(peer, {})[key] = stamp

    def hand(self, key: int, stamp: Stamp) -> None:
        """The owner of ``key`` holds it at ``stamp`` or newer."""
        self.handed[key] = stamp

    def forget_peer(self, peer: int) -> None:
        """``peer`` left or died: nothing it confirmed counts any more."""
        self.confirmed.pop(peer, None)

    def forget_key(self, key: int) -> None:
        self.handed.pop(key, None)
        for keys in self.confirmed.values():
            keys.pop(key, None)
