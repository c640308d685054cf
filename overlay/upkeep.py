"""The periodic work that keeps one overlay node's view of the ring fresh.

Theory of operation (paper §IV-A; Kademlia §2.3): every leaf-set neighbour is
heartbeated about once a second (jittered), a miss counted by the failure detector and
a peer declared dead after ``misses_to_dead`` in a row, never after one lost datagram;
every few beats (every beat while the leaf set is short) the heartbeat also exchanges
contacts near the asker, which repairs holes that lost lookups leave. Buckets are
refreshed now and then (:meth:`Upkeep.refresh`), and a few recently dead peers (the
bootstrap peers when alone) are probed again, which heals partitions. The loops run
as children of the node's task group (:class:`~.node.OverlayNode`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from . import ids
from .errors import BadMessage, MalformedError
from .failure import Health
from .lookup import Lookup
from .protocol import Address, check_contact
from .routing import Contact
from .table import make_node

if TYPE_CHECKING:
    from .node import OverlayNode

__all__ = ["Upkeep"]


class Upkeep:
    """Heartbeats, bucket refresh and graveyard probes of one node."""

    def __init__(self, node: OverlayNode) -> None:
        self.node = node

    def loops(self) -> tuple[Coroutine[Any, Any, None], ...]:
        """The endless loops, for the node to run in its task group."""
        return (self._heartbeat_loop(), self._refresh_loop(), self._graveyard_loop())

    async def refresh(self) -> None:
        """Re-learn the id space around us (Kademlia §2.3's bucket refresh).

        For every prefix level ``j`` above the leaf set's reach, ask the closest contact
        we know for the neighbours of a random id that differs from ours first at bit
        ``j``: one RPC per level fills the subtree at distance [2^j, 2^(j+1)). Levels
        below the farthest leaf-set member are the leaf set's, kept by heartbeats; and
        our two closest neighbours are asked for theirs of our own id, which closes the
        gaps that peers joining at the same moment leave in each other's leaf sets.
        """
        node = self.node
        members = node.leaf_set.members()
        reach = (members[-1].node_id ^ node.node_id).bit_length() if members else 0
        queries = []
        for level in range(ids.ID_BITS - 1, max(reach - 2, -1), -1):
            noise = node.rng.getrandbits(level) if level else 0
            target = make_node(node.node_id ^ (1 << level) ^ noise)
            near = node.router.find_neighbors(target, k=1)
            if near:
                queries.append(node.protocol.call_find_node(near[0], target))
        for near in node.router.find_neighbors(node.kad_node, k=2):
            queries.append(node.protocol.call_find_node(near, node.kad_node))
        await asyncio.gather(*queries)

    async def _heartbeat_loop(self) -> None:
        node = self.node
        interval = node.config.heartbeat_interval_s
        beat = 0
        while True:
            await asyncio.sleep(interval * (0.9 + 0.2 * node.rng.random()))
            beat += 1
            # leaf sets are exchanged every few beats, and on every beat while ours is short
            exchange = beat % 4 == 0 or len(node.leaf_set) < node.leaf_set.size
            for contact in node.leaf_set.members():
                node.spawn(self._heartbeat(contact, exchange))

    async def _heartbeat(self, contact: Contact, exchange: bool) -> None:
        node = self.node
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ok, res = await node.protocol.call(
            contact.address,
            "heartbeat",
            ids.to_bytes(node.node_id),
            node.capacity(),
            exchange,
            node.name,
            timeout=min(node.config.rpc_timeout_s, node.config.heartbeat_interval_s),
            to=contact.node_id,
        )
        nid = contact.node_id
        if not ok:
            if node.detector.on_miss(nid) is Health.DEAD:
                node.declare_dead(nid)
            return
        try:
            raw, cap, name, members = res
            if ids.from_bytes(raw) != nid:
                msg = "heartbeat answered by another id"
                raise MalformedError(msg)
            learned = [check_contact(m) for m in members[: 4 * node.config.leaf_set_size]]
        except (BadMessage, TypeError, ValueError):
            node.reject(MalformedError("bad heartbeat response"), contact.address)
            return
        contact.observe_rtt((loop.time() - t0) * 1000)
        if isinstance(cap, float | int):
            contact.capacity = float(cap)
        if isinstance(name, str) and name:
            contact.name = name
        node.detector.on_ack(nid)
        node.learn(learned)

    async def _refresh_loop(self) -> None:
        node = self.node
        while True:
            await asyncio.sleep(node.config.refresh_interval_s * (0.9 + 0.2 * node.rng.random()))
            node.spawn(self._crawl_self())
            node.spawn(self.refresh())

    async def _crawl_self(self) -> None:
        node = self.node
        seeds = node.router.find_neighbors(node.kad_node, k=node.config.alpha)
        if seeds:
            await Lookup(
                node.protocol, node.kad_node, seeds, node.config.ksize, node.config.alpha
            ).find()

    async def _graveyard_loop(self) -> None:
        """Probe a few recently dead peers (and the bootstrap list when alone): heals
        partitions, since after one both sides have declared each other dead."""
        node = self.node
        while True:
            await asyncio.sleep(node.config.graveyard_probe_interval_s)
            now = asyncio.get_running_loop().time()
            while node.graveyard:
                _, (_, since) = next(iter(node.graveyard.items()))
                if now - since < node.config.graveyard_ttl_s:
                    break
                node.graveyard.popitem(last=False)
            graves = [(c.address, c.node_id) for c, _ in node.graveyard.values()]
            picks: list[tuple[Address, int | None]] = node.rng.sample(
                graves, min(len(graves), node.config.graveyard_probes)
            )
            if not node.contacts:
                picks += [(addr, None) for addr in node.bootstrap_peers]
            for addr, nid in picks:
                node.spawn(node.ping(addr, nid))
