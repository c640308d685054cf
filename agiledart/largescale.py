"""The control plane at 10,000 peers in one process (paper §VII-E, Fig. 10).

Operators are placed and scheduled, never executed. The pieces are the real ones:

* the ring is :class:`~agiledart.overlay.simulation.SimulatedRing` on the fake network
  (built from the oracle: converged routing tables and leaf sets, no join traffic),
  every peer reporting its spare capacity from the operators it hosts;
* zones are geographic: the fake network places every peer at a seeded point in the
  plane (link delays grow with distance), and the plane is cut into a grid of zones;
* discovery, the 50-app cap and election are :mod:`agiledart.zones` (a gossip walk
  over each peer's overlay contacts, adverts spread by rumour when a scheduler is
  elected or fills up);
* JOIN routing is :meth:`OverlayNode.route` over the fake network, every hop
  recording itself; placement is :func:`agiledart.placement.place` over those paths
  with the path peers' leaf sets and spare capacities.

A simulated peer hosts at most :data:`SLOTS` operators (the placement's own default
slot limit); its spare capacity is ``1 - hosted / SLOTS``, so one operator takes
``1 / SLOTS`` of it: the placement's ``reserve``, which passes over a path node with
one slot left unless nothing on or beside the path has more room. Apps are added in
rounds (e.g. 250, then 250 more, ...) and the distributions are measured after each
round.

    result = run_virtual(simulate(ScaleConfig(peers=10_000)))
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agiledart.app.parse import parse_spec
from agiledart.app.spec import AppSpec
from agiledart.errors import AgiledartError
from agiledart.overlay.config import OverlayConfig
from agiledart.overlay.errors import RouteError
from agiledart.overlay.node import OverlayNode
from agiledart.overlay.simulation import SimulatedRing
from agiledart.placement.join import (
    DEFAULT_SLOT_LIMIT,
    Hop,
    NoCapacity,
    PeerInfo,
    PlacementError,
    place,
)
from agiledart.zones import (
    APP_CAP,
    DEFAULT_FANOUT,
    Answer,
    Candidate,
    SchedulerAd,
    Walk,
    ZoneView,
    drive,
    elect,
    hop_budget,
)

__all__ = ["SLOTS", "ScaleConfig", "ScaleError", "Snapshot", "simulate"]

#: operators a simulated peer hosts at most
SLOTS = DEFAULT_SLOT_LIMIT


class ScaleError(AgiledartError):
    """The simulation was configured with impossible values."""


@dataclass(frozen=True, kw_only=True)
class ScaleConfig:
    peers: int = 10_000
    zones: int = 16  #: a square grid is best: 16 = 4 x 4
    rounds: Sequence[int] = (250, 500, 750, 1000)  #: total apps after each round
    mean_operators: int = 10
    seed: int = 1
    fanout: int = DEFAULT_FANOUT
    cap: int = APP_CAP
    ksize: int = 20
    b: int = 4
    #: L, the leaf set: Pastry's 2^b = 16 (the live overlay's default is 8); placement
    #: puts the operators a path has no room for on leaf-set peers of its nodes
    leaf_set_size: int = 16
    concurrent: int = 25  #: apps submitted together (their JOINs routed concurrently)
    #: prefix bits routing may trade for lower RTT and spare capacity (overlay's default 0)
    slack_bits: int = 0
    #: operators of one app a peer takes (placement's ``slot_limit``), doubled while
    #: placement finds no capacity: 1 spreads an app over its paths and leaf sets
    app_slot_limit: int = 1

    def __post_init__(self) -> None:
        if self.peers < 2 or self.zones < 1 or self.zones > self.peers:
            msg = f"need 2 <= peers and 1 <= zones <= peers, got {self.peers}, {self.zones}"
            raise ScaleError(msg)
        if self.mean_operators < 3:
            msg = "mean_operators must be at least 3"
            raise ScaleError(msg)
        if list(self.rounds) != sorted(set(self.rounds)) or not self.rounds or self.rounds[0] < 1:
            msg = f"rounds must be increasing positive totals, got {list(self.rounds)}"
            raise ScaleError(msg)


@dataclass
class _Peer:
    name: str
    node: OverlayNode
    zone: str
    cores: int
    ops: int = 0
    apps: int | None = None  #: apps it schedules; None: not a scheduler
    view: ZoneView = field(default_factory=lambda: ZoneView(limit=64))

    @property
    def spare(self) -> float:
        return max(0.0, 1.0 - self.ops / SLOTS)


@dataclass
class Snapshot:
    """The distributions after one round."""

    apps: int
    operators: int
    ops_per_peer: Counter[int]
    schedulers_per_zone: dict[str, int]
    apps_per_zone: dict[str, int]
    hops: Counter[int]  #: discovery hops of every app so far
    elections: int
    false_elections: int  #: elected although the zone had a scheduler with room
    refusals: int
    unplaced: int

    def frac_below(self, k: int) -> float:
        total = sum(self.ops_per_peer.values())
        return sum(n for ops, n in self.ops_per_peer.items() if ops < k) / total

    def to_dict(self) -> dict[str, Any]:
        ideal = sum(math.ceil(a / APP_CAP) for a in self.apps_per_zone.values())
        hops = sorted(self.hops.elements())
        return {
            "apps": self.apps,
            "operators": self.operators,
            "ops_per_peer": {str(k): v for k, v in sorted(self.ops_per_peer.items())},
            "frac_peers_lt3_ops": round(self.frac_below(3), 5),
            "frac_peers_lt4_ops": round(self.frac_below(4), 5),
            "max_ops_per_peer": max(self.ops_per_peer),
            "schedulers": sum(self.schedulers_per_zone.values()),
            "schedulers_ideal": ideal,
            "schedulers_per_zone": dict(sorted(self.schedulers_per_zone.items())),
            "apps_per_zone": dict(sorted(self.apps_per_zone.items())),
            "mean_scheduler_hops": round(sum(hops) / len(hops), 3) if hops else 0.0,
            "p99_scheduler_hops": _quantile(hops, 0.99),
            "scheduler_hops": {str(k): v for k, v in sorted(self.hops.items())},
            "elections": self.elections,
            "false_elections": self.false_elections,
            "refusals": self.refusals,
            "unplaced": self.unplaced,
        }


def _quantile(xs: Sequence[int], q: float) -> int:
    if not xs:
        return 0
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


class _World:
    """The ring, the peers' zone state and the apps placed so far."""

    def __init__(self, config: ScaleConfig, ring: SimulatedRing, peers: dict[str, _Peer]):
        self.config = config
        self.ring = ring
        self.peers = peers
        self.rng = random.Random(config.seed * 7919 + 1)
        self.budget = hop_budget(config.peers, config.b)
        self.by_id = {p.node.node_id: p for p in peers.values()}
        self.zone_peers: dict[str, list[str]] = {}
        for p in peers.values():
            self.zone_peers.setdefault(p.zone, []).append(p.name)
        self.hops: Counter[int] = Counter()
        self.apps_per_zone: Counter[str] = Counter()
        self.elections = self.false_elections = self.refusals = self.unplaced = 0
        self.operators = 0
        self.apps = 0
        self._stamp = 0.0

    # -- the zone protocol, over the peers' objects ----------------------------------

    def _answer(self, name: str) -> Answer:
        p = self.peers[name]
        ads = p.view.ads(p.zone)
        if p.apps is not None:
            ads = [self._ad(p), *ads]
        neighbours = tuple(
            (q.name, q.zone)
            for c in p.node.known_peers()
            if c.node_id not in self.ring.dead and (q := self.by_id.get(c.node_id)) is not None
        )
        return Answer(self._candidate(p), tuple(ads), neighbours)

    def _candidate(self, p: _Peer) -> Candidate:
        return Candidate(
            name=p.name,
            zone=p.zone,
            node_id=p.node.node_id,
            cores=p.cores,
            capacity=p.spare,
            scheduler=p.apps is not None,
        )

    def _ad(self, p: _Peer) -> SchedulerAd:
        self._stamp += 1.0
        return SchedulerAd(p.name, p.zone, p.apps or 0, self._stamp)

    def _rumour(self, p: _Peer) -> None:
        """Push ``p``'s advert through its zone: every informed peer tells ``fanout``
        random zone contacts, for ``budget`` rounds."""
        ad = self._ad(p)
        informed = {p.name}
        frontier = [p.name]
        for _ in range(self.budget):
            nxt = []
            for name in frontier:
                known = (self.by_id.get(c.node_id) for c in self.peers[name].node.known_peers())
                same = [q.name for q in known if q is not None and q.zone == p.zone]
                same = [n for n in same if n not in informed]
                for n in self.rng.sample(same, min(self.config.fanout, len(same))):
                    informed.add(n)
                    self.peers[n].view.learn([ad])
                    nxt.append(n)
            frontier = nxt

    def find_scheduler(self, origin: _Peer) -> _Peer:
        """Discover (or elect) the scheduler of ``origin``'s zone, registered with."""
        walk = Walk(
            origin=origin.name,
            zone=origin.zone,
            budget=self.budget,
            rng=self.rng,
            fanout=self.config.fanout,
            cap=self.config.cap,
        )
        walk.answer(self._answer(origin.name))
        while True:
            found = drive(walk, self._answer).found
            if found is None:
                break
            target = self.peers[found.name]
            origin.view.learn([found])
            assert target.apps is not None
            if target.apps < self.config.cap:
                target.apps += 1
                if target.apps >= self.config.cap:
                    self._rumour(target)  # full now: let the zone know
                self.hops[walk.hop] += 1
                return target
            self.refusals += 1
            origin.view.learn([self._ad(target)])
            walk.refused(found.name)
        self.hops[walk.hop] += 1
        zone = origin.zone
        if any(
            self.peers[n].apps is not None and (self.peers[n].apps or 0) < self.config.cap
            for n in self.zone_peers[zone]
        ):
            self.false_elections += 1
        chosen = elect(walk.result().met.values(), zone, near=origin.node.node_id)
        if chosen is None:  # nobody capable met: the origin serves, as the last resort
            chosen = self._candidate(origin)
        elected = self.peers[chosen.name]
        elected.apps = 1
        self.elections += 1
        self._rumour(elected)
        return elected

    # -- scheduling one app -----------------------------------------------------------

    async def submit_batch(self, batch: Sequence[tuple[AppSpec, _Peer]]) -> None:
        """Apps submitted together: each finds its scheduler (in order), their JOINs
        are routed concurrently, and each is placed (in order, on fresh capacities)."""
        for _, origin in batch:
            self.find_scheduler(origin)
            self.apps += 1
            self.apps_per_zone[origin.zone] += 1
        routed = await asyncio.gather(*(self._join(spec) for spec, _ in batch))
        for (spec, _), paths in zip(batch, routed, strict=True):
            if paths is None:
                self.unplaced += 1
            else:
                self._place(spec, paths)

    async def _join(self, spec: AppSpec) -> dict[tuple[str, str], list[Hop]] | None:
        """One JOIN route per (source, sink) pair over the fake network."""
        peer_of = {s.id: s.peer for s in spec.sources} | {k.id: k.peer for k in spec.sinks}
        pairs = [(s.id, k.id) for k in spec.sinks for s in spec.sources if _feeds(spec, s.id, k.id)]

        async def route(src: str, sink: str) -> list[Hop] | None:
            node = self.peers[peer_of[src]].node
            key = self.peers[peer_of[sink]].node.node_id
            try:
                result = await node.route(key, "probe", None)
            except RouteError:
                return None
            return [
                Hop(h.name, h.node_id, h.rtt_ms or 0.0, min(1.0, max(0.0, h.capacity)))
                for h in result.path
            ]

        hops = await asyncio.gather(*(route(s, k) for s, k in pairs))
        if any(h is None for h in hops):
            return None
        return {pair: h for pair, h in zip(pairs, hops, strict=True) if h is not None}

    def _place(self, spec: AppSpec, paths: dict[tuple[str, str], list[Hop]]) -> None:
        infos = self._infos(paths)
        limit = self.config.app_slot_limit
        while True:
            try:
                placement = place(spec, paths, infos, slot_limit=limit, reserve=1 / SLOTS)
                break
            except PlacementError as exc:
                if not isinstance(exc, NoCapacity) or limit >= len(spec.operators):
                    self.unplaced += 1
                    return
                limit *= 2
        for hosts in placement.operators.values():
            for peer in hosts:
                self.peers[peer].ops += 1
                self.operators += 1

    def _infos(self, paths: dict[tuple[str, str], list[Hop]]) -> dict[str, PeerInfo]:
        """Leaf sets and spare capacities of the path peers and of their leaf sets."""
        infos: dict[str, PeerInfo] = {}
        for hops in paths.values():
            for h in hops:
                p = self.peers[h.peer]
                leaf = tuple(c.name for c in p.node.leaf_set.members())
                infos[h.peer] = PeerInfo(leaf_set=leaf, capacity=p.spare)
                for n in leaf:
                    infos.setdefault(n, PeerInfo(capacity=self.peers[n].spare))
        return infos

    def snapshot(self) -> Snapshot:
        per_peer = Counter(p.ops for p in self.peers.values())
        per_zone = {z: 0 for z in self.zone_peers}
        for p in self.peers.values():
            if p.apps is not None:
                per_zone[p.zone] += 1
        return Snapshot(
            apps=self.apps,
            operators=self.operators,
            ops_per_peer=per_peer,
            schedulers_per_zone=per_zone,
            apps_per_zone=dict(self.apps_per_zone),
            hops=Counter(self.hops),
            elections=self.elections,
            false_elections=self.false_elections,
            refusals=self.refusals,
            unplaced=self.unplaced,
        )


def _feeds(spec: AppSpec, source: str, sink: str) -> bool:
    """Whether ``sink`` is downstream of ``source``."""
    inputs = {o.id: o.inputs for o in spec.operators} | {k.id: k.inputs for k in spec.sinks}
    todo, seen = [sink], set()
    while todo:
        node = todo.pop()
        if node == source:
            return True
        if node in seen:
            continue
        seen.add(node)
        todo.extend(inputs.get(node, ()))
    return False


def zone_of(point: tuple[float, float], zones: int) -> str:
    """The grid cell of a point of the unit square, ``cols = ceil(sqrt(zones))``."""
    cols = math.ceil(math.sqrt(zones))
    rows = math.ceil(zones / cols)
    col = min(cols - 1, int(point[0] * cols))
    row = min(rows - 1, int(point[1] * rows))
    return f"z{min(zones - 1, row * cols + col):02d}"


_GEN = {"dataset": "counter", "rate": 10, "count": 1}


def random_app(rng: random.Random, index: int, zone_peers: Sequence[str], mean: int) -> AppSpec:
    """One app of the mix: a chain (half), two sources merged by a union (three in
    ten) or one source feeding two sinks (two in ten); ``mean - 4 .. mean + 4``
    operators; sources and sinks on random peers of the zone."""
    n = rng.randint(mean - min(4, mean - 3), mean + min(4, mean - 3))
    pick = rng.sample(list(zone_peers), 4)
    kind = rng.random()

    def op(i: int, inputs: list[str]) -> dict[str, Any]:
        return {"id": f"o{i}", "op": "map", "fn": "builtin:identity", "inputs": inputs}

    def src(sid: str, peer: str) -> dict[str, Any]:
        return {"id": sid, "peer": peer, "connector": "generator", "params": _GEN}

    def sink(kid: str, peer: str, inputs: list[str]) -> dict[str, Any]:
        return {"id": kid, "peer": peer, "connector": "discard", "inputs": inputs}

    ops: list[dict[str, Any]] = []
    if kind < 0.5:  # chain
        prev = "s0"
        for i in range(n):
            ops.append(op(i, [prev]))
            prev = f"o{i}"
        sources, sinks = [src("s0", pick[0])], [sink("k0", pick[1], [prev])]
    elif kind < 0.8:  # two branches merged by a union, then a chain
        a = max(1, (n - 1) // 3)
        ends = []
        for b, start in ((0, 0), (1, a)):
            prev = f"s{b}"
            for i in range(start, start + a):
                ops.append(op(i, [prev]))
                prev = f"o{i}"
            ends.append(prev)
        ops.append({"id": f"o{2 * a}", "op": "union", "inputs": ends})
        prev = f"o{2 * a}"
        for i in range(2 * a + 1, n):
            ops.append(op(i, [prev]))
            prev = f"o{i}"
        sources = [src("s0", pick[0]), src("s1", pick[2])]
        sinks = [sink("k0", pick[1], [prev])]
    else:  # a shared prefix, then two branches to two sinks
        shared = max(1, n // 3)
        prev = "s0"
        for i in range(shared):
            ops.append(op(i, [prev]))
            prev = f"o{i}"
        fork = prev
        ends = []
        half = (n - shared) // 2
        for lo, hi in ((shared, shared + half), (shared + half, n)):
            prev = fork
            for i in range(lo, hi):
                ops.append(op(i, [prev]))
                prev = f"o{i}"
            ends.append(prev)
        sources = [src("s0", pick[0])]
        sinks = [sink("k0", pick[1], [ends[0]]), sink("k1", pick[3], [ends[1]])]
    raw = {"name": f"app{index}", "sources": sources, "operators": ops, "sinks": sinks}
    return parse_spec(raw)


async def simulate(config: ScaleConfig, *, log: Any = None) -> dict[str, Any]:
    """Build the ring, add apps round by round; every round's distributions."""
    t0 = time.perf_counter()
    rng = random.Random(config.seed)
    loads: dict[str, _Peer] = {}
    overlay = OverlayConfig(
        ksize=config.ksize,
        leaf_set_size=config.leaf_set_size,
        proximity_slack_bits=config.slack_bits,
        heartbeat_interval_s=300.0,  # nobody dies here: heartbeats only cost CPU
        refresh_interval_s=3600.0,
    )

    def capacity(name: str) -> float:
        p = loads.get(name)
        return 1.0 if p is None else p.spare

    async with SimulatedRing(
        n=config.peers, seed=config.seed, config=overlay, oracle=True, capacity=capacity
    ) as ring:
        for node in ring.nodes:
            zone = zone_of(ring.net.links.point(node.address), config.zones)
            cores = rng.choice((1, 1, 2, 2, 4, 8))
            loads[node.name] = _Peer(node.name, node, zone, cores)
        built = time.perf_counter() - t0
        if log is not None:
            log(f"ring of {config.peers} built in {built:.0f} s")
        world = _World(config, ring, loads)
        zones = sorted(world.zone_peers)
        weights = [len(world.zone_peers[z]) for z in zones]
        rounds = []
        for total in config.rounds:
            batch: list[tuple[AppSpec, _Peer]] = []
            while world.apps + len(batch) < total:
                zone = rng.choices(zones, weights)[0]
                spec = random_app(
                    rng, world.apps + len(batch), world.zone_peers[zone], config.mean_operators
                )
                origin = loads[rng.choice(world.zone_peers[zone])]
                batch.append((spec, origin))
            for i in range(0, len(batch), config.concurrent):
                await world.submit_batch(batch[i : i + config.concurrent])
            snap = world.snapshot()
            rounds.append(snap.to_dict())
            if log is not None:
                log(
                    f"{snap.apps} apps: lt4 {snap.frac_below(4):.4f}, max "
                    f"{max(snap.ops_per_peer)}, schedulers {sum(snap.schedulers_per_zone.values())}"
                    f" at {time.perf_counter() - t0:.0f} s"
                )
    return {
        "peers": config.peers,
        "zones": config.zones,
        "hop_budget": world.budget,
        "build_s": round(built, 1),
        "rounds": rounds,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
