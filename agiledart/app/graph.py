"""The app as a graph: topological order, cycles, chains, merge points.

Placement (docs/placement.md) lays operators along each source-to-sink path in topological
order and needs the points where paths meet (operators with more than one input: the
rendezvous of JOIN routing). These helpers answer those questions for a validated
:class:`~agiledart.app.spec.AppSpec`; the ``*_of`` variants work on a bare
``{node: inputs}`` mapping and are what validation uses before a spec exists.

Orders are deterministic: ties are broken by declaration order (sources, then
operators, then sinks, each in the order written).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agiledart.app.spec import AppSpec

__all__ = [
    "Graph",
    "chains",
    "consumers",
    "find_cycle",
    "graph_of",
    "merge_points",
    "reaches",
    "topological_order",
    "topological_order_of",
]

#: ``{node id: ids of its inputs}``, in declaration order; sources map to ().
Graph = Mapping[str, Sequence[str]]


def graph_of(app: AppSpec) -> dict[str, tuple[str, ...]]:
    g: dict[str, tuple[str, ...]] = {s.id: () for s in app.sources}
    g.update((o.id, o.inputs) for o in app.operators)
    g.update((s.id, s.inputs) for s in app.sinks)
    return g


def consumers_of(graph: Graph) -> dict[str, list[tuple[str, int]]]:
    """``{node: [(consumer, input index), ...]}`` in declaration order."""
    out: dict[str, list[tuple[str, int]]] = {n: [] for n in graph}
    for node, inputs in graph.items():
        for i, src in enumerate(inputs):
            if src in out:
                out[src].append((node, i))
    return out


def consumers(app: AppSpec) -> dict[str, list[tuple[str, int]]]:
    return consumers_of(graph_of(app))


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]`` (each feeds the next), or None if acyclic."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    cons = consumers_of(graph)
    for start in graph:
        if color[start] != white:
            continue
        # iterative DFS along consumer edges, keeping the grey path
        path: list[str] = [start]
        iters = [iter(cons[start])]
        color[start] = grey
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                color[path.pop()] = black
                iters.pop()
                continue
            node = nxt[0]
            if color[node] == grey:
                return [*path[path.index(node) :], node]
            if color[node] == white:
                color[node] = grey
                path.append(node)
                iters.append(iter(cons[node]))
    return None


def topological_order_of(graph: Graph) -> list[str]:
    """Kahn's algorithm, ties broken by declaration order. Requires an acyclic graph."""
    rank = {n: i for i, n in enumerate(graph)}
    indeg = {n: sum(1 for s in ins if s in graph) for n, ins in graph.items()}
    cons = consumers_of(graph)
    ready = sorted((n for n, d in indeg.items() if d == 0), key=rank.__getitem__)
    order: list[str] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for c, _ in cons[node]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
                ready.sort(key=rank.__getitem__)
    if len(order) != len(graph):
        msg = "graph has a cycle"
        raise ValueError(msg)
    return order


def topological_order(app: AppSpec) -> list[str]:
    """Every node id (sources, operators, sinks) with each after all of its inputs."""
    return topological_order_of(graph_of(app))


def reaches(graph: Graph, targets: Sequence[str]) -> set[str]:
    """Nodes with a path to any of ``targets`` (the targets included)."""
    seen = set(targets)
    stack = list(targets)
    while stack:
        for src in graph.get(stack.pop(), ()):
            if src in graph and src not in seen:
                seen.add(src)
                stack.append(src)
    return seen


def chains(app: AppSpec) -> dict[str, list[tuple[str, ...]]]:
    """For each sink, every source-to-sink path ``(source, op, ..., sink)``.

    Paths are listed depth-first with inputs in declared order, so a join's left path
    comes before its right path.
    """
    graph = graph_of(app)
    out: dict[str, list[tuple[str, ...]]] = {}
    for sink in app.sinks:
        paths: list[tuple[str, ...]] = []

        def walk(node: str, suffix: tuple[str, ...], paths: list[tuple[str, ...]] = paths) -> None:
            ins = graph[node]
            if not ins:
                paths.append((node, *suffix))
                return
            for src in ins:
                walk(src, (node, *suffix))

        walk(sink.id, ())
        out[sink.id] = paths
    return out


def merge_points(app: AppSpec) -> list[str]:
    """Operators with more than one input (union, join), in topological order."""
    ops = {o.id: o for o in app.operators}
    return [n for n in topological_order(app) if n in ops and len(ops[n].inputs) > 1]
