"""Iterative lookups: kademlia's spider crawl with an O(1) membership test.

Upstream ``NodeHeap.__contains__`` scans the whole heap for every pushed node, which
makes a lookup quadratic in the nodes it hears of; with thousands of peers in one
process that dominated the run time. Everything else is upstream's algorithm
(Kademlia §2.3: alpha parallel queries to the closest uncontacted nodes until the k
closest have all answered).
"""

from __future__ import annotations

import heapq
from typing import Any

from kademlia.crawling import NodeSpiderCrawl
from kademlia.node import Node, NodeHeap

__all__ = ["Lookup"]


class _NodeHeap(NodeHeap):  # type: ignore[misc]
    heap: list[tuple[int, Node]]

    def __init__(self, node: Node, maxsize: int) -> None:
        super().__init__(node, maxsize)
        self._ids: set[bytes] = set()

    def push(self, nodes: Any) -> None:
        if not isinstance(nodes, list):
            nodes = [nodes]
        for node in nodes:
            if node.id not in self._ids:
                self._ids.add(node.id)
                heapq.heappush(self.heap, (self.node.distance_to(node), node))

    def remove(self, peers: Any) -> None:
        gone = set(peers)
        if gone:
            kept: list[tuple[int, Node]] = [(d, n) for d, n in self.heap if n.id not in gone]
            self.heap = kept
            heapq.heapify(self.heap)
            self._ids -= gone

    def __contains__(self, node: Node) -> bool:
        return node.id in self._ids


class Lookup(NodeSpiderCrawl):  # type: ignore[misc]
    """The k nodes closest to ``node``: ``await Lookup(protocol, node, seeds, k, a).find()``."""

    def __init__(self, protocol: Any, node: Node, peers: list[Node], ksize: int, alpha: int):
        super().__init__(protocol, node, [], ksize, alpha)
        self.nearest = _NodeHeap(node, ksize)
        self.nearest.push(peers)
