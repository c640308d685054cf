"""The placement model of RTR (Veith et al., "Latency-Aware Placement of Data Stream
Analytics on Edge Computing", ICSOC 2018, §2; docs/placement.md).

Theory of operation
-------------------
Hosts have a compute *speed* (work units per second) of which a *spare* fraction is
free; links have a one-way latency and optionally a bandwidth. Operators cost work
units per event, keep a *selectivity* (events out per event in) and an event-size
ratio. Rates and sizes propagate along the DAG from the sources (paper Eqs. 1-6).
Every operator and every link is an M/M/1 queue:

* compute time ``1 / (μ - λ)`` with ``μ = free speed / cost`` (Eq. 7): the free speed
  of a host is its speed times its spare fraction less what operators placed there
  already use, so operators sharing a host share its capacity (Constraint 17);
* transfer time ``1 / (bandwidth / event size - λ) + latency`` (Eq. 8), just the
  latency on an unlimited link, nothing on the same host.

A path's response time is the sum of both along it (Eq. 13); strategies minimise the
sum over paths (Eq. 14). Every value here is an estimate for deciding where to run:
results never depend on it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from agiledart.app.graph import topological_order
from agiledart.app.spec import AppSpec
from agiledart.placement.join import PlacementError

__all__ = [
    "CLOUD_ZONE",
    "Host",
    "Network",
    "StrategyError",
    "Topology",
    "Workload",
    "compute_ms",
    "flows",
    "transfer_ms",
]

#: Peers in this zone are the cloud (cloud-only, rtr-rp).
CLOUD_ZONE = "cloud"

#: Work units per event of each built-in operator kind (a map is 1).
KIND_COST = MappingProxyType(
    {
        "map": 1.0,
        "filter": 1.0,
        "key_by": 1.0,
        "union": 0.5,
        "flat_map": 2.0,
        "dedupe": 2.0,
        "window": 2.0,
        "aggregate": 2.0,
        "join": 3.0,
        "top_k": 3.0,
    }
)
#: Events out per event in of each kind, when nothing better is known.
KIND_SELECTIVITY = MappingProxyType(
    {"filter": 0.5, "dedupe": 0.95, "window": 0.05, "aggregate": 0.05, "top_k": 0.01}
)
DEFAULT_RATE = 1000.0  #: events/s of a source that states no rate
DEFAULT_EVENT_BYTES = 200.0


class StrategyError(PlacementError):
    """A strategy was asked something impossible (unknown name, no hosts, bad value)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    """A peer that can run operators."""

    name: str
    speed: float = 1000.0  #: work units per second with nothing else running
    spare: float = 1.0  #: fraction of ``speed`` free, in [0, 1]
    zone: str = "default"
    hosted: int = 0  #: operators of other apps running there

    def __post_init__(self) -> None:
        if not (self.speed > 0 and math.isfinite(self.speed)):
            msg = f"host {self.name!r}: speed must be a positive number, got {self.speed!r}"
            raise StrategyError(msg)
        if not 0.0 <= self.spare <= 1.0:
            msg = f"host {self.name!r}: spare must be in [0, 1], got {self.spare!r}"
            raise StrategyError(msg)

    @property
    def budget(self) -> float:
        """Work units per second free for new operators."""
        return self.speed * self.spare


@dataclass(frozen=True, slots=True)
class Network:
    """One-way latency (ms) and bandwidth (Mbit/s) between hosts, symmetric.

    ``latency_ms`` holds the pairs known; :meth:`from_links` completes direct links
    into all pairs by shortest paths. A pair not known at all costs ``unknown_ms``.
    Bandwidth: per pair, else ``bandwidth_mbit`` (None: unlimited).
    """

    latency_ms: Mapping[tuple[str, str], float] = field(default_factory=dict)
    bandwidth_mbit: float | None = None
    pair_bandwidth_mbit: Mapping[tuple[str, str], float] = field(default_factory=dict)
    unknown_ms: float = 1000.0

    def latency(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        got = self.latency_ms.get((a, b), self.latency_ms.get((b, a)))
        return self.unknown_ms if got is None else got

    def bandwidth(self, a: str, b: str) -> float | None:
        got = self.pair_bandwidth_mbit.get((a, b), self.pair_bandwidth_mbit.get((b, a)))
        return self.bandwidth_mbit if got is None else got

    @classmethod
    def from_links(
        cls,
        links: Mapping[tuple[str, str], float],
        *,
        bandwidth_mbit: float | None = None,
        pair_bandwidth_mbit: Mapping[tuple[str, str], float] | None = None,
        unknown_ms: float = 1000.0,
    ) -> Network:
        """All-pairs latencies over direct (undirected) ``links`` by Dijkstra."""
        adj: dict[str, dict[str, float]] = {}
        for (a, b), ms in links.items():
            if not (ms >= 0 and math.isfinite(ms)):
                msg = f"latency of link {a!r}-{b!r} must be >= 0 ms, got {ms!r}"
                raise StrategyError(msg)
            for x, y in ((a, b), (b, a)):
                row = adj.setdefault(x, {})
                row[y] = min(ms, row.get(y, math.inf))
        pairs: dict[tuple[str, str], float] = {}
        for origin in sorted(adj):
            for dest, ms in _dijkstra(adj, origin).items():
                if dest != origin:
                    pairs[(origin, dest)] = ms
        return cls(
            latency_ms=pairs,
            bandwidth_mbit=bandwidth_mbit,
            pair_bandwidth_mbit=dict(pair_bandwidth_mbit or {}),
            unknown_ms=unknown_ms,
        )


def _dijkstra(adj: Mapping[str, Mapping[str, float]], origin: str) -> dict[str, float]:
    dist = {origin: 0.0}
    heap = [(0.0, origin)]
    while heap:
        d, a = heapq.heappop(heap)
        if d > dist[a]:
            continue
        for b, ms in sorted(adj.get(a, {}).items()):
            if d + ms < dist.get(b, math.inf):
                dist[b] = d + ms
                heapq.heappush(heap, (d + ms, b))
    return dist


@dataclass(frozen=True, slots=True)
class Topology:
    """The hosts a strategy may use and the network between them."""

    hosts: Mapping[str, Host]
    network: Network = field(default_factory=Network)

    @classmethod
    def of(cls, hosts: Iterable[Host], network: Network | None = None) -> Topology:
        table: dict[str, Host] = {}
        for h in hosts:
            if h.name in table:
                msg = f"host {h.name!r} given twice"
                raise StrategyError(msg)
            table[h.name] = h
        return cls(MappingProxyType(dict(sorted(table.items()))), network or Network())

    def cloud(self) -> tuple[str, ...]:
        """Cloud hosts: those in zone ``cloud``; without any, those of the highest
        free capacity (in a homogeneous ring that is every host)."""
        tagged = tuple(n for n, h in self.hosts.items() if h.zone == CLOUD_ZONE)
        if tagged:
            return tagged
        best = max((h.budget for h in self.hosts.values()), default=0.0)
        return tuple(n for n, h in self.hosts.items() if h.budget == best)


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """Per-node estimates: source rates (events/s), operator cost (work units per
    event), selectivity and event-size ratio; event size at the sources (bytes)."""

    rates: Mapping[str, float] = field(default_factory=dict)
    cost: Mapping[str, float] = field(default_factory=dict)
    selectivity: Mapping[str, float] = field(default_factory=dict)
    size_ratio: Mapping[str, float] = field(default_factory=dict)
    event_bytes: float = DEFAULT_EVENT_BYTES

    @classmethod
    def of(cls, app: AppSpec) -> Workload:
        """Estimates from the spec: a source's ``rate`` (times its ``speedup``), the
        kind tables above for operators."""
        rates = {
            s.id: _positive(s.params.get("rate"), DEFAULT_RATE)
            * _positive(s.params.get("speedup"), 1.0)
            for s in app.sources
        }
        return cls(
            rates=rates,
            cost={o.id: KIND_COST.get(o.op, 1.0) for o in app.operators},
            selectivity={o.id: KIND_SELECTIVITY.get(o.op, 1.0) for o in app.operators},
        )


def _positive(value: object, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value) if value > 0 and math.isfinite(value) else default


@dataclass(frozen=True, slots=True)
class Flow:
    """Rates (events/s) into and out of a node, and the size of its output events."""

    rate_in: float
    rate_out: float
    bytes_out: float


def flows(app: AppSpec, workload: Workload) -> dict[str, Flow]:
    """Eqs. 1-6: every node's input and output rate and output event size."""
    out: dict[str, Flow] = {}
    for s in app.sources:
        rate = workload.rates.get(s.id, DEFAULT_RATE)
        out[s.id] = Flow(rate, rate, workload.event_bytes)
    for node in topological_order(app):
        if node in out:
            continue
        spec = app.node(node)
        inputs = getattr(spec, "inputs", ())
        rate_in = sum(out[i].rate_out for i in inputs)
        bytes_in = max((out[i].bytes_out for i in inputs), default=workload.event_bytes)
        sel = workload.selectivity.get(node, 1.0)
        ratio = workload.size_ratio.get(node, 1.0)
        out[node] = Flow(rate_in, rate_in * sel, bytes_in * ratio)
    return out


def compute_ms(rate_in: float, cost: float, free: float) -> float:
    """Eq. 7: sojourn time (ms) of an operator costing ``cost`` per event, fed
    ``rate_in`` events/s, on a host with ``free`` work units/s; inf if it cannot keep up."""
    if cost <= 0:
        return 0.0
    mu = free / cost
    return math.inf if mu <= rate_in else 1000.0 / (mu - rate_in)


def transfer_ms(network: Network, a: str, b: str, rate: float, event_bytes: float) -> float:
    """Eq. 8: time (ms) to ship one event from host ``a`` to ``b``; inf if the link
    cannot carry ``rate`` events/s of ``event_bytes`` bytes."""
    if a == b:
        return 0.0
    latency = network.latency(a, b)
    mbit = network.bandwidth(a, b)
    if mbit is None:
        return latency
    capacity = mbit * 1e6 / (8.0 * max(event_bytes, 1.0))  # events/s
    return math.inf if capacity <= rate else latency + 1000.0 / (capacity - rate)
