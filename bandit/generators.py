"""Road-like test networks with the paper's sizes (§VII-F/G).

A road network here is a perturbed grid: ``rows x cols`` intersections (the most
nearly square factorisation of the node count) jittered off their grid points, joined
by road segments to their grid neighbours, plus at most one diagonal per grid cell.
That keeps it planar (no two roads cross). Segments are removed at random, never one
that would disconnect the network, or diagonals added at random, until the segment
count is reached. Each segment is a bidirectional road: two directed links with the
same expected delay, drawn uniformly from ``delay_ms``. The source is the corner
intersection (0, 0), the sink the opposite corner.

Reading the paper's "links": the sizes (nodes, links) = (25, 32), (36, 64), (64, 128),
(144, 256) and the 16-node, 30-link networks count road segments, i.e. undirected
links; the directed graph has twice as many links. (Read as directed links, 32 links
could not even connect 25 nodes both ways.) A 6x6 or 8x8 grid has fewer segments
than asked (60 < 64, 112 < 128), hence the diagonals.

Link success probability θ = slot_ms / mean delay, so slot_ms must not exceed the
shortest delay; the default 10 ms slot gives θ in [0.04, 0.2] for 50-250 ms links.
"""

from __future__ import annotations

import math

import numpy as np

from agiledart.bandit.errors import BanditUsageError
from agiledart.bandit.graph import Graph

__all__ = [
    "EXPLORATION_NETWORKS",
    "PAPER_SIZES",
    "exploration_network",
    "paper_network",
    "road_network",
]

PAPER_SIZES: tuple[tuple[int, int], ...] = ((25, 32), (36, 64), (64, 128), (144, 256))
"""(nodes, road segments) of the Fig. 17(b) networks."""

PAPER_DELAY_MS = (50.0, 250.0)
"""Expected link delays of the road-map experiments (§VII-F)."""

EXPLORATION_NETWORKS: tuple[tuple[float, float], ...] = (
    (10.0, 100.0),
    (50.0, 100.0),
    (100.0, 300.0),
)
"""Delay ranges of the three 16-node, 30-segment networks of Fig. 17(d)."""

DEFAULT_SLOT_MS = 10.0


def road_network(
    nodes: int,
    segments: int,
    *,
    rng: np.random.Generator,
    delay_ms: tuple[float, float] = PAPER_DELAY_MS,
    slot_ms: float = DEFAULT_SLOT_MS,
    jitter: float = 0.25,
    name: str | None = None,
) -> Graph:
    """A connected planar road-like network with ``segments`` two-way road segments."""
    rows = max(d for d in range(1, math.isqrt(nodes) + 1) if nodes % d == 0)
    cols = nodes // rows
    grid = [(r * cols + c, r * cols + c + 1) for r in range(rows) for c in range(cols - 1)]
    grid += [(r * cols + c, (r + 1) * cols + c) for r in range(rows - 1) for c in range(cols)]
    cells = (rows - 1) * (cols - 1)
    low, high = delay_ms
    if not 0 < slot_ms <= low <= high:
        msg = f"need 0 < slot_ms <= delay range, got slot {slot_ms} and {delay_ms}"
        raise BanditUsageError(msg)
    if not nodes - 1 <= segments <= len(grid) + cells:
        msg = (
            f"a {rows}x{cols} road grid holds {nodes - 1}..{len(grid) + cells} segments, "
            f"asked for {segments}"
        )
        raise BanditUsageError(msg)
    if segments >= len(grid):
        edges = grid + _diagonals(rows, cols, segments - len(grid), rng)
    else:
        edges = _thin(nodes, grid, len(grid) - segments, rng)
    means = rng.uniform(low, high, size=len(edges))
    links = []
    for (a, b), mean in zip(edges, means.tolist(), strict=True):
        links += [(f"n{a}", f"n{b}", slot_ms / mean), (f"n{b}", f"n{a}", slot_ms / mean)]
    grid_points = [(float(c), float(r)) for r in range(rows) for c in range(cols)]
    offsets = rng.uniform(-jitter, jitter, size=(nodes, 2)).tolist()
    positions = [(x + dx, y + dy) for (x, y), (dx, dy) in zip(grid_points, offsets, strict=True)]
    return Graph.build(
        [f"n{i}" for i in range(nodes)],
        links,
        source="n0",
        sink=f"n{nodes - 1}",
        slot_ms=slot_ms,
        name=name or f"road-{nodes}-{segments}",
        positions=positions,
    )


def paper_network(
    nodes: int, *, rng: np.random.Generator, slot_ms: float = DEFAULT_SLOT_MS
) -> Graph:
    """The Fig. 17(b) network with ``nodes`` nodes (25, 36, 64 or 144), 50-250 ms links."""
    segments = dict(PAPER_SIZES).get(nodes)
    if segments is None:
        msg = f"paper networks have {[n for n, _ in PAPER_SIZES]} nodes, not {nodes}"
        raise BanditUsageError(msg)
    return road_network(nodes, segments, rng=rng, slot_ms=slot_ms, name=f"road-{nodes}")


def exploration_network(
    number: int, *, rng: np.random.Generator, slot_ms: float = DEFAULT_SLOT_MS
) -> Graph:
    """Fig. 17(d) network #1, #2 or #3: 16 nodes, 30 segments, its delay range."""
    if not 1 <= number <= len(EXPLORATION_NETWORKS):
        msg = f"exploration networks are numbered 1..{len(EXPLORATION_NETWORKS)}, not {number}"
        raise BanditUsageError(msg)
    delay = EXPLORATION_NETWORKS[number - 1]
    return road_network(16, 30, rng=rng, delay_ms=delay, slot_ms=slot_ms, name=f"explore-{number}")


def _diagonals(rows: int, cols: int, count: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """``count`` diagonals in distinct cells, each in a random direction."""
    chosen = rng.choice((rows - 1) * (cols - 1), size=count, replace=False).tolist()
    flips = rng.random(count) < 0.5
    out = []
    for cell, flip in zip(chosen, flips.tolist(), strict=True):
        r, c = divmod(cell, cols - 1)
        top_left = r * cols + c
        out.append((top_left + 1, top_left + cols) if flip else (top_left, top_left + cols + 1))
    return out


def _thin(
    nodes: int, edges: list[tuple[int, int]], count: int, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """Remove ``count`` random edges, skipping any whose removal disconnects the graph."""
    kept = list(edges)
    removed = 0
    for i in rng.permutation(len(edges)).tolist():
        if removed == count:
            break
        trial = [e for e in kept if e != edges[i]]
        if _connected(nodes, trial):
            kept = trial
            removed += 1
    return kept


def _connected(nodes: int, edges: list[tuple[int, int]]) -> bool:
    parent = list(range(nodes))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    components = nodes
    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
            components -= 1
    return components == 1
