"""Routed messages and the paths they record.

A JOIN (or any routed message) carries the path it has taken: every peer that accepts
it appends a :class:`Hop` with its id, address, name, the RTT measured on the link it
arrived over, and its spare capacity. The peer closest to the key hands the message to
the handler registered for its ``kind`` and reports the full path back to the origin.

Wire form (msgpack): ``[msg_id, key, kind, payload, origin, path, ttl]`` with ``origin``
a contact ``[id, host, port, name]`` and each hop ``[id, host, port, name, rtt, cap]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .errors import MalformedError
from .ids import ID_BYTES, from_bytes, to_bytes

MAX_PATH = 64

__all__ = ["Envelope", "Hop", "RouteResult"]


@dataclass(frozen=True, slots=True)
class Hop:
    node_id: int
    host: str
    port: int
    name: str
    rtt_ms: float | None
    capacity: float

    def wire(self) -> list[Any]:
        return [to_bytes(self.node_id), self.host, self.port, self.name, self.rtt_ms, self.capacity]

    @classmethod
    def from_wire(cls, raw: object) -> Hop:
        if not isinstance(raw, list) or len(raw) != 6:
            msg = "a hop is [id, host, port, name, rtt, capacity]"
            raise MalformedError(msg)
        nid, host, port, name, rtt, cap = raw
        ok = (
            isinstance(nid, bytes)
            and len(nid) == ID_BYTES
            and isinstance(host, str)
            and len(host) <= 255
            and isinstance(port, int)
            and 0 < port < 65536
            and isinstance(name, str)
            and len(name) <= 64
            and (rtt is None or isinstance(rtt, int | float))
            and isinstance(cap, int | float)
        )
        if not ok:
            msg = "bad hop in a routed message"
            raise MalformedError(msg)
        return cls(from_bytes(nid), host, port, name, None if rtt is None else float(rtt), cap)


@dataclass(frozen=True, slots=True)
class Envelope:
    msg_id: bytes
    key: int
    kind: str
    payload: Any
    origin: Hop
    path: tuple[Hop, ...] = field(default=())
    ttl: int = 32

    def with_hop(self, hop: Hop) -> Envelope:
        return replace(self, path=(*self.path, hop), ttl=self.ttl - 1)

    def wire(self) -> list[Any]:
        return [
            self.msg_id,
            to_bytes(self.key),
            self.kind,
            self.payload,
            self.origin.wire(),
            [h.wire() for h in self.path],
            self.ttl,
        ]

    @classmethod
    def from_wire(cls, raw: object) -> Envelope:
        if not isinstance(raw, list) or len(raw) != 7:
            msg = "a routed message has 7 fields"
            raise MalformedError(msg)
        msg_id, key, kind, payload, origin, path, ttl = raw
        if not (isinstance(msg_id, bytes) and len(msg_id) == 8):
            msg = "bad routed message id"
            raise MalformedError(msg)
        if not (isinstance(key, bytes) and len(key) == ID_BYTES):
            msg = "bad routing key"
            raise MalformedError(msg)
        if not (isinstance(kind, str) and 0 < len(kind) <= 32):
            msg = "bad routed message kind"
            raise MalformedError(msg)
        if not (isinstance(path, list) and len(path) <= MAX_PATH):
            msg = "bad or overlong path"
            raise MalformedError(msg)
        if not (isinstance(ttl, int) and 0 <= ttl <= MAX_PATH):
            msg = "bad ttl"
            raise MalformedError(msg)
        hops = tuple(Hop.from_wire(h) for h in path)
        return cls(msg_id, from_bytes(key), kind, payload, Hop.from_wire(origin), hops, ttl)


@dataclass(frozen=True, slots=True)
class RouteResult:
    """What the origin learns: the peers the message passed, origin first."""

    key: int
    path: tuple[Hop, ...]
    result: Any

    @property
    def destination(self) -> Hop:
        return self.path[-1]

    @property
    def hops(self) -> int:
        """Forwarding steps taken (0 when the origin itself was closest)."""
        return len(self.path) - 1
