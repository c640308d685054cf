"""Many overlay peers on one fake network: the harness of tests and benchmarks.

``async with SimulatedRing(n=500, seed=1) as ring:`` builds ``n`` peers in virtual time
(run it under :func:`fakenet.run_virtual`), joining them in waves through peers that
have already joined, then lets the rings settle. With ``oracle=True`` it skips the joins
and fills every routing table and leaf set from the global list of ids, the way a
converged ring looks (up to ``ksize`` random contacts per prefix level, all of the
nearest ones): ten thousand peers in seconds, for studies of what runs on the ring
rather than of how it forms. Ground truth for checking routes comes
from outside the protocol: :meth:`SimulatedRing.closest_live` knows every live id.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .auth import ClusterKey
from .config import OverlayConfig
from .envelope import RouteResult
from .errors import RouteError
from .fakenet import FakeNetwork, LinkModel
from .ids import ID_BITS, random_id
from .node import Delivery, OverlayNode
from .routing import Contact

__all__ = ["RouteOutcome", "SimulatedRing"]

KEY = ClusterKey.generate(random.Random("simulation-cluster-key-0123456789"))


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    key: int
    expected: int
    result: RouteResult | None

    @property
    def delivered(self) -> bool:
        return self.result is not None and self.result.destination.node_id == self.expected

    @property
    def hops(self) -> int:
        return -1 if self.result is None else self.result.hops


@dataclass
class SimulatedRing:
    n: int
    seed: int = 0
    config: OverlayConfig = field(default_factory=OverlayConfig)
    wave: int = 100
    loss: float = 0.0
    duplicate: float = 0.0
    nodes: list[OverlayNode] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)
    oracle: bool = False  #: fill the tables from the global id list instead of joining
    #: spare capacity in [0, 1] a peer reports, by name (default: always 1.0)
    capacity: Callable[[str], float] | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.net = FakeNetwork(
            seed=self.seed,
            links=LinkModel(seed=self.seed, loss=self.loss),
            duplicate=self.duplicate,
        )
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> SimulatedRing:
        loop = asyncio.get_running_loop()
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(100_000, 20, 100)
        for i in range(self.n):
            node = OverlayNode(
                node_id=random_id(self.rng),
                key=KEY,
                name=f"p{i}",
                config=self.config,
                clock=loop.time,
                rng=random.Random(self.rng.getrandbits(64)),
                capacity=self._capacity_of(f"p{i}"),
            )
            await self._stack.enter_async_context(node)
            address = (f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 4000)
            node.attach(self.net.bind(address, node.protocol), address)
            node.on_deliver("probe", _echo)
            self.nodes.append(node)
        if self.oracle:
            self._fill_from_oracle()
            gc.freeze()
            return self
        await self.nodes[0].bootstrap([])
        joined = 1
        while joined < self.n:
            batch = self.nodes[joined : joined + self.wave]
            await asyncio.gather(
                *(
                    node.bootstrap([self.nodes[self.rng.randrange(joined)].address])
                    for node in batch
                )
            )
            joined += len(batch)
            # thousands of peers keep millions of long-lived objects; without this the
            # cyclic GC rescans them all, and build time grows with the square of n
            gc.freeze()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()
        gc.unfreeze()
        gc.set_threshold(*self._gc_threshold)

    def _capacity_of(self, name: str) -> Callable[[], float]:
        of = self.capacity
        return (lambda: 1.0) if of is None else (lambda: of(name))

    def _fill_from_oracle(self) -> None:
        """Every peer learns, for each prefix level, up to ``ksize`` random peers of the
        subtree that differs from it first at that level (a full k-bucket), and every
        peer of the levels that hold fewer: its leaf set is then exact."""
        by_id = sorted(self.nodes, key=lambda n: n.node_id)
        ordered = [n.node_id for n in by_id]
        k = self.config.ksize
        for node in self.nodes:
            v = node.node_id
            picks: list[OverlayNode] = []
            for level in range(ID_BITS - 1, -1, -1):
                own = (v >> (level + 1)) << (level + 1)  # my subtree above this level
                lo_own = bisect.bisect_left(ordered, own)
                hi_own = bisect.bisect_left(ordered, own + (2 << level))
                if hi_own - lo_own <= 1:
                    break  # nobody else shares this prefix: the table is complete
                base = ((v >> level) ^ 1) << level
                lo = bisect.bisect_left(ordered, base)
                hi = bisect.bisect_left(ordered, base + (1 << level))
                idx = range(lo, hi) if hi - lo <= k else self.rng.sample(range(lo, hi), k)
                picks.extend(by_id[j] for j in idx)
            node.seed(Contact(p.node_id, p.address[0], p.address[1], p.name) for p in picks)

    def live(self) -> list[OverlayNode]:
        return [n for n in self.nodes if n.node_id not in self.dead]

    def closest_live(self, key: int) -> int:
        return min((n.node_id for n in self.live()), key=lambda nid: nid ^ key)

    def kill(self, nodes: list[OverlayNode]) -> None:
        for node in nodes:
            self.dead.add(node.node_id)
            node.close()

    async def settle(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def stabilize(self) -> None:
        """One refresh round on every live peer at once (what the periodic refresh does
        over one interval, without waiting for it)."""
        await asyncio.gather(*(n.refresh() for n in self.live()))

    async def route_once(self, src: OverlayNode, key: int) -> RouteOutcome:
        try:
            result = await src.route(key, "probe", None)
        except RouteError:
            result = None
        return RouteOutcome(key, self.closest_live(key), result)

    async def route_many(self, count: int, *, to_peer_ids: bool = False) -> list[RouteOutcome]:
        live = self.live()
        jobs = []
        for _ in range(count):
            src = self.rng.choice(live)
            key = self.rng.choice(live).node_id if to_peer_ids else random_id(self.rng)
            jobs.append(self.route_once(src, key))
        return list(await asyncio.gather(*jobs))


def _echo(delivery: Delivery) -> Any:
    return len(delivery.path)
