"""The leaf set: the L peers closest to this one in the id space.

In Pastry the leaf set holds the L/2 numerically closest ids on either side; with the
XOR metric there are no sides, so it is simply the L closest known live peers. It is
what makes the last hops of a route exact and what the failure detector watches: a
peer's leaf set notices its death, and the member closest to the dead id takes over its
operators (AgileDART §IV-D).

Pure: :meth:`LeafSet.offer` and :meth:`LeafSet.remove` return the membership events
they cause; the driver publishes them to subscribers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .routing import Contact

__all__ = ["LeafSet", "Membership", "MembershipEvent"]


class Membership(Enum):
    JOINED = "joined"  # entered the leaf set
    LEFT = "left"  # pushed out by a closer peer (still alive, just no longer a neighbour)
    DEAD = "dead"  # declared dead by the failure detector


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    kind: Membership
    contact: Contact


class LeafSet:
    def __init__(self, self_id: int, size: int = 8) -> None:
        if size < 1:
            msg = "the leaf set size must be at least 1"
            raise ValueError(msg)
        self.self_id = self_id
        self.size = size
        self._members: dict[int, Contact] = {}
        self._far = -1  # distance of the farthest member while full, else -1

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def members(self) -> list[Contact]:
        """Members, closest first."""
        return sorted(self._members.values(), key=lambda c: c.node_id ^ self.self_id)

    def ids(self) -> set[int]:
        return set(self._members)

    def would_accept(self, node_id: int) -> bool:
        """Whether :meth:`offer` would take a peer with this id."""
        if node_id == self.self_id or node_id in self._members:
            return False
        if len(self._members) < self.size:
            return True
        if self._far < 0:
            self._far = max(m ^ self.self_id for m in self._members)
        return (node_id ^ self.self_id) < self._far

    def offer(self, contact: Contact) -> list[MembershipEvent]:
        """Consider a live peer; returns the events (a join, maybe a displacement)."""
        nid = contact.node_id
        if nid == self.self_id or nid in self._members:
            return []
        if len(self._members) < self.size:
            self._members[nid] = contact
            self._far = -1
            return [MembershipEvent(Membership.JOINED, contact)]
        if self._far < 0:
            self._far = max(m ^ self.self_id for m in self._members)
        if (nid ^ self.self_id) >= self._far:
            return []
        far = self._members.pop(self._far ^ self.self_id)
        self._members[nid] = contact
        self._far = -1
        return [
            MembershipEvent(Membership.JOINED, contact),
            MembershipEvent(Membership.LEFT, far),
        ]

    def remove(self, node_id: int, *, dead: bool) -> list[MembershipEvent]:
        contact = self._members.pop(node_id, None)
        if contact is None:
            return []
        self._far = -1
        kind = Membership.DEAD if dead else Membership.LEFT
        return [MembershipEvent(kind, contact)]
