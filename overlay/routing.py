"""The next-hop decision of recursive key-based routing, as a pure function.

Theory of operation (AgileDART §IV-B; Pastry's proximity-aware routing, Rowstron and
Druschel 2001, §2.5; Kademlia's XOR metric, Maymounkov and Mazières 2002, §2.1):

* A message for key *K* at node *v* may only go to a contact strictly closer to *K* in
  XOR distance than *v*. Distance falls at every hop, so routes are loop-free and end,
  and they end at the node that knows no one closer: with complete k-buckets (every
  non-empty subtree of the id space represented) that is the live node closest to *K*,
  because any node in the subtree that separates *v* from *K* is closer than *v*.
* Among the contacts that make progress, the ones sharing the longest prefix with *K*
  make the most progress (a prefix "digit" per hop gives log_{2^b} N hops). Within
  ``slack_bits`` of the best prefix, the choice goes to the lowest cost: measured RTT
  scaled up as spare capacity falls. That is proximity routing; it also spreads JOIN
  paths, and so the operators laid along them, over lightly loaded peers.
* Contacts that recently failed to answer are suspects: used only when nothing else
  makes progress. The caller walks the returned list in order, so one dead next hop
  costs one timeout, never the message.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from .ids import ID_BITS

DEFAULT_RTT_MS = 50.0

__all__ = ["Contact", "next_hops", "proximity_cost"]


@dataclass(slots=True)
class Contact:
    """What one peer knows of another."""

    node_id: int
    host: str
    port: int
    name: str = ""
    rtt_ms: float | None = None
    capacity: float = 1.0
    failures: int = 0
    last_seen: float = 0.0  #: loop time of the last first-hand sign of life

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def observe_rtt(self, sample_ms: float, *, weight: float = 0.25) -> None:
        """Fold one RTT sample into the moving average (TCP's SRTT, RFC 6298)."""
        if self.rtt_ms is None:
            self.rtt_ms = sample_ms
        else:
            self.rtt_ms += weight * (sample_ms - self.rtt_ms)


def proximity_cost(contact: Contact) -> float:
    """Lower is better: RTT, doubled when the peer has no spare capacity left."""
    rtt = DEFAULT_RTT_MS if contact.rtt_ms is None else contact.rtt_ms
    spare = min(max(contact.capacity, 0.0), 1.0)
    return rtt * (2.0 - spare)


def next_hops(
    self_id: int,
    key: int,
    contacts: Iterable[Contact],
    *,
    exclude: Collection[int] = (),
    slack_bits: int = 0,
    exact_within: int = 0,
) -> list[Contact]:
    """Contacts to try for ``key``, best first; empty when ``self_id`` is the closest.

    ``exact_within`` is the leaf set's radius: a key closer to us than that lies among
    peers we all know, so the closest of them is the destination and proximity yields.
    """
    own = self_id ^ key
    progress = [c for c in contacts if (c.node_id ^ key) < own and c.node_id not in exclude]
    if not progress:
        return []
    if own < exact_within:
        return sorted(progress, key=lambda c: (c.failures > 0, c.node_id ^ key))
    best = max(ID_BITS - (c.node_id ^ key).bit_length() for c in progress)
    floor = best - slack_bits

    def rank(c: Contact) -> tuple[int, int, float, int]:
        distance = c.node_id ^ key
        near = ID_BITS - distance.bit_length() >= floor
        # suspects last; then the proximity band; within it cost, outside it distance
        return (c.failures > 0, 0 if near else 1, proximity_cost(c) if near else 0.0, distance)

    return sorted(progress, key=rank)
