"""kademlia's routing table with its defects taken out.

Upstream ``RoutingTable`` is kept for what it does well (bucket ranges, splitting by the
"depth mod 5" rule, replacement caches, the XOR-ordered traversal of
``find_neighbors``). What changes:

* a full bucket does not ``ensure_future`` a ping of its head into the void: the table
  calls ``on_full(head)`` and the owner runs the ping as one of its own tasks;
* contacts are never evicted after a single timeout (upstream issues #23 and #98): the
  owner counts consecutive failures and calls :meth:`remove_contact` only past a bound;
* ``find_neighbors`` no longer stops early: upstream's ``TableTraverser`` raises
  ``StopIteration`` when it meets an empty bucket on the right while buckets remain on
  the left, so a peer with 128 contacts could answer a lookup with none.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from kademlia.node import Node
from kademlia.routing import KBucket, RoutingTable

from .ids import to_bytes

__all__ = ["Node", "OverlayRoutingTable", "make_node"]


def make_node(node_id: int, host: str | None = None, port: int | None = None) -> Node:
    return Node(to_bytes(node_id), host, port)


class OverlayRoutingTable(RoutingTable):  # type: ignore[misc]
    def __init__(self, node: Node, ksize: int, on_full: Callable[[Node], None]) -> None:
        super().__init__(None, ksize, node)
        self._on_full = on_full
        self._flat: list[Node] | None = None
        self._sorted: tuple[list[int], dict[int, Node]] | None = None

    def add_contact(self, node: Node) -> None:
        index = self.get_bucket_for(node)
        bucket = self.buckets[index]
        known = node.id in bucket.nodes
        if bucket.add_node(node):
            if not known:
                self._indexed(node, add=True)
            return
        if bucket.has_in_range(self.node) or _depth(bucket) % 5 != 0:
            self.split_bucket(index)  # may promote replacement nodes: rebuild the index
            self._flat = self._sorted = None
            self.add_contact(node)
        else:
            self._on_full(bucket.head())

    def remove_contact(self, node: Node) -> None:
        bucket = self.buckets[self.get_bucket_for(node)]
        before = set(bucket.nodes)
        bucket.remove_node(node)
        for nid in before.symmetric_difference(bucket.nodes):  # removed, maybe promoted
            self._indexed(
                bucket.nodes.get(nid) or make_node(int.from_bytes(nid, "big")),
                add=nid in bucket.nodes,
            )

    def _indexed(self, node: Node, *, add: bool) -> None:
        """Keep the flat list and the sorted index in step with one membership change."""
        self._flat = None
        if self._sorted is None:
            return
        ordered, by_id = self._sorted
        nid = node.long_id
        if add:
            bisect.insort(ordered, nid)
            by_id[nid] = node
        elif by_id.pop(nid, None) is not None:
            del ordered[bisect.bisect_left(ordered, nid)]

    def find_neighbors(
        self, node: Node, k: int | None = None, exclude: Node | None = None
    ) -> list[Node]:
        """The ``k`` contacts closest to ``node`` in XOR distance.

        The XOR-closest ids to a target all lie in the smallest prefix range around it
        that holds enough of them, and a prefix range is contiguous in numeric order:
        a binary search over the prefix length on the sorted ids finds it, so a lookup
        costs O(log n + k log k) instead of a pass over the whole table.
        """
        k = k or self.ksize
        ordered, by_id = self._index()
        target = node.long_id
        need = k + 2  # room for the target itself and an excluded contact
        lo_bits, hi_bits = 0, 160
        while lo_bits < hi_bits:  # fewest free low bits whose range holds `need` ids
            bits = (lo_bits + hi_bits) // 2
            base = (target >> bits) << bits
            if (
                bisect.bisect_left(ordered, base + (1 << bits)) - bisect.bisect_left(ordered, base)
                >= need
            ):
                hi_bits = bits
            else:
                lo_bits = bits + 1
        base = (target >> lo_bits) << lo_bits
        window = ordered[
            bisect.bisect_left(ordered, base) : bisect.bisect_left(ordered, base + (1 << lo_bits))
        ]
        window.sort(key=lambda i: i ^ target)
        out = []
        for nid in window:
            n = by_id[nid]
            if nid != target and (exclude is None or not n.same_home_as(exclude)):
                out.append(n)
                if len(out) == k:
                    break
        return out

    def _index(self) -> tuple[list[int], dict[int, Node]]:
        if self._sorted is None:
            by_id = {n.long_id: n for n in self.flat()}
            self._sorted = (sorted(by_id), by_id)
        return self._sorted

    def flat(self) -> list[Node]:
        """Every contact in the buckets, as one list (cached until the table changes)."""
        if self._flat is None:
            self._flat = [n for b in self.buckets for n in b.nodes.values()]
        return self._flat

    def contains(self, node: Node) -> bool:
        return not self.is_new_node(node)

    def nodes(self) -> Iterator[Node]:
        return iter(self.flat())

    def __len__(self) -> int:
        return len(self.flat())

    def lonely_buckets(self) -> list[object]:
        msg = "use OverlayNode.refresh(), which runs on the node's clock"
        raise NotImplementedError(msg)


def _depth(bucket: KBucket) -> int:
    """Bits shared by every id in the bucket (upstream builds bit strings for this)."""
    ids: list[int] = [n.long_id for n in bucket.nodes.values()]
    if not ids:
        return 0
    return 160 - (min(ids) ^ max(ids)).bit_length()
