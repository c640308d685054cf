"""Heartbeat failure detection as a table-driven state machine.

The driver pings every watched peer once per heartbeat interval and reports each
outcome. A peer is never declared dead on one lost datagram: each miss moves it one step
down the ladder ALIVE -> SUSPECT(1) -> ... -> DEAD after ``misses_to_dead`` consecutive
misses; any sign of life (an ack, or any authenticated message from it) brings it back
to ALIVE. With loss probability p per heartbeat round trip, a live peer is wrongly
declared dead with probability p^misses_to_dead per interval (1e-6 for p = 1%, 3
misses). Detection takes between (misses_to_dead - 1) and misses_to_dead intervals plus
one RPC timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .errors import OverlayError

__all__ = ["FailureDetector", "Health", "IllegalTransition"]


class Health(Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


class IllegalTransition(OverlayError, RuntimeError):
    """A health change the failure detector's table does not allow (a bug here)."""


# (state, event) -> state; "miss" out of SUSPECT is resolved by the miss count.
_TRANSITIONS: dict[tuple[Health, str], Health] = {
    (Health.ALIVE, "ack"): Health.ALIVE,
    (Health.ALIVE, "miss"): Health.SUSPECT,
    (Health.SUSPECT, "ack"): Health.ALIVE,
    (Health.SUSPECT, "miss"): Health.SUSPECT,
}


@dataclass(slots=True)
class _Record:
    health: Health = Health.ALIVE
    misses: int = 0


class FailureDetector:
    def __init__(self, *, misses_to_dead: int = 3) -> None:
        if misses_to_dead < 2:
            msg = "misses_to_dead must be at least 2: one lost datagram is not a death"
            raise ValueError(msg)
        self.misses_to_dead = misses_to_dead
        self._peers: dict[int, _Record] = {}

    def watch(self, node_id: int) -> None:
        self._peers.setdefault(node_id, _Record())

    def unwatch(self, node_id: int) -> None:
        self._peers.pop(node_id, None)

    def watched(self) -> list[int]:
        return list(self._peers)

    def health(self, node_id: int) -> Health | None:
        rec = self._peers.get(node_id)
        return None if rec is None else rec.health

    def on_ack(self, node_id: int) -> Health | None:
        rec = self._peers.get(node_id)
        if rec is None:
            return None
        rec.health = self._step(rec.health, "ack")
        rec.misses = 0
        return rec.health

    def on_miss(self, node_id: int) -> Health | None:
        """Record a missed heartbeat; returns DEAD exactly once, then forgets the peer."""
        rec = self._peers.get(node_id)
        if rec is None:
            return None
        rec.health = self._step(rec.health, "miss")
        rec.misses += 1
        if rec.misses >= self.misses_to_dead:
            del self._peers[node_id]
            return Health.DEAD
        return rec.health

    @staticmethod
    def _step(state: Health, event: str) -> Health:
        try:
            return _TRANSITIONS[(state, event)]
        except KeyError:
            msg = f"no transition from {state.value} on {event}"
            raise IllegalTransition(msg) from None
