"""Networks to route over, and their JSON file format.

A :class:`Graph` is a directed graph with one source and one sink. Every link has an
unknown-to-the-policies success probability θ per transmission attempt; an attempt
takes one slot of ``slot_ms`` milliseconds, so the link's delay is geometric with mean
``slot_ms / θ`` ms. Nodes are numbered 0..n-1 inside; their ids (strings or integers)
are kept for files and traces.

File format (``agiledart-bandit-graph``, version 1; see also docs/bandit-graphs.md)::

    {
      "format": "agiledart-bandit-graph",   # required, exactly this
      "version": 1,                          # required
      "name": "my-net",                      # optional
      "slot_ms": 10.0,                       # optional, default 1.0; > 0
      "undirected": false,                   # optional: true = every link goes both ways
      "source": "a",                         # a node id
      "sink": "d",                           # a node id, reachable from the source
      "nodes": ["a", "b", {"id": "c", "x": 1.0, "y": 2.5}, "d"],
      "links": [
        {"from": "a", "to": "b", "theta": 0.25},           # success probability in (0, 1]
        {"from": "b", "to": "d", "mean_delay_ms": 80.0},   # or expected delay >= slot_ms
        ...
      ]
    }

A node is an id (string or integer) or an object with ``id`` and optional ``x``, ``y``
coordinates (for drawing only). A link gives ``theta``, ``mean_delay_ms`` or both
(then they must agree: theta = slot_ms / mean_delay_ms). No self-loops, no duplicate
(from, to) pairs. :func:`save_graph` writes directed links with both fields, so a saved
file loads back to an identical graph. Every problem raises :class:`GraphError` naming
the field, e.g. ``links[3].theta: must be in (0, 1], got 1.5``.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from numpy.typing import NDArray

from agiledart.bandit.errors import BanditUsageError, GraphError

__all__ = ["FORMAT", "Graph", "NodeId", "load_graph", "save_graph"]

FORMAT = "agiledart-bandit-graph"
VERSION = 1

NodeId = str | int


@dataclass(frozen=True, eq=False, kw_only=True)
class Graph:
    """A directed network with per-link success probabilities, validated when built.

    Use :meth:`build` (ids) or :func:`load_graph`; the constructor takes arrays.
    """

    node_ids: tuple[NodeId, ...]
    tail: NDArray[np.int64]
    head: NDArray[np.int64]
    theta: NDArray[np.float64]
    source: int
    sink: int
    slot_ms: float = 1.0
    name: str = ""
    positions: NDArray[np.float64] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Own read-only copies: cached views (adjacency, hop counts) must not go stale.
        for name, dtype in (("tail", np.int64), ("head", np.int64), ("theta", np.float64)):
            object.__setattr__(self, name, _frozen(getattr(self, name), dtype))
        if self.positions is not None:
            object.__setattr__(self, "positions", _frozen(self.positions, np.float64))
        _validate(self)

    @classmethod
    def build(
        cls,
        nodes: Sequence[NodeId],
        links: Sequence[tuple[NodeId, NodeId, float]],
        *,
        source: NodeId,
        sink: NodeId,
        slot_ms: float = 1.0,
        name: str = "",
        positions: Sequence[tuple[float, float]] | None = None,
    ) -> Graph:
        """A graph from node ids and ``(from, to, theta)`` triples."""
        index = _index_nodes(nodes)
        tails, heads, thetas = [], [], []
        for i, (a, b, theta) in enumerate(links):
            tails.append(_lookup(index, a, f"links[{i}].from"))
            heads.append(_lookup(index, b, f"links[{i}].to"))
            thetas.append(float(theta))
        return cls(
            node_ids=tuple(nodes),
            tail=np.asarray(tails, dtype=np.int64),
            head=np.asarray(heads, dtype=np.int64),
            theta=np.asarray(thetas, dtype=np.float64),
            source=_lookup(index, source, "source"),
            sink=_lookup(index, sink, "sink"),
            slot_ms=float(slot_ms),
            name=name,
            positions=None if positions is None else np.asarray(positions, dtype=np.float64),
        )

    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def n_links(self) -> int:
        return len(self.tail)

    @cached_property
    def mean_delay_ms(self) -> NDArray[np.float64]:
        """Expected delay of each link, slot_ms / θ."""
        return np.asarray(self.slot_ms / self.theta, dtype=np.float64)

    @cached_property
    def out_links(self) -> tuple[tuple[int, ...], ...]:
        """Link indices leaving each node, in link order."""
        return _adjacency(self.n_nodes, self.tail.tolist())

    @cached_property
    def in_links(self) -> tuple[tuple[int, ...], ...]:
        """Link indices entering each node, in link order."""
        return _adjacency(self.n_nodes, self.head.tolist())

    @cached_property
    def in_pairs(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """(link, tail) pairs entering each node: the reversed graph, for Dijkstra."""
        tail = self.tail.tolist()
        return tuple(tuple((link, tail[link]) for link in links) for links in self.in_links)

    @cached_property
    def hops_to_sink(self) -> NDArray[np.int64]:
        """Fewest links from each node to the sink; -1 where the sink is unreachable."""
        hops = np.full(self.n_nodes, -1, dtype=np.int64)
        hops[self.sink] = 0
        queue = deque([self.sink])
        tail = self.tail.tolist()
        while queue:
            v = queue.popleft()
            for link in self.in_links[v]:
                u = tail[link]
                if hops[u] < 0:
                    hops[u] = hops[v] + 1
                    queue.append(u)
        return hops

    def index(self, node: NodeId) -> int:
        """Internal index of a node id."""
        try:
            return self._index[node]
        except KeyError:
            msg = f"no node {node!r} in graph {self.name!r}"
            raise BanditUsageError(msg) from None

    def link(self, tail: NodeId, head: NodeId) -> int:
        """Index of the link between two node ids."""
        try:
            return self._link_index[self.index(tail), self.index(head)]
        except KeyError:
            msg = f"no link {tail!r} -> {head!r} in graph {self.name!r}"
            raise BanditUsageError(msg) from None

    @cached_property
    def _index(self) -> dict[NodeId, int]:
        return {node: i for i, node in enumerate(self.node_ids)}

    @cached_property
    def _link_index(self) -> dict[tuple[int, int], int]:
        return {
            (a, b): i
            for i, (a, b) in enumerate(zip(self.tail.tolist(), self.head.tolist(), strict=True))
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form described in the module docstring."""
        if self.positions is None:
            nodes: list[Any] = list(self.node_ids)
        else:
            nodes = [
                {"id": node}
                | ({} if math.isnan(x) else {"x": x})
                | ({} if math.isnan(y) else {"y": y})
                for node, (x, y) in zip(self.node_ids, self.positions.tolist(), strict=True)
            ]
        links = [
            {
                "from": self.node_ids[a],
                "to": self.node_ids[b],
                "theta": theta,
                "mean_delay_ms": self.slot_ms / theta,
            }
            for a, b, theta in zip(
                self.tail.tolist(), self.head.tolist(), self.theta.tolist(), strict=True
            )
        ]
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "slot_ms": self.slot_ms,
            "undirected": False,
            "source": self.node_ids[self.source],
            "sink": self.node_ids[self.sink],
            "nodes": nodes,
            "links": links,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Graph:
        """Parse the JSON form; :class:`GraphError` names the first bad field."""
        return _parse(data)


def load_graph(path: str | Path) -> Graph:
    """Read a graph file (format in the module docstring)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read {path}: {exc.strerror or exc}"
        _fail("file", msg)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"{path} is not valid JSON: {exc}"
        _fail("file", msg)
    return Graph.from_dict(data)


def save_graph(graph: Graph, path: str | Path) -> None:
    """Write a graph file that :func:`load_graph` reads back to an identical graph."""
    Path(path).write_text(json.dumps(graph.to_dict(), indent=1) + "\n", encoding="utf-8")


# -- parsing and validation ------------------------------------------------------------


def _parse(data: Any) -> Graph:
    if not isinstance(data, Mapping):
        _fail("(top level)", "must be a JSON object")
    if data.get("format") != FORMAT:
        _fail("format", f"must be {FORMAT!r}, got {data.get('format')!r}")
    if data.get("version") != VERSION:
        _fail("version", f"must be {VERSION}, got {data.get('version')!r}")
    slot_ms = _number(data.get("slot_ms", 1.0), "slot_ms")
    if not slot_ms > 0:
        _fail("slot_ms", f"must be > 0, got {slot_ms!r}")
    name = data.get("name", "")
    if not isinstance(name, str):
        _fail("name", "must be a string")
    undirected = data.get("undirected", False)
    if not isinstance(undirected, bool):
        _fail("undirected", "must be true or false")
    nodes, positions = _parse_nodes(data.get("nodes"))
    raw_links = data.get("links")
    if not isinstance(raw_links, list):
        _fail("links", "must be a list of link objects")
    links: list[tuple[NodeId, NodeId, float]] = []
    for i, raw in enumerate(raw_links):
        a, b, theta = _parse_link(raw, f"links[{i}]", slot_ms)
        links.append((a, b, theta))
        if undirected:
            links.append((b, a, theta))
    for key in ("source", "sink"):
        if key not in data:
            _fail(key, "missing")
    return Graph.build(
        nodes,
        links,
        source=data["source"],
        sink=data["sink"],
        slot_ms=slot_ms,
        name=name,
        positions=positions,
    )


def _parse_nodes(raw: Any) -> tuple[list[NodeId], list[tuple[float, float]] | None]:
    if not isinstance(raw, list) or not raw:
        _fail("nodes", "must be a non-empty list")
    nodes: list[NodeId] = []
    positions: list[tuple[float, float]] = []
    for i, item in enumerate(raw):
        if isinstance(item, Mapping):
            if "id" not in item:
                _fail(f"nodes[{i}].id", "missing")
            nodes.append(_node_id(item["id"], f"nodes[{i}].id"))
            positions.append(
                (
                    _number(item.get("x", math.nan), f"nodes[{i}].x", allow_nan=True),
                    _number(item.get("y", math.nan), f"nodes[{i}].y", allow_nan=True),
                )
            )
        else:
            nodes.append(_node_id(item, f"nodes[{i}]"))
            positions.append((math.nan, math.nan))
    has_positions = any(not math.isnan(x) for x, _ in positions)
    return nodes, (positions if has_positions else None)


def _parse_link(raw: Any, where: str, slot_ms: float) -> tuple[NodeId, NodeId, float]:
    if not isinstance(raw, Mapping):
        _fail(where, "must be an object with from, to and theta or mean_delay_ms")
    for key in ("from", "to"):
        if key not in raw:
            _fail(f"{where}.{key}", "missing")
    theta = _number(raw["theta"], f"{where}.theta") if "theta" in raw else None
    mean = (
        _number(raw["mean_delay_ms"], f"{where}.mean_delay_ms") if "mean_delay_ms" in raw else None
    )
    if theta is None and mean is None:
        _fail(where, "needs theta or mean_delay_ms")
    if mean is not None:
        if not mean >= slot_ms:
            _fail(f"{where}.mean_delay_ms", f"must be >= slot_ms ({slot_ms}), got {mean}")
        from_mean = slot_ms / mean
        if theta is not None and not math.isclose(theta, from_mean, rel_tol=1e-9):
            _fail(
                f"{where}.theta", f"{theta} disagrees with mean_delay_ms {mean} (slot_ms {slot_ms})"
            )
        theta = from_mean if theta is None else theta
    assert theta is not None
    return raw["from"], raw["to"], theta


def _fail(field: str, problem: str) -> NoReturn:
    raise GraphError(field, problem)


def _node_id(value: Any, where: str) -> NodeId:
    if isinstance(value, bool) or not isinstance(value, str | int):
        _fail(where, f"a node id must be a string or an integer, got {value!r}")
    return value


def _number(value: Any, where: str, *, allow_nan: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(where, f"must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) and not (allow_nan and math.isnan(number)):
        _fail(where, f"must be finite, got {value!r}")
    return number


def _index_nodes(nodes: Sequence[NodeId]) -> dict[NodeId, int]:
    index: dict[NodeId, int] = {}
    for i, node in enumerate(nodes):
        _node_id(node, f"nodes[{i}]")
        if node in index:
            _fail(f"nodes[{i}]", f"duplicate node id {node!r}")
        index[node] = i
    return index


def _lookup(index: Mapping[NodeId, int], node: Any, where: str) -> int:
    if isinstance(node, bool) or not isinstance(node, str | int) or node not in index:
        _fail(where, f"unknown node {node!r}")
    return index[node]


def _frozen(values: Any, dtype: type[np.generic]) -> NDArray[Any]:
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


def _adjacency(n: int, ends: list[int]) -> tuple[tuple[int, ...], ...]:
    lists: list[list[int]] = [[] for _ in range(n)]
    for link, v in enumerate(ends):
        lists[v].append(link)
    return tuple(tuple(links) for links in lists)


def _validate(g: Graph) -> None:
    n = len(g.node_ids)
    if n < 2:
        _fail("nodes", "need at least two nodes")
    _index_nodes(g.node_ids)
    if not (g.tail.shape == g.head.shape == g.theta.shape and g.tail.ndim == 1):
        _fail("links", "tail, head and theta must be 1-d arrays of one length")
    for i, (a, b, theta) in enumerate(
        zip(g.tail.tolist(), g.head.tolist(), g.theta.tolist(), strict=True)
    ):
        if not (0 <= a < n and 0 <= b < n):
            _fail(f"links[{i}]", "endpoint out of range")
        if a == b:
            _fail(f"links[{i}]", f"self-loop at {g.node_ids[a]!r}")
        if not 0.0 < theta <= 1.0:
            _fail(f"links[{i}].theta", f"must be in (0, 1], got {theta}")
    if len(set(zip(g.tail.tolist(), g.head.tolist(), strict=True))) != len(g.tail):
        seen: set[tuple[int, int]] = set()
        for i, key in enumerate(zip(g.tail.tolist(), g.head.tolist(), strict=True)):
            if key in seen:
                a, b = (g.node_ids[k] for k in key)
                _fail(f"links[{i}]", f"duplicate link {a!r} -> {b!r}")
            seen.add(key)
    if not (math.isfinite(g.slot_ms) and g.slot_ms > 0):
        _fail("slot_ms", f"must be > 0, got {g.slot_ms}")
    if g.positions is not None and g.positions.shape != (n, 2):
        _fail("positions", f"must have shape ({n}, 2)")
    for end, value in (("source", g.source), ("sink", g.sink)):
        if not 0 <= value < n:
            _fail(end, "out of range")
    if g.source == g.sink:
        _fail("sink", "must differ from the source")
    if g.hops_to_sink[g.source] < 0:
        _fail("sink", "not reachable from the source")
