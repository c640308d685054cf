"""Operator placement from JOIN routing paths (paper §IV-B, Fig. 5; docs/placement.md).

Theory of operation
-------------------
Each source peer routes a JOIN message toward the sink peer's node id; every hop
appends itself (:class:`Hop`). The overlay hands those paths here, one per
(source, sink) pair, together with the leaf set and spare capacity of every peer on
them (:class:`PeerInfo`). :func:`place` is a pure function of those values:

* Sources and sinks stay pinned to their peers; a path must start at its source's
  peer and end at its sink's peer.
* ``paths(o)``: the paths whose source-to-sink chain runs through operator ``o``.
  ``o`` may only sit on a peer common to all of them (or on a leaf-set peer of one).
  For a merge operator (union, join) the common peers are where paths from different
  sources meet: the rendezvous. For an operator shared by several sinks' chains it is
  the shared prefix; such an operator is placed once.
* A peer is usable while it hosts fewer than ``slot_limit`` of the app's operators and
  has spare capacity (> 0). It has room while its spare capacity is also above
  ``reserve``, the share of a peer one operator takes (by default a quarter: one of
  the :data:`DEFAULT_SLOT_LIMIT` operators a peer hosts); a usable peer without room
  would give the operator its last share.
* Operators are taken in topological order and laid along the paths, the first ones
  next to the source (data locality): a one-input operator goes to the first common
  peer with room at least one hop after its input; a merge operator to the first
  common peer with room at or after the positions of all its inputs ("first" in the
  order of the lowest-keyed path, ties by name).
* When no peer ahead on the path has room (the path has fewer hops than operators, or
  they are full or nearly so), the operator shares a path node at or after its inputs
  or goes to a leaf-set peer of one, whichever usable peer has the most spare capacity
  (on a tie a path node, so data stays on its path; then the fewest of the app's
  nodes, its sources and sinks counted, so an idle peer goes before the one producing
  the input; then name). So a busy path node gives its last share to an operator
  only when no peer on or beside the path has more: the paper's rule (path nodes with
  capacity, then the leaf set) with capacity read as room for one more operator; where
  every peer has room (all idle, say) it is the paper's rule unchanged. A leaf-set
  peer counts, for the operators after it, as sitting at the path node whose leaf set
  it came from (its anchor).
* Deployment runs along the reversed paths, sink side first (:attr:`Placement.deploy_order`).

Everything is deterministic: inputs are visited in sorted order and ties are broken
by name. Impossible inputs raise :class:`PlacementError` naming what is wrong.
RTTs are carried but not used here: the routing already chose low-RTT hops.

This is the default strategy, ``join-routing``; the app spec's ``placement`` picks
another (RTR, RTR+RP, cloud-only, load balancing) from :mod:`agiledart.placement.rtr`,
which returns the same :class:`Placement`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from agiledart.app.errors import AppError
from agiledart.app.graph import chains, topological_order
from agiledart.app.spec import AppSpec, OperatorSpec

__all__ = [
    "DEFAULT_RESERVE",
    "DEFAULT_SLOT_LIMIT",
    "Hop",
    "NoCapacity",
    "PathKey",
    "PeerInfo",
    "Placement",
    "PlacementError",
    "place",
]

#: Operators one peer hosts at most, unless told otherwise.
DEFAULT_SLOT_LIMIT = 4

#: Spare capacity one operator takes of a peer, unless told otherwise: one of
#: :data:`DEFAULT_SLOT_LIMIT`. A peer with no more left is used only as overflow.
DEFAULT_RESERVE = 1 / DEFAULT_SLOT_LIMIT

#: ``(source id, sink id)``: which JOIN path.
PathKey = tuple[str, str]


class PlacementError(AppError):
    """The paths and peers given cannot host this app (bad path, no capacity)."""


class NoCapacity(PlacementError):
    """Every peer an operator could go to is full at this slot limit: a larger limit
    (peers sharing operators) may still place the app."""


@dataclass(frozen=True, slots=True)
class Hop:
    """One hop of a JOIN path as the overlay recorded it."""

    peer: str
    node_id: int
    rtt_ms: float = 0.0
    capacity: float = 1.0


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What placement knows about a peer: its leaf set and spare capacity in [0, 1]."""

    leaf_set: tuple[str, ...] = ()
    capacity: float = 1.0


_NO_PATHS: Mapping[PathKey, tuple[str, ...]] = MappingProxyType({})
_NO_NODES: Mapping[str, str] = MappingProxyType({})
_NO_ESTIMATES: Mapping[PathKey, float] = MappingProxyType({})


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """Where every node of an app runs, and the JOIN paths that decided it."""

    operators: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    sources: Mapping[str, str] = field(default_factory=lambda: _NO_NODES)
    sinks: Mapping[str, str] = field(default_factory=lambda: _NO_NODES)
    #: peer names from source to sink, per (source, sink)
    paths: Mapping[PathKey, tuple[str, ...]] = field(default_factory=lambda: _NO_PATHS)
    #: peers to deploy on, sink side first (reversed paths; leaf-set hosts before
    #: the path node they hang off)
    deploy_order: tuple[str, ...] = ()
    #: the strategy that made it (the app spec's ``placement``)
    strategy: str = "join-routing"
    #: modelled response time of each path, ms (model-based strategies only;
    #: :mod:`agiledart.placement`); inf where a host or link cannot keep up
    estimate_ms: Mapping[PathKey, float] = field(default_factory=lambda: _NO_ESTIMATES)

    def peer_of(self, node_id: str) -> str:
        """The (first) peer running source, operator or sink ``node_id``."""
        if node_id in self.operators:
            return self.operators[node_id][0]
        if node_id in self.sources:
            return self.sources[node_id]
        return self.sinks[node_id]

    def on_peer(self, peer: str) -> tuple[str, ...]:
        """Operator ids with an instance on ``peer``, sorted."""
        return tuple(sorted(o for o, ps in self.operators.items() if peer in ps))


@dataclass(slots=True)
class _State:
    """Working state of one :func:`place` call."""

    paths: dict[PathKey, tuple[str, ...]]
    index: dict[PathKey, dict[str, int]]
    capacity: dict[str, float]
    leaf_sets: dict[str, tuple[str, ...]]
    slot_limit: int
    reserve: float
    through: Mapping[str, set[PathKey]]  # operator id -> keys of paths through it
    pinned: Mapping[str, int]  # peer -> the app's sources and sinks on it
    used: dict[str, int] = field(default_factory=dict)
    host: dict[str, str] = field(default_factory=dict)  # node id -> peer
    anchor: dict[str, str] = field(default_factory=dict)  # node id -> path peer

    def usable(self, peer: str) -> bool:
        return self.used.get(peer, 0) < self.slot_limit and self.capacity.get(peer, 0.0) > 0

    def has_room(self, peer: str) -> bool:
        return self.usable(peer) and self.capacity[peer] > self.reserve

    def assign(self, node: str, peer: str, anchor: str) -> None:
        self.used[peer] = self.used.get(peer, 0) + 1
        self.host[node] = peer
        self.anchor[node] = anchor


def place(
    app: AppSpec,
    paths: Mapping[PathKey, Sequence[Hop]],
    peers: Mapping[str, PeerInfo] | None = None,
    *,
    slot_limit: int = DEFAULT_SLOT_LIMIT,
    reserve: float = DEFAULT_RESERVE,
) -> Placement:
    """Place ``app``'s operators along its JOIN ``paths`` (one per source-sink pair).

    ``peers`` gives leaf sets and capacities; a path peer missing from it has the
    capacity its hop recorded and no leaf set, any other missing peer none (unusable).
    ``slot_limit``: operators of the app one peer takes at most; ``reserve``: spare
    capacity at or below which a path node is passed over (used only as overflow).
    """
    if slot_limit < 1:
        msg = f"slot limit must be at least 1, got {slot_limit}"
        raise PlacementError(msg)
    if not 0.0 <= reserve < 1.0:
        msg = f"reserve must be in [0, 1), got {reserve}"
        raise PlacementError(msg)
    peers = peers or {}
    on_chain = _paths_through(app)
    state = _state(app, paths, peers, on_chain, slot_limit, reserve)
    for s in app.sources:
        state.host[s.id] = state.anchor[s.id] = s.peer
    for node in topological_order(app):
        if node in on_chain and node not in state.host:
            op = app.operator(node)
            if op.peer is not None:  # pinned: downstream placement goes on from its input
                state.assign(op.id, op.peer, state.anchor.get(op.inputs[0], op.peer))
            else:
                _place_operator(op, sorted(on_chain[node]), state)
    ops = {o.id: (state.host[o.id],) for o in app.operators}
    return Placement(
        operators=MappingProxyType(ops),
        sources=MappingProxyType({s.id: s.peer for s in app.sources}),
        sinks=MappingProxyType({k.id: k.peer for k in app.sinks}),
        paths=MappingProxyType(dict(sorted(state.paths.items()))),
        deploy_order=_deploy_order(state),
    )


def _paths_through(app: AppSpec) -> dict[str, set[PathKey]]:
    """``{operator id: keys of the paths whose chain runs through it}``."""
    out: dict[str, set[PathKey]] = {}
    for sink, sink_chains in chains(app).items():
        for chain in sink_chains:
            for node in chain[1:-1]:
                out.setdefault(node, set()).add((chain[0], sink))
    return out


def _state(
    app: AppSpec,
    paths: Mapping[PathKey, Sequence[Hop]],
    peers: Mapping[str, PeerInfo],
    on_chain: Mapping[str, set[PathKey]],
    slot_limit: int,
    reserve: float,
) -> _State:
    """Validate ``paths`` against the app and gather capacities and leaf sets."""
    needed = {(c[0], sink) for sink, cs in chains(app).items() for c in cs}
    needed |= {k for keys in on_chain.values() for k in keys}
    for key in sorted(set(paths) - needed):
        msg = f"path given for source {key[0]!r} to sink {key[1]!r}, which it does not feed"
        raise PlacementError(msg)
    checked: dict[PathKey, tuple[str, ...]] = {}
    capacity: dict[str, float] = {}
    for key in sorted(needed):
        if key not in paths:
            msg = f"no JOIN path from source {key[0]!r} to sink {key[1]!r}"
            raise PlacementError(msg)
        checked[key] = _check_path(app, key, paths[key])
        for hop in paths[key]:
            capacity[hop.peer] = max(capacity.get(hop.peer, 0.0), _checked_capacity(hop))
    for name, info in peers.items():
        capacity[name] = _checked_capacity(info, name)
    return _State(
        paths=checked,
        index={k: {p: i for i, p in enumerate(ps)} for k, ps in checked.items()},
        capacity=capacity,
        leaf_sets={name: tuple(sorted(info.leaf_set)) for name, info in peers.items()},
        slot_limit=slot_limit,
        reserve=reserve,
        through=on_chain,
        pinned=Counter([s.peer for s in app.sources] + [k.peer for k in app.sinks]),
    )


def _check_path(app: AppSpec, key: PathKey, hops: Sequence[Hop]) -> tuple[str, ...]:
    names = tuple(h.peer for h in hops)
    what = f"JOIN path from source {key[0]!r} to sink {key[1]!r}"
    start = next(s for s in app.sources if s.id == key[0])
    end = next(k for k in app.sinks if k.id == key[1])
    if not names:
        msg = f"{what} is empty"
        raise PlacementError(msg)
    if names[0] != start.peer:
        msg = f"{what} starts at peer {names[0]!r}, not at the source's peer {start.peer!r}"
        raise PlacementError(msg)
    if names[-1] != end.peer:
        msg = f"{what} ends at peer {names[-1]!r}, not at the sink's peer {end.peer!r}"
        raise PlacementError(msg)
    for i, name in enumerate(names):
        if name in names[:i]:
            msg = f"{what} visits peer {name!r} twice"
            raise PlacementError(msg)
    return names


def _checked_capacity(item: Hop | PeerInfo, name: str = "") -> float:
    peer = item.peer if isinstance(item, Hop) else name
    if not 0.0 <= item.capacity <= 1.0:
        msg = f"capacity of peer {peer!r} must be in [0, 1], got {item.capacity}"
        raise PlacementError(msg)
    return item.capacity


def _place_operator(op: OperatorSpec, keys: list[PathKey], state: _State) -> None:
    """Put ``op`` on the first peer with room ahead on its paths, else overflow."""
    common = _common_peers(keys, state)
    if not common:
        msg = f"operator {op.id!r}: its paths {keys} share no peer to place it on"
        raise PlacementError(msg)
    step = 1 if len(op.inputs) == 1 else 0
    for peer in _at_or_after(op, keys, common, step, state):
        if state.has_room(peer):
            state.assign(op.id, peer, peer)
            return
    _overflow(op, keys, _at_or_after(op, keys, common, 0, state), state)


def _common_peers(keys: list[PathKey], state: _State) -> list[str]:
    """Peers on every path in ``keys``, in the order of the first path."""
    first = state.paths[keys[0]]
    return [p for p in first if all(p in state.index[k] for k in keys[1:])]


def _at_or_after(
    op: OperatorSpec, keys: list[PathKey], peers: list[str], step: int, state: _State
) -> list[str]:
    """``peers`` at least ``step`` hops after each input's anchor on each shared path."""

    def ok(peer: str) -> bool:
        for key in keys:
            idx = state.index[key]
            for node in op.inputs:
                anchor = state.anchor[node]
                if anchor in idx and _feeds(node, key, state) and idx[peer] < idx[anchor] + step:
                    return False
        return True

    return [p for p in peers if ok(p)]


def _feeds(node: str, key: PathKey, state: _State) -> bool:
    """Whether ``node`` lies on ``key``'s chain (sources: the path starts there)."""
    return node == key[0] or key in state.through.get(node, ())


def _overflow(op: OperatorSpec, keys: list[PathKey], nodes: list[str], state: _State) -> None:
    """Share a path node in ``nodes`` or use a leaf-set peer of one: most capacity wins."""
    candidates: dict[str, str] = {}  # peer -> anchor (first path node offering it)
    for node in nodes:
        for peer in (node, *state.leaf_sets.get(node, ())):
            candidates.setdefault(peer, node)
    usable = [p for p in candidates if state.usable(p)]
    if not usable:
        msg = (
            f"no capacity for operator {op.id!r}: every peer on its paths {keys} at or "
            f"after its inputs, and their leaf sets, is full (slot limit "
            f"{state.slot_limit}) or has no spare capacity"
        )
        raise NoCapacity(msg)
    # most spare capacity first; on a tie a path node (data stays on the path) before a
    # leaf-set peer, then the one with fewest of the app's nodes (its operators, sources
    # and sinks: a source's peer is busy producing), then by name
    on_path = set(nodes)
    best = min(
        usable,
        key=lambda p: (
            -state.capacity[p],
            p not in on_path,
            state.used.get(p, 0) + state.pinned.get(p, 0),
            p,
        ),
    )
    state.assign(op.id, best, candidates[best])


def _deploy_order(state: _State) -> tuple[str, ...]:
    """Reversed paths, sink side first; leaf-set hosts just before their anchor."""
    leaf_hosts: dict[str, set[str]] = {}
    for node, peer in state.host.items():
        if peer != state.anchor[node]:
            leaf_hosts.setdefault(state.anchor[node], set()).add(peer)
    order: dict[str, None] = {}
    for key in sorted(state.paths):
        for peer in reversed(state.paths[key]):
            for extra in sorted(leaf_hosts.get(peer, ())):
                order.setdefault(extra)
            order.setdefault(peer)
    return tuple(order)
