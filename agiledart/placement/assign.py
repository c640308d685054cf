"""The working state of a strategy, and the :class:`Placement` it produces.

An :class:`Assignment` knows where every node placed so far runs and how much of
each host's speed the operators there use; it prices putting an operator on a host
with the model of :mod:`agiledart.placement.model` (Eqs. 7, 8 and 13).
:func:`to_placement` turns a finished one into the same :class:`Placement` JOIN
routing gives: operator hosts, one peer path per (source, sink) pair (the hosts
along its first chain), peers in deploy order (consumers first), and the model's
response time of each path.

No cycles between peers. Peers' inboxes are bounded and a relay hands a peer its
packets in order, so data that leaves a peer and comes back to an operator there
could wait on itself (credits exhausted both ways). :meth:`Assignment.allowed` keeps
every chain from returning to a peer it left, and keeps an operator from leaving the
peer of a pinned node downstream (a sink): only a source's peer may be re-entered,
and only by a sink. JOIN routing has the same property by construction (operators
lie along a path).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import MappingProxyType

from agiledart.app.graph import chains, graph_of, reaches, topological_order
from agiledart.app.spec import AppSpec
from agiledart.placement.join import PathKey, Placement
from agiledart.placement.model import (
    Flow,
    Topology,
    Workload,
    compute_ms,
    flows,
    transfer_ms,
)

__all__ = ["Assignment", "estimate", "to_placement"]


@dataclass
class Assignment:
    app: AppSpec
    topology: Topology
    workload: Workload
    flow: dict[str, Flow] = field(init=False)
    host: dict[str, str] = field(default_factory=dict)  #: node id -> host
    used: dict[str, float] = field(default_factory=dict)  #: host -> work units/s
    count: dict[str, int] = field(default_factory=dict)  #: host -> operators of this app
    _inputs: dict[str, tuple[str, ...]] = field(init=False)
    _graph_sinks: dict[str, tuple[str, ...]] = field(init=False)
    #: per node: peers the data reaching it left, and those of them it left an operator on
    _left: dict[str, frozenset[str]] = field(init=False, default_factory=dict)
    _left_ops: dict[str, frozenset[str]] = field(init=False, default_factory=dict)
    _pins: dict[str, frozenset[str]] = field(init=False)  #: op -> pinned hosts downstream

    def __post_init__(self) -> None:
        self.flow = flows(self.app, self.workload)
        self._inputs = graph_of(self.app)
        graph = self._inputs
        sinks = [k.id for k in self.app.sinks]
        self._graph_sinks = {
            o.id: tuple(k for k in sinks if o.id in reaches(graph, [k])) for o in self.app.operators
        }
        pinned = {o.id: o.peer for o in self.app.operators if o.peer is not None}
        pinned |= {k.id: k.peer for k in self.app.sinks}
        self._pins = {
            o.id: frozenset(
                p for n, p in pinned.items() if n != o.id and o.id in reaches(graph, [n])
            )
            for o in self.app.operators
        }
        for s in self.app.sources:
            self.host[s.id] = s.peer
            self._left[s.id] = self._left_ops[s.id] = frozenset()
        for k in self.app.sinks:
            self.host[k.id] = k.peer

    # -- what an operator costs where -------------------------------------------------

    def load(self, op: str) -> float:
        """Work units per second ``op`` needs."""
        return self.flow[op].rate_in * self.workload.cost.get(op, 1.0)

    def free(self, host: str) -> float:
        h = self.topology.hosts.get(host)
        return math.inf if h is None else h.budget - self.used.get(host, 0.0)

    def compute(self, op: str, host: str) -> float:
        """Eq. 7 for ``op`` added to ``host`` (ms)."""
        return compute_ms(self.flow[op].rate_in, self.workload.cost.get(op, 1.0), self.free(host))

    def inbound(self, op: str, host: str) -> float:
        """Eq. 8 summed over ``op``'s inputs (already placed), to ``host`` (ms)."""
        net = self.topology.network
        return sum(
            transfer_ms(net, self.host[i], host, self.flow[i].rate_out, self.flow[i].bytes_out)
            for i in self._inputs[op]
        )

    def ahead(self, op: str, host: str) -> float:
        """Latency still to go from ``host`` to the sinks ``op`` feeds (a lower bound on
        the rest of its paths, so that a greedy choice looks toward the sinks)."""
        net = self.topology.network
        return sum(net.latency(host, self.host[k]) for k in self._graph_sinks[op])

    def response(self, op: str, host: str) -> float:
        """RTR's estimate for ``op`` on ``host``: in + compute + still to go (ms)."""
        return self.inbound(op, host) + self.compute(op, host) + self.ahead(op, host)

    def sinks_fed(self, op: str) -> tuple[str, ...]:
        return self._graph_sinks[op]

    def utilisation(self, op: str, host: str) -> float:
        """Share of ``host``'s speed in use with ``op`` added (inf: no speed)."""
        h = self.topology.hosts[host]
        if h.budget <= 0:
            return math.inf
        return (self.used.get(host, 0.0) + self.load(op)) / h.budget

    # -- placing ------------------------------------------------------------------------

    def _departed(self, op: str, host: str) -> tuple[frozenset[str], frozenset[str]]:
        """Peers the data left on its way to ``op`` on ``host``: all, and operators'."""
        left = set().union(*(self._left[i] for i in self._inputs[op]))
        left_ops = set().union(*(self._left_ops[i] for i in self._inputs[op]))
        for i in self._inputs[op]:
            if self.host[i] != host:
                left.add(self.host[i])
                if i in self._pins:  # an operator
                    left_ops.add(self.host[i])
        return frozenset(left), frozenset(left_ops)

    def allowed(self, op: str, candidates: Iterable[str]) -> list[str]:
        """``candidates`` that keep the peers free of cycles (see the module doc); if
        none does, the hosts of ``op``'s inputs among them, else all of them."""
        hosts = list(candidates)
        before = set().union(*(self._left[i] for i in self._inputs[op]))
        ok = [h for h in hosts if h not in before and not self._departed(op, h)[1] & self._pins[op]]
        inputs = {self.host[i] for i in self._inputs[op]}
        return ok or [h for h in hosts if h in inputs] or hosts

    def assign(self, op: str, host: str) -> None:
        self._left[op], self._left_ops[op] = self._departed(op, host)
        self.host[op] = host
        self.used[host] = self.used.get(host, 0.0) + self.load(op)
        self.count[host] = self.count.get(host, 0) + 1

    def best(self, op: str, candidates: Iterable[str]) -> str | None:
        """The candidate with the lowest finite response time (ties: fewer operators of
        this app and of others, then name); None if none can keep up."""
        scored = [
            (self.response(op, h), self.count.get(h, 0) + self.topology.hosts[h].hosted, h)
            for h in candidates
        ]
        finite = [s for s in scored if math.isfinite(s[0])]
        return min(finite)[2] if finite else None

    def least_used(self, op: str, candidates: Iterable[str]) -> str:
        """The candidate least utilised with ``op`` added (ties: fewer operators, name)."""
        return min(
            candidates,
            key=lambda h: (
                self.utilisation(op, h),
                self.count.get(h, 0) + self.topology.hosts[h].hosted,
                h,
            ),
        )


def estimate(assignment: Assignment) -> dict[PathKey, float]:
    """Eq. 13 per (source, sink) pair with every host's final load: the slowest of the
    pair's chains (a merge waits for its slowest input), in ms; inf when overloaded."""
    a = assignment
    net = a.topology.network
    ops = {o.id for o in a.app.operators}
    out: dict[PathKey, float] = {}
    for sink, sink_chains in chains(a.app).items():
        for chain in sink_chains:
            total = 0.0
            for prev, node in itertools.pairwise(chain):
                f = a.flow[prev]
                total += transfer_ms(net, a.host[prev], a.host[node], f.rate_out, f.bytes_out)
                h = a.topology.hosts.get(a.host[node])
                if node in ops and h is not None:
                    others = a.used.get(h.name, 0.0) - a.load(node)
                    cost = a.workload.cost.get(node, 1.0)
                    total += compute_ms(a.flow[node].rate_in, cost, h.budget - others)
            key = (chain[0], sink)
            out[key] = max(out.get(key, 0.0), total)
    return dict(sorted(out.items()))


def to_placement(assignment: Assignment, strategy: str) -> Placement:
    a = assignment
    app = a.app
    paths: dict[PathKey, tuple[str, ...]] = {}
    for sink, sink_chains in chains(app).items():
        for chain in sink_chains:
            key = (chain[0], sink)
            if key not in paths:
                hosts: list[str] = []
                for node in chain:
                    if not hosts or hosts[-1] != a.host[node]:
                        hosts.append(a.host[node])
                paths[key] = tuple(hosts)
    order: dict[str, None] = {}
    for node in reversed(topological_order(app)):  # consumers first
        order.setdefault(a.host[node])
    return Placement(
        operators=MappingProxyType({o.id: (a.host[o.id],) for o in app.operators}),
        sources=MappingProxyType({s.id: s.peer for s in app.sources}),
        sinks=MappingProxyType({k.id: k.peer for k in app.sinks}),
        paths=MappingProxyType(dict(sorted(paths.items()))),
        deploy_order=tuple(order),
        strategy=strategy,
        estimate_ms=MappingProxyType(estimate(a)),
    )
