"""Region decomposition of an app's DAG (RTR, Veith et al., ICSOC 2018, §3.1).

*Split points* are the nodes where paths fork (more than one consumer) or join (more
than one input). Cutting the DAG after every fork and before every join leaves
*series regions*: chains whose inner links are one-in, one-out. Regions form a DAG of
their own, visited breadth-first from the sources' regions, a region only once all
regions feeding it were visited (priority to upstream operators). That visit is the
*deployment sequence* both RTR and RTR+RP place operators in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from agiledart.app.graph import consumers, graph_of, topological_order
from agiledart.app.spec import AppSpec

__all__ = ["Region", "deployment_sequence", "regions", "split_points"]


@dataclass(frozen=True, slots=True)
class Region:
    """A series region: node ids in flow order."""

    nodes: tuple[str, ...]

    @property
    def first(self) -> str:
        return self.nodes[0]

    @property
    def last(self) -> str:
        return self.nodes[-1]


def split_points(app: AppSpec) -> tuple[str, ...]:
    """Nodes with more than one consumer (forks) or input (joins), in topological order."""
    inputs = graph_of(app)
    outs = consumers(app)
    return tuple(
        n
        for n in topological_order(app)
        if len(inputs.get(n, ())) > 1 or len({c for c, _ in outs.get(n, ())}) > 1
    )


def regions(app: AppSpec) -> tuple[Region, ...]:
    """The series regions, in breadth-first order from the sources (see module doc)."""
    inputs = graph_of(app)
    outs = {n: list(dict.fromkeys(c for c, _ in cs)) for n, cs in consumers(app).items()}

    def continues(a: str, b: str) -> bool:  # is a -> b inside one region?
        return len(outs.get(a, ())) == 1 and len(inputs.get(b, ())) == 1

    region_of: dict[str, int] = {}
    found: list[list[str]] = []
    for node in topological_order(app):
        ins = inputs.get(node, ())
        if len(ins) == 1 and continues(ins[0], node):
            idx = region_of[ins[0]]
            found[idx].append(node)
        else:
            idx = len(found)
            found.append([node])
        region_of[node] = idx
    # the region DAG, visited breadth-first; a region waits for all its feeders
    feeds: dict[int, set[int]] = {i: set() for i in range(len(found))}
    waiting: dict[int, int] = dict.fromkeys(range(len(found)), 0)
    for i, nodes in enumerate(found):
        for src in {region_of[x] for x in inputs.get(nodes[0], ())}:
            feeds[src].add(i)
            waiting[i] += 1
    queue = deque(i for i in range(len(found)) if waiting[i] == 0)
    order: list[Region] = []
    while queue:
        i = queue.popleft()
        order.append(Region(tuple(found[i])))
        for j in sorted(feeds[i]):
            waiting[j] -= 1
            if waiting[j] == 0:
                queue.append(j)
    return tuple(order)


def deployment_sequence(app: AppSpec) -> tuple[str, ...]:
    """Operator ids in the order strategies place them (sources and sinks left out)."""
    ops = {o.id for o in app.operators}
    return tuple(n for r in regions(app) for n in r.nodes if n in ops)
