"""The data path of one app instance: what a local node emits goes to its local
consumers (segments, sinks) and out on the edges to other peers; what other peers send
goes to the local consumers of its producer.

A producer's records reach every consumer whole, except a parallel operator's: there
they are partitioned over its instances (by key for keyed operators, else in turn),
each instance local (a segment) or on another peer (an edge). Watermarks and barriers
go to every instance. Traces ride with the records of the first part.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from agiledart.dataplane import Batch, KeyPartitioner, Trace, TraceSampler
from agiledart.dataplane.frames import check_records
from agiledart.local.executor import Emission
from agiledart.operators.base import Record
from agiledart.runtime.deployment import InstanceOptions
from agiledart.runtime.edges import BatchAck, InEdge, OutEdge, ReplyChannel
from agiledart.runtime.links import Address, Links
from agiledart.runtime.segments import Item, Segment, append, merge_wm, mergeable, now_ms
from agiledart.runtime.sinks import LocalSinks
from agiledart.runtime.topology import LocalTopology

if TYPE_CHECKING:
    from agiledart.runtime.recovery import Uplink
    from agiledart.runtime.relay import Relay

__all__ = ["Router"]


class Router:
    """Routes one app instance's records, watermarks and barriers (see the module)."""

    def __init__(
        self,
        *,
        app_id: str,
        me: str,
        generation: int,
        topology: LocalTopology,
        segments: list[Segment],
        segment_of: Mapping[str, Segment],
        sinks: LocalSinks,
        options: InstanceOptions,
        addresses: Mapping[str, Address],
        links: Links,
        spawn: Callable[[Awaitable[None]], Any],
        relay: Relay | None = None,
        uplink: Uplink | None = None,
    ) -> None:
        self.app_id, self.me, self.generation = app_id, me, generation
        self.partition_key = topology.partition_key
        self.segment_of = segment_of
        self.local_sinks = sinks
        self.options = options
        self.addresses = addresses
        self.links = links
        self.spawn = spawn
        self.relay = relay
        self.uplink = uplink
        topo = topology
        segs = segments
        self.edge_by_id: dict[str, OutEdge] = {}
        #: producer id -> local consumers (segments, sinks)
        self.consumers = {
            p: ([segs[i] for i in s], list(k)) for p, (s, k) in topo.consumers.items()
        }
        #: local producer -> edges to the peers hosting its remote consumers (all records)
        self.edges: dict[str, list[OutEdge]] = {
            p: [self._edge(p, peer) for peer in peers] for p, peers in topo.out_peers.items()
        }
        #: local producer -> partitioned consumers: (consumer, one target per instance)
        self.groups: dict[str, list[tuple[str, list[OutEdge | Segment]]]] = {
            p: [(node, [self._target(p, node, peer) for peer in peers]) for node, peers in entries]
            for p, entries in topo.groups.items()
        }
        self._split = {e for es in self.groups.values() for _, ts in es for e in ts}
        self.received: collections.Counter[str] = collections.Counter()
        self._partitioners: dict[int, KeyPartitioner] = {}
        self._sampler = TraceSampler(rate=self.options.trace_rate, seed=random.getrandbits(63))
        #: producer -> local consumers of its batches from other peers: the consumers
        #: above, and this peer's instance of any parallel operator it feeds
        self._remote_inputs = {
            p: ([segs[i] for i in s], list(k)) for p, (s, k) in topo.remote_inputs.items()
        }
        #: the receiving ends of the edges from other peers, by edge id
        self.in_edges: dict[str, InEdge] = {}

    def _edge(self, producer: str, peer: str) -> OutEdge:
        edge = OutEdge(
            app_id=self.app_id,
            producer=producer,
            sender=self.me,
            dest=peer,
            address=self.addresses[peer],
            links=self.links,
            options=self.options,
            spawn=self.spawn,
            relay=self.relay if self.relay is not None and self.relay.carries(peer) else None,
            generation=self.generation,
            uplink=self.uplink,
        )
        self.edge_by_id[f"{edge.id}>{peer}"] = edge
        return edge

    def _target(self, producer: str, node: str, peer: str | None) -> OutEdge | Segment:
        if peer is None:
            return self.segment_of[node]
        return next(e for e in self.edges[producer] if e.dest == peer)

    def sample(self, n: int) -> list[Trace]:
        return self._sampler.sample_count(n, now_ms())

    async def deliver(self, producer: str, records: list[Record], traces: list[Trace]) -> None:
        """A local node's output: to local sinks, consuming segments, remote peers."""
        segs, sinks = self.consumers.get(producer, ((), ()))
        for sink in sinks:
            self.local_sinks.write(sink, records, traces, (producer, self.me))
        for seg in segs:
            await self.put_local(seg, Item(producer, records, traces))
        for edge in self.edges.get(producer, ()):
            if edge not in self._split:
                await edge.send(records, traces)
        for consumer, targets in self.groups.get(producer, ()):
            for i, part in enumerate(self._partition(consumer, records, len(targets))):
                if not part:
                    continue
                target, tags = targets[i], traces if i == 0 else []
                if isinstance(target, OutEdge):
                    await target.send(part, tags)
                else:
                    await self.put_local(target, Item(producer, part, tags))

    def _partition(self, consumer: str, records: list[Record], n: int) -> list[list[Record]]:
        """Records split over ``n`` instances: by key for keyed operators, else in turn."""
        parts: list[list[Record]] = [[] for _ in range(n)]
        field = self.partition_key[consumer]
        if field is None:
            for i, r in enumerate(records):
                parts[i % n].append(r)
            return parts
        pick = self._partitioners.setdefault(n, KeyPartitioner(n))
        for r in records:
            parts[pick(r.get(field))].append(r)
        return parts

    async def deliver_wm(self, producer: str, wm: int, wall: float) -> None:
        segs, sinks = self.consumers.get(producer, ((), ()))
        for sink in sinks:
            await self.local_sinks.watermark(sink, producer, wm, self.me)
        for seg in segs:
            item = Item(producer, None, [], wm=wm, wall=wall)
            await self.put_local(seg, item)
        for edge in self.edges.get(producer, ()):
            await edge.watermark(wm, wall)
        for _, targets in self.groups.get(producer, ()):
            for target in targets:
                if isinstance(target, Segment):
                    item = Item(producer, None, [], wm=wm, wall=wall)
                    await self.put_local(target, item)

    async def put_local(self, seg: Segment, item: Item) -> None:
        """A batch or watermark of a node of this peer; waits while the segment holds
        ``source_queue`` such items."""
        item.local, item.sender = True, self.me
        if item.records is None and item.barrier is None and merge_wm(seg, item):
            return
        if item.records is not None and self._merge_batch(seg, item):
            return
        while seg.local_items >= self.options.source_queue:
            seg.room.clear()
            await seg.room.wait()
        seg.local_items += 1
        append(seg, item)

    def _merge_batch(self, seg: Segment, item: Item) -> bool:
        """Append ``item``'s records to the queued batch of the same producer when that
        batch has not started and stays within ``batch_records``: small outputs (a
        worker's turn) then cost the queue one entry, not one each."""
        last = mergeable(seg, item, self.options.batch_records)
        if last is None or last.records is None or item.records is None:
            return False
        last.records = last.records + item.records  # a new list: batches are shared
        last.traces = last.traces + item.traces if item.traces else last.traces
        seg.pending += len(item.records)
        seg.arrived += len(item.records)
        return True

    # -- remote input -----------------------------------------------------------------

    def accept_data(self, producer: str, batch: Batch, conn: ReplyChannel) -> None:
        """A batch from another peer: into the consuming segments' inboxes, now. A copy
        of one received before is dropped; a sender beyond its credit or sending what
        are not records broke the protocol (:class:`~agiledart.dataplane.ProtocolError`)."""
        check_records(batch)
        edge = self.in_edges.get(batch.edge)
        if edge is None:
            edge = InEdge(
                app_id=self.app_id,
                edge=batch.edge,
                credits=self.options.credits,
                generation=self.generation,
            )
            self.in_edges[batch.edge] = edge
        if not edge.receive(batch):
            return
        records = batch.records
        traces = [tp.trace for tp in batch.traces] if batch.traces else []
        segs, sinks = self.inputs_of(producer)
        if segs or sinks:
            self.received[producer] += len(records)
        for sink in sinks:
            self.local_sinks.write(sink, records, traces, (producer, conn.peer_name))
        if not segs:
            self.spawn(BatchAck(edge, conn, 1).done())
            return
        ack = BatchAck(edge, conn, len(segs))
        for seg in segs:
            append(seg, Item(producer, records, traces, ack=ack, sender=conn.peer_name))

    async def accept_wm(self, producer: str, wm: int, wall: float, sender: str) -> None:
        segs, sinks = self.inputs_of(producer)
        for sink in sinks:
            await self.local_sinks.watermark(sink, producer, wm, sender)
        for seg in segs:
            item = Item(producer, None, [], wm=wm, wall=wall, sender=sender)
            if not merge_wm(seg, item):
                append(seg, item)

    def inputs_of(self, producer: str) -> tuple[list[Segment], list[str]]:
        """Local consumers of what ``producer`` sends from other peers."""
        return self._remote_inputs.get(producer, ([], []))

    def grant(self, edge_key: str, n: int, *, gone: bool = False) -> bool:
        """Credit for an edge; ``gone``: its destination no longer runs the app."""
        edge = self.edge_by_id.get(edge_key)
        if edge is None:
            return False
        if gone:
            edge.gone()
        else:
            edge.grant(n)
        return True

    async def deliver_barrier(self, producer: str, epoch: int) -> None:
        segs, sinks = self.consumers.get(producer, ((), ()))
        for sink in sinks:
            await self.local_sinks.barrier(sink, (producer, self.me), epoch)
        for seg in segs:
            await self.put_local(seg, Item(producer, None, [], barrier=epoch))
        for edge in self.edges.get(producer, ()):
            await edge.barrier(epoch)
        for _, targets in self.groups.get(producer, ()):
            for target in targets:
                if isinstance(target, Segment):
                    await self.put_local(target, Item(producer, None, [], barrier=epoch))

    async def accept_barrier(self, producer: str, epoch: int, sender: str) -> None:
        segs, sinks = self.inputs_of(producer)
        for sink in sinks:
            await self.local_sinks.barrier(sink, (producer, sender), epoch)
        for seg in segs:
            append(seg, Item(producer, None, [], barrier=epoch, sender=sender))

    async def forward(
        self, emitted: list[Emission], traces: list[Trace], *, wall: float | None = None
    ) -> None:
        for node, what in emitted:
            if isinstance(what, list):
                await self.deliver(node, what, traces)
            else:
                await self.deliver_wm(node, what, now_ms() if wall is None else wall)
