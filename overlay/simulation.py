"""Many overlay peers on one fake network: the harness of tests and benchmarks.

``async with SimulatedRing(n=500, seed=1) as ring:`` builds ``n`` peers in virtual time
(run it under :func:`fakenet.run_virtual`), joining them in waves through peers that
have already joined, then lets the rings settle. Ground truth for checking routes comes
from outside the protocol: :meth:`SimulatedRing.closest_live` knows every live id.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
from dataclasses import dataclass, field
from typing import Any

from .auth import ClusterKey
from .config import OverlayConfig
from .envelope import RouteResult
from .errors import RouteError
from .fakenet import FakeNetwork, LinkModel
from .ids import random_id
from .node import Delivery, OverlayNode

__all__ = ["RouteOutcome", "SimulatedRing"]

KEY = ClusterKey.from_material("simulation-cluster-key-0123456789")


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
            )
            await self._stack.enter_async_context(node)
            address = (f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 4000)
            node.attach(self.net.bind(address, node.protocol), address)
            node.on_deliver("probe", _echo)
            self.nodes.append(node)
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
