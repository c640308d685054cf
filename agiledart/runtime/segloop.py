"""The task of a segment: it takes its inbox's items in order, a turn of records at a
time, runs them on the segment's unit (or its replicas at once), forwards what they
emit, aligns checkpoint barriers, and acknowledges each batch once it is done (its
credit goes back). Idle, it lets partial batches on its edges leave.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from agiledart.dataplane import Trace
from agiledart.local.executor import Emission
from agiledart.operators.base import FINAL_WATERMARK, Record
from agiledart.runtime.deadletters import DeadLetters
from agiledart.runtime.replicas import combine, split_records
from agiledart.runtime.replication import Replication
from agiledart.runtime.routing import Router
from agiledart.runtime.segments import Item, Segment, fail_on_error, post_dead_letters
from agiledart.runtime.snapshots import InstanceCheckpoints
from agiledart.runtime.topology import LocalTopology, merged_watermark

__all__ = ["SegmentLoop"]


class SegmentLoop:
    """Runs the segments of one app instance (one :meth:`run` task each)."""

    def __init__(
        self,
        *,
        topology: LocalTopology,
        router: Router,
        replication: Replication,
        checkpoints: InstanceCheckpoints,
        dead_letters: Mapping[str, DeadLetters],
    ) -> None:
        self.spec = topology.spec
        self.topology = topology
        self.router = router
        self.edges = router.edges
        self.replication = replication
        self.checkpoints = checkpoints
        self.dead_letters = dead_letters

    async def run(self, seg: Segment) -> None:
        strict = [o for o in seg.ops if self.spec.operator(o).on_error == "fail"]
        dead = [o for o in seg.ops if o in self.dead_letters]
        while True:
            while not seg.inbox and seg.resize_to is None:
                seg.wake.clear()
                await seg.wake.wait()
            if seg.resize_to is not None:  # between two items: the replicas are idle
                await self.replication.apply(seg)
                continue
            unit = seg.unit
            assert unit is not None
            item = seg.inbox[0]
            channel = (item.producer, item.sender)
            if seg.align.blocked(channel) and not item.offset:  # after its barrier: wait
                seg.inbox.popleft()
                seg.held.append(item)
                continue
            turn = unit.turn if unit.turn is None else unit.turn * seg.replicas
            done = True
            if item.barrier is not None:
                self._pop(seg)
                seg.pending -= 1
                epoch = seg.align.barrier(channel, item.barrier)
                if epoch is not None:
                    await self.checkpoints.aligned(seg, epoch)
            elif item.records is not None:
                first, n = item.offset, len(item.records)
                take = n - first if turn is None else min(turn, n - first)
                chunk = item.records if take == n else item.records[first : first + take]
                item.offset += take
                done = item.offset >= n
                if done:
                    self._pop(seg)
                if take:
                    start = time.monotonic()
                    emitted, service_s = await self._feed(seg, item.producer, chunk)
                    seg.pending -= take
                    end = time.monotonic()
                    seg.meter.executed(
                        max(start, end - service_s),
                        end,
                        take,
                        start - item.queued_at,
                        worker_wait_s=unit.wait_s,
                    )
                    if strict:
                        fail_on_error(seg, strict)
                    if dead:
                        post_dead_letters(seg, dead, self.dead_letters)
                    await self.router.forward(emitted, item.traces if first == 0 else [])
                if done and item.wm_after is not None:
                    await self._watermark(seg, item, item.wm_after, item.wall_after)
            else:
                self._pop(seg)
                await self._watermark(seg, item, item.wm, item.wall)
                seg.pending -= 1
            if done:
                seg.processed += 1
                if item.ack is not None:
                    await item.ack.done()
            if not seg.inbox:  # idle: what waits for the batch to fill leaves now
                seg.meter.drained(time.monotonic())
                for op in seg.ops:
                    for edge in self.edges.get(op, ()):
                        await edge.flush_idle()
            await asyncio.sleep(0)  # a full inbox must not starve the peer's other tasks

    async def _feed(
        self, seg: Segment, producer: str, records: list[Record]
    ) -> tuple[list[Emission], float]:
        """One turn of ``records``: on the segment's unit, or split over its replicas
        (then run at once, on as many workers); the emissions and the turn's longest
        execution time."""
        seg.executed += len(records)
        if seg.replicas == 1:
            assert seg.unit is not None
            out = await seg.unit.feed(producer, records)
            seg.service_s += seg.unit.service_s
            return out, seg.unit.service_s
        parts = split_records(records, seg.replicas, seg.split_field)
        busy = [(u, part) for u, part in zip(seg.units, parts, strict=True) if part]
        outs = await asyncio.gather(*(u.feed(producer, part) for u, part in busy))
        seg.service_s += sum(u.service_s for u, _ in busy)
        return combine(outs), max((u.service_s for u, _ in busy), default=0.0)

    def _pop(self, seg: Segment) -> None:
        item = seg.inbox.popleft()
        item.popped = True
        if item.local:
            seg.local_items -= 1
            seg.room.set()

    async def _watermark(self, seg: Segment, item: Item, wm: int, wall: float) -> None:
        assert seg.unit is not None
        tracker = seg.watermarks.setdefault(item.producer, {})
        merged = merged_watermark(self.topology, tracker, item.producer, item.sender, wm)
        if seg.replicas == 1:
            emitted = await seg.unit.watermark(item.producer, merged)
        else:
            outs = await asyncio.gather(*(u.watermark(item.producer, merged) for u in seg.units))
            emitted = combine(outs)
        await self.router.forward(emitted, [Trace(0, wall)], wall=wall)
        if wm >= FINAL_WATERMARK:  # the channel ended: alignment stops waiting for it
            epoch = seg.align.finish((item.producer, item.sender))
            if epoch is not None:
                await self.checkpoints.aligned(seg, epoch)
