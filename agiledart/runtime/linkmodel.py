"""The emulated network between peers (``agiledart peer --links FILE``).

Kernel netem is not available everywhere, so an emulated site's link quality comes
from a file in the bandit graph format (docs/bandit-graphs.md) whose nodes are peer
names: a link ``a -> b`` makes b a direct neighbour of a, and every transmission
attempt over it takes one slot of ``slot_ms`` and gets through with probability
``theta`` (expected delay ``slot_ms / theta``). Data between covered peers that are not
direct neighbours travels over relay peers (:mod:`agiledart.runtime.relay`). The file's
``source`` and ``sink`` are not used here. Peers the file does not name talk directly
and without emulated loss.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from agiledart.bandit.errors import GraphError
from agiledart.bandit.graph import Graph, load_graph

__all__ = ["LinkModel"]


@dataclass
class LinkModel:
    graph: Graph
    #: every peer's upload rate, Mbit/s (the file's optional top-level
    #: ``bandwidth_mbit``); it paces checkpoint fragment transfers and data batches
    #: (agiledart.runtime.instance.OutEdge). None: unlimited.
    bandwidth_mbit: float | None = None
    _out: dict[str, dict[str, float]] = field(init=False, repr=False)
    _hops: dict[str, dict[str, int]] = field(init=False, repr=False, default_factory=dict)
    _optimal: dict[tuple[str, float], dict[str, float]] = field(
        init=False, repr=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        names = [str(n) for n in self.graph.node_ids]
        self._out = {n: {} for n in names}
        for a, b, theta in zip(
            self.graph.tail.tolist(),
            self.graph.head.tolist(),
            self.graph.theta.tolist(),
            strict=True,
        ):
            self._out[names[a]][names[b]] = float(theta)

    @classmethod
    def load(cls, path: str | Path) -> LinkModel:
        """Read a link file (raises :class:`~agiledart.bandit.GraphError`)."""
        graph = load_graph(path)
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        cap = raw.get("bandwidth_mbit") if isinstance(raw, dict) else None
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or not cap > 0
        ):
            problem = f"must be a positive number of Mbit/s, got {cap!r}"
            raise GraphError("bandwidth_mbit", problem)  # noqa: EM101
        return cls(graph, None if cap is None else float(cap))

    @property
    def name(self) -> str:
        return self.graph.name or "links"

    @property
    def slot_ms(self) -> float:
        return self.graph.slot_ms

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(self._out)

    def covers(self, peer: str) -> bool:
        return peer in self._out

    def neighbours(self, peer: str) -> tuple[str, ...]:
        return tuple(self._out.get(peer, ()))

    def theta(self, a: str, b: str) -> float | None:
        """Success probability per attempt on ``a -> b``; None: no such link."""
        return self._out.get(a, {}).get(b)

    def hops_to(self, dest: str) -> dict[str, int]:
        """Links from each peer to ``dest`` on a shortest path (absent: unreachable)."""
        if dest not in self._hops:
            into: dict[str, list[str]] = {n: [] for n in self._out}
            for a, heads in self._out.items():
                for b in heads:
                    into[b].append(a)
            dist = {dest: 0}
            queue = deque([dest])
            while queue:
                b = queue.popleft()
                for a in into.get(b, ()):
                    if a not in dist:
                        dist[a] = dist[b] + 1
                        queue.append(a)
            self._hops[dest] = dist
        return self._hops[dest]

    def optimal_ms(self, origin: str, dest: str, grace_ms: float = 0.0) -> float | None:
        """Expected delay of the best path from ``origin`` to ``dest``, None if there is
        none. A hop's attempts take a slot each, and a failed one ``grace_ms`` more
        (the wait for an acknowledgement that does not come): expected
        ``(slot_ms + grace_ms) / θ - grace_ms`` per link, ``slot_ms / θ`` without grace,
        as in the regret simulator."""
        table = self._optimal.get((origin, grace_ms))
        if table is None:
            table = self._dijkstra(origin, grace_ms)
            self._optimal[(origin, grace_ms)] = table
        value = table.get(dest)
        return None if value is None or math.isinf(value) else value

    def _dijkstra(self, origin: str, grace_ms: float) -> dict[str, float]:
        dist = {origin: 0.0}
        heap = [(0.0, origin)]
        while heap:
            d, a = heapq.heappop(heap)
            if d > dist.get(a, math.inf):
                continue
            for b, theta in self._out.get(a, {}).items():
                nd = d + (self.slot_ms + grace_ms) / theta - grace_ms
                if nd < dist.get(b, math.inf):
                    dist[b] = nd
                    heapq.heappush(heap, (nd, b))
        return dist
