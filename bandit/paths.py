"""Shortest paths toward the sink: the J of Algorithm 1 and its hop-limited variants.

J(w) is the least total cost of a loop-free path from w to the sink (paper §V-B). All
link costs are >= 1 (ω = 1/u* with u* <= 1, or a true mean delay 1/θ in slots), so it
is Dijkstra on the reversed graph, run from the sink: O(E log V), a pure-Python heap
being faster than numpy at these sizes (144 nodes, 512 links: ~0.2 ms).

The "hops considered" variants of Fig. 17(c) look only a fixed number of links beyond
the next hop; :func:`lookahead_costs` computes that truncated J by synchronous
Bellman rounds, vectorised over links.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from agiledart.bandit.errors import NoRouteError
from agiledart.bandit.graph import Graph

__all__ = [
    "costs_to_sink",
    "lookahead_costs",
    "optimal_path",
    "path_nodes",
    "progress_links",
    "route_from",
]


def costs_to_sink(
    graph: Graph, weights: Sequence[float] | NDArray[np.float64]
) -> tuple[list[float], list[int]]:
    """J and, per node, the first link of one cheapest path to the sink (-1: none).

    Infinite weights are allowed (the link is unusable); J is +inf where the sink
    cannot be reached.
    """
    w = weights.tolist() if isinstance(weights, np.ndarray) else weights
    dist = [math.inf] * graph.n_nodes
    succ = [-1] * graph.n_nodes
    dist[graph.sink] = 0.0
    heap = [(0.0, graph.sink)]
    adjacency = graph.in_pairs
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        d, v = pop(heap)
        if d > dist[v]:
            continue
        for link, u in adjacency[v]:
            nd = d + w[link]
            if nd < dist[u]:
                dist[u] = nd
                succ[u] = link
                push(heap, (nd, u))
    return dist, succ


def route_from(graph: Graph, succ: Sequence[int], start: int) -> list[int]:
    """The links from ``start`` to the sink, following successor links."""
    links: list[int] = []
    v = start
    head = graph.head
    while v != graph.sink:
        link = succ[v]
        if link < 0 or len(links) >= graph.n_nodes:
            msg = f"no route from {graph.node_ids[start]!r} to the sink"
            raise NoRouteError(msg)
        links.append(link)
        v = int(head[link])
    return links


def path_nodes(graph: Graph, links: Sequence[int]) -> list[int]:
    """Node sequence of a path given as links (starting at the first link's tail)."""
    if not links:
        return []
    return [int(graph.tail[links[0]]), *(int(graph.head[link]) for link in links)]


def optimal_path(graph: Graph) -> tuple[list[int], float]:
    """p*: the source-to-sink path of least expected delay, and that delay in ms."""
    dist, succ = costs_to_sink(graph, 1.0 / graph.theta)
    return route_from(graph, succ, graph.source), dist[graph.source] * graph.slot_ms


def progress_links(graph: Graph) -> NDArray[np.bool_]:
    """Links that take a packet strictly closer to the sink in hop count.

    Following only these is loop-free and never strands a packet: every node that can
    reach the sink has one, and hop counts fall along the way.
    """
    hops = graph.hops_to_sink
    to = hops[graph.head]
    return np.asarray((to >= 0) & (to < hops[graph.tail]), dtype=np.bool_)


def lookahead_costs(
    graph: Graph, weights: NDArray[np.float64], hops: int, allowed: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """J truncated to ``hops`` links: least cost of the first ``hops`` links onward.

    J_0 = 0 everywhere; J_k(v) = min over allowed links (v, w) of weight + J_{k-1}(w),
    with J_k(sink) = 0 and +inf at a node without allowed links.
    """
    tail, head, w = graph.tail[allowed], graph.head[allowed], weights[allowed]
    j = np.zeros(graph.n_nodes, dtype=np.float64)
    for _ in range(hops):
        nxt = np.full(graph.n_nodes, math.inf)
        np.minimum.at(nxt, tail, w + j[head])
        nxt[graph.sink] = 0.0
        j = nxt
    return j
