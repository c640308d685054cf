"""One peer's part of a running app: its sources, operators and sinks, and the edges
between them and the other peers' parts.

Theory of operation
-------------------
The scheduler sends every hosting peer the same :class:`Deployment` (spec, which peer
hosts each node, peer addresses). Each peer builds an :class:`AppInstance` from it:

* **Tasks.** Every local source runs in its own task (the connector paces it). The
  local operators are split into *segments*: connected groups of operators joined by
  local edges, each driven by one :class:`~agiledart.app.local.Executor` in one task
  that owns an inbox. A segment through which a path leaves the peer and comes back is
  split into single operators, so no task ever waits on a peer that waits on it (tasks
  form a DAG like the app, so back-pressure cannot deadlock).
* **Edges.** Records for a node on another peer leave through an :class:`OutEdge`
  (one per producer and destination peer): batches of up to ``batch_records`` records,
  flushed when full, when the task producing them has nothing more to do, or
  ``linger_s`` after the first record waited, whichever comes first; sent as one-way
  ``data`` frames, each costing one credit. The receiver puts
  the batch in the consuming segments' inboxes and sends one ``credit`` back when all
  of them have processed it, so each edge holds at most ``credits`` batches in
  flight and the receiver's memory is bounded whatever the input rate. Watermarks
  follow the data of their edge in order (``wm`` frames, no credit).
* **Back-pressure.** A segment waiting for credit stops draining its inbox; the
  senders feeding it run out of credit; a local source waiting on a full inbox or an
  edge falls behind its schedule: its connector counts the records as delayed, or sheds
  them under the ``shed`` overload policy. Nothing grows without bound.
* **Traces.** Sources mark ~5% of records with a trace (id, source wall-clock ms).
  Traces travel beside the records (batch field ``t``); a trace entering a segment is
  attached to what that call emits, so it survives stateless operators and running
  aggregates; results fired by a watermark carry the watermark's own source time. A
  sink records ``now - source time`` as end-to-end latency.
* **End.** A local sink is done when every one of its inputs delivered the final
  watermark; it flushes, and the instance reports it to the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from agiledart.app.errors import ExecutionError
from agiledart.app.functions import Resolver
from agiledart.app.local import Emission, Executor
from agiledart.dataplane import Batch, Trace
from agiledart.operators import BoundedOutOfOrderness
from agiledart.operators.base import FINAL_WATERMARK, MIN_WATERMARK, Record
from agiledart.runtime.checkpoints import CheckpointError, Holder, Uplink, fit_code, load, save
from agiledart.runtime.code import code_ids_in
from agiledart.runtime.confine import DataPolicy
from agiledart.runtime.connectors import SourceConnector, open_source
from agiledart.runtime.deployment import Deployment, InstanceOptions
from agiledart.runtime.edges import OutEdge, ReplyChannel
from agiledart.runtime.elastic import ElasticDriver
from agiledart.runtime.epochs import Alignment
from agiledart.runtime.errors import PeerLost
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import Engine, InlineEngine, Unit
from agiledart.runtime.links import Links
from agiledart.runtime.mqtt import BrokerPool
from agiledart.runtime.replicas import (
    combine,
    merge_snapshots,
    split_records,
    split_snapshot,
)
from agiledart.runtime.routing import Router
from agiledart.runtime.segments import (
    Item,
    Segment,
    fail_on_error,
    op_stats,
    post_dead_letters,
    seg_op_stats,
)
from agiledart.runtime.sinks import LocalSinks, SinkState, Tracer
from agiledart.runtime.topology import LocalTopology, merged_watermark, replicable

if TYPE_CHECKING:
    from agiledart.runtime.relay import Relay

log = logging.getLogger(__name__)

__all__ = [
    "AppInstance",
    "Deployment",
    "InstanceOptions",
    "OutEdge",
    "ReplyChannel",
    "Segment",
    "SinkState",
]


def now_ms() -> float:
    return time.time() * 1000.0


class AppInstance:
    def __init__(
        self,
        deployment: Deployment,
        *,
        me: str,
        links: Links,
        resolve: Resolver,
        state_dir: Path,
        options: InstanceOptions | None = None,
        on_sink_done: Callable[[str, dict[str, Any]], Awaitable[None]],
        on_failed: Callable[[str, str | None], Awaitable[None]],
        brokers: BrokerPool | None = None,
        engine: Engine | None = None,
        relay: Relay | None = None,
        trace: Tracer | None = None,
        on_checkpoint: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
        holders: Callable[[int], list[Holder]] | None = None,
        uplink: Uplink | None = None,
        on_scaling: Callable[[dict[str, Any]], Awaitable[Any]] | None = None,
        data: DataPolicy | None = None,
    ) -> None:
        self.deployment = d = deployment
        #: what the spec's connectors may reach here (files, environment variables)
        data = data or DataPolicy.of(state_dir)
        self.restore = d.restore or {}
        self.on_checkpoint = on_checkpoint
        self.holders = holders
        self.uplink = uplink
        self.generation = d.generation
        self.relay = relay
        self.trace = trace
        self.app_id = d.app_id
        self.spec = spec = d.spec
        self.me = me
        self.links = links
        self.options = options or InstanceOptions()
        self.on_sink_done = on_sink_done
        self.on_failed = on_failed
        self.started_at = time.monotonic()
        self.rng = random.Random()
        self._group: asyncio.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self._ready = asyncio.Event()  #: the engine holds the app: sources may start
        self.started_at_wall: float | None = None
        self._failed = asyncio.Event()
        self.failure: str | None = None
        self.lost_peer: str | None = None  #: the peer whose loss failed this instance

        self.engine = engine or InlineEngine(EngineConfig(workers=0), state_dir / "code")
        self.topology = topo = LocalTopology.of(spec, d.hosts, me, chains=self.engine.chains)
        self.local_ops = topo.local_ops
        #: operators with several instances: keyed ones get records by key
        self.parallel = topo.parallel
        self.partition_key = topo.partition_key
        self.resolve = resolve
        self.segments: list[Segment] = []
        self.segment_of: dict[str, Segment] = {}
        for uid, ops in enumerate(topo.segments):
            seg = Segment(ops, Executor(spec, resolve, operators=ops))
            seg.align = Alignment(topo.channels(ops))
            seg.unit = self.engine.unit(
                app_id=self.app_id, uid=uid, executor=seg.executor, queue=seg
            )
            seg.units = [seg.unit]
            seg.scalable, seg.split_field = replicable(spec, ops, chained=self.engine.chains)
            self.segments.append(seg)
            for op in ops:
                self.segment_of[op] = seg
        self.sources = {
            s.id: open_source(
                s,
                base_dir=data.root,
                overload=s.params.get("overload", self.options.overload),
                brokers=brokers,
                skip=int(self.restore.get("sources", {}).get(s.id, 0)),
                policy=data,
            )
            for s in spec.sources
            if s.id in topo.sources
        }
        self._source_locks = {sid: asyncio.Lock() for sid in self.sources}
        self._lowered: set[str] = set()  #: instances told to checkpoint with a lower m, k
        self._next_uid = len(self.segments)  #: the next replica's unit id
        self.local_sinks = LocalSinks(
            app_id=self.app_id,
            topology=topo,
            fail=self.fail,
            report=self._report,
            on_sink_done=on_sink_done,
            spawn=self._spawn,
            trace=trace,
        )
        self.router = Router(
            app_id=self.app_id,
            me=me,
            generation=self.generation,
            topology=topo,
            segments=self.segments,
            segment_of=self.segment_of,
            sinks=self.local_sinks,
            options=self.options,
            addresses=d.addresses,
            links=links,
            spawn=self._spawn,
            relay=relay,
            uplink=uplink,
        )
        self.edges = self.router.edges  #: local producer -> its edges to other peers
        #: the scaling controllers of the operators here (agiledart.runtime.elastic)
        self.elastic = ElasticDriver(self, spec.scaling, trace=trace, request=on_scaling)
        #: opened last: nothing above may leak them
        self.local_sinks.open(
            out_dir=data.sink_dir(self.app_id),
            brokers=brokers,
            restore=self.restore,
            policy=data,
            checkpointed=spec.checkpointed,
        )
        self.sinks = self.local_sinks.states
        self.dead_letters = self.local_sinks.dead_letters

    # -- input from other peers (agiledart.runtime.routing) ----------------------------

    def accept_data(self, producer: str, batch: Batch, conn: ReplyChannel) -> None:
        self.router.accept_data(producer, batch, conn)

    async def accept_wm(self, producer: str, wm: int, wall: float, sender: str) -> None:
        await self.router.accept_wm(producer, wm, wall, sender)

    async def accept_barrier(self, producer: str, epoch: int, sender: str) -> None:
        await self.router.accept_barrier(producer, epoch, sender)

    def grant(self, edge_key: str, n: int, *, gone: bool = False) -> bool:
        """Credit for an edge; ``gone``: its destination no longer runs the app."""
        return self.router.grant(edge_key, n, gone=gone)

    # -- lifecycle --------------------------------------------------------------------

    def launch(self, group: asyncio.TaskGroup) -> None:
        """Start the segments (they wait for input); sources wait for :meth:`start`."""
        self._runner = group.create_task(self._run(), name=f"app {self.app_id}")

    async def wait_ready(self) -> None:
        """Until the engine holds the app (workers started, user code loaded in them);
        raises ExecutionError if the instance failed first."""
        ready = asyncio.ensure_future(self._ready.wait())
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait([ready, failed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            failed.cancel()
        if not self._ready.is_set():
            raise ExecutionError(self.failure or "the app instance stopped")

    def start_sources(self) -> None:
        if not self._started.is_set():
            self.started_at_wall = time.time()
        self._started.set()

    async def stop(self) -> None:
        if self._group is not None:  # mqtt dead letters still queued: a moment to go out
            await self.local_sinks.drain_dead_letters()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self.local_sinks.close()

    def spawn(self, coro: Awaitable[None]) -> Any:
        """Run ``coro`` as a child of the instance (cancelled with it)."""
        return self._spawn(coro)

    def _spawn(self, coro: Awaitable[None]) -> Any:
        if self._group is None:
            close = getattr(coro, "close", None)
            if close is not None:
                close()
            return None
        return self._group.create_task(coro)  # type: ignore[arg-type]

    async def _run(self) -> None:
        try:
            code = code_ids_in(o.fn for o in self.spec.operators if o.id in self.segment_of)
            units = [seg.unit for seg in self.segments if seg.unit is not None]
            if self.restore:
                await self._restore_states()
            await self.engine.open_app(self.app_id, self.spec, units, code)
            self._ready.set()
            async with asyncio.TaskGroup() as group:
                self._group = group
                for seg in self.segments:
                    group.create_task(self._segment_loop(seg))
                for sid, source in self.sources.items():
                    group.create_task(self._source_loop(sid, source))
                for publisher in self.local_sinks.publishers():
                    group.create_task(publisher)
                group.create_task(self._until_failed())  # sinks stay open until stopped
                group.create_task(self.elastic.run())
        except* Exception as eg:
            leaves = _leaves(eg)
            exc = next((e for e in leaves if isinstance(e, PeerLost)), leaves[0])
            if self.failure is None:
                self.failure = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, PeerLost):
                    self.lost_peer = exc.peer
            log.error("app %s failed on %s: %s", self.app_id, self.me, self.failure)
        finally:
            self._group = None
            if not self._ready.is_set():  # wait_ready must not wait for ever
                self._failed.set()
            self.local_sinks.close()
            try:
                await asyncio.shield(self.engine.close_app(self.app_id))
            except Exception:  # the app is over either way; the peer must live on
                log.exception("app %s: releasing its workers failed", self.app_id)
        if self.failure is not None:
            await self.on_failed(self.failure, self.lost_peer)

    async def _until_failed(self) -> None:
        await self._failed.wait()
        raise ExecutionError(self.failure or "failed")

    def fail(self, reason: str) -> None:
        """End this instance (its group raises), e.g. a sink that cannot write."""
        if self.failure is None:
            self.failure = reason
        self._failed.set()

    # -- sources ----------------------------------------------------------------------

    async def _source_loop(self, sid: str, source: SourceConnector) -> None:
        await self._started.wait()
        wmgen = BoundedOutOfOrderness(source.spec.params.get("out_of_order_ms", 0))
        interval = self.options.watermark_interval_s
        last_wm = [0.0]  # monotonic time of the last watermark sent
        sent_wm = [MIN_WATERMARK]
        loop = asyncio.get_running_loop()

        lock = self._source_locks[sid]

        async def emit(records: list[Record]) -> None:
            async with lock:  # a barrier goes between two batches, never inside one
                await emit_now(records)

        async def emit_now(records: list[Record]) -> None:
            traces = self.router.sample(len(records))
            await self.router.deliver(sid, records, traces)
            for edge in self.edges.get(sid, ()):  # a source's batch leaves whole
                await edge.flush_idle()
            if loop.time() - last_wm[0] < interval:
                # between watermarks only the last record's ts counts: the watermark can
                # only come out lower (later), which never makes a record late
                ts = records[-1].get("ts") if records else None
                if type(ts) is int:
                    wmgen.observe_ts(ts)
                return
            last_wm[0] = loop.time()
            wmgen.observe(records)
            if wmgen.watermark > sent_wm[0]:
                sent_wm[0] = wmgen.watermark
                await self.router.deliver_wm(sid, wmgen.watermark, now_ms())

        await source.run(emit)
        async with lock:
            await self.router.deliver_wm(sid, wmgen.finish(), now_ms())
            for edge in self.edges.get(sid, ()):
                await edge.flush()

    # -- checkpoints (agiledart.runtime.epochs) ---------------------------------------

    async def inject_barrier(self, epoch: int) -> None:
        """Barrier ``epoch`` into every local source's output, between two batches, and
        each source's offset to the scheduler (or that it has finished)."""
        for sid, source in self.sources.items():
            async with self._source_locks[sid]:
                finished = source.stats.finished
                if not finished:
                    await self.router.deliver_barrier(sid, epoch)
                offset = source.stats.emitted
            report = {"kind": "source", "id": sid, "offset": offset, "finished": finished}
            await self._report(epoch, report)

    async def _report(self, epoch: int, report: dict[str, Any]) -> None:
        if self.on_checkpoint is not None:
            await self.on_checkpoint({**report, "epoch": epoch, "peer": self.me})

    async def _aligned(self, seg: Segment, epoch: int) -> None:
        """Every open input of ``seg`` passed barrier ``epoch``: snapshot, forward the
        barrier, store the snapshot in the background, let the held input in."""
        assert seg.unit is not None
        if seg.unit.stateful and self.on_checkpoint is not None:
            states = await self._snapshot(seg)
            stateful = sorted(o for o in seg.ops if self.spec.operator(o).stateful)
            blob = msgpack.packb({o: states[o] for o in stateful})
            self._spawn(self._save(seg, stateful, epoch, blob))
        for op in seg.ops:
            if self._leaves_segment(op, seg):
                await self.router.deliver_barrier(op, epoch)
        if seg.held:
            seg.inbox.extendleft(reversed(seg.held))
            seg.held.clear()
            seg.wake.set()

    def _leaves_segment(self, op: str, seg: Segment) -> bool:
        return self.topology.leaves(op, seg.ops)

    async def _save(self, seg: Segment, ops: list[str], epoch: int, blob: bytes) -> None:
        cp = self.spec.checkpoint
        m, k = (1, cp.k) if cp.mode == "replication" else (cp.m, cp.k)
        instance = f"{'+'.join(seg.ops)}@{self.me}"
        holders = self.holders(m + k) if self.holders is not None else []
        fitted = fit_code(m, k, len(holders))
        if fitted is None:
            error = "no leaf-set peer can hold its fragments"
            report = {"kind": "state_failed", "instance": instance, "error": error}
            await self._report(epoch, report)
            return
        if fitted != (m, k):
            if instance not in self._lowered:
                self._lowered.add(instance)
                log.warning(
                    "app %s: checkpoints of %s use m=%d, k=%d: %d leaf-set peers hold "
                    "fragments, m=%d, k=%d needs %d",
                    self.app_id, instance, *fitted, len(holders), m, k, m + k,
                )  # fmt: skip
            m, k = fitted
        try:
            receipt = await save(
                self.links,
                holders,
                blob,
                app=self.app_id,
                instance=instance,
                epoch=epoch,
                m=m,
                k=k,
                uplink=self.uplink,
            )
        except CheckpointError as exc:
            log.warning(
                "app %s: checkpoint %d of %s not stored: %s", self.app_id, epoch, instance, exc
            )
            failed = {"kind": "state_failed", "instance": instance, "error": str(exc)}
            await self._report(epoch, failed)
            return
        await self._report(
            epoch,
            {
                "kind": "state",
                "ops": ops,
                "instance": instance,
                "holders": [[h.name, list(h.address)] for h in holders],
                "m": m,
                "k": k,
                "bytes": receipt.bytes,
                "seconds": round(receipt.seconds, 4),
            },
        )

    async def _restore_states(self) -> None:
        """Before anything runs: every stateful operator here gets its state of the
        committed epoch, fetched from m holders in parallel and decoded."""
        plan = self.restore
        wanted = [
            entry
            for entry in plan.get("states", ())
            if entry["peer"] == self.me and any(o in self.segment_of for o in entry["ops"])
        ]

        async def fetch(entry: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
            holders = [Holder(str(n), (str(a[0]), int(a[1]))) for n, a in entry["holders"]]
            blob = await load(
                self.links,
                holders,
                app=self.app_id,
                instance=entry["instance"],
                epoch=int(plan["epoch"]),
                m=int(entry["m"]),
            )
            return entry, blob

        try:
            got = await asyncio.gather(*(fetch(e) for e in wanted))
        except CheckpointError as exc:
            raise ExecutionError(str(exc)) from None
        for _, blob in got:
            states = msgpack.unpackb(blob)
            for op, data in states.items():
                seg = self.segment_of.get(op)
                if seg is not None:
                    seg.executor.operators[op].restore(data)

    # -- segments ---------------------------------------------------------------------

    async def _segment_loop(self, seg: Segment) -> None:
        strict = [o for o in seg.ops if self.spec.operator(o).on_error == "fail"]
        dead = [o for o in seg.ops if o in self.dead_letters]
        while True:
            while not seg.inbox and seg.resize_to is None:
                seg.wake.clear()
                await seg.wake.wait()
            if seg.resize_to is not None:  # between two items: the replicas are idle
                await self._resize(seg)
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
                    await self._aligned(seg, epoch)
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

    # -- elastic scaling (agiledart.runtime.elastic, agiledart.runtime.replicas) ------

    def resize(self, seg: Segment, replicas: int) -> asyncio.Event:
        """Ask ``seg`` for ``replicas`` replicas; done between two of its items (the
        event returned is set then)."""
        if not seg.scalable:
            msg = f"operator {'+'.join(seg.ops)} cannot run as several instances here"
            raise ExecutionError(msg)
        seg.resized.clear()
        seg.resize_to = max(1, replicas)
        seg.wake.set()
        return seg.resized

    async def _resize(self, seg: Segment) -> None:
        target, seg.resize_to = seg.resize_to, None
        try:
            if target is not None and target != seg.replicas:
                await self._set_replicas(seg, target)
        finally:
            seg.resized.set()

    async def _set_replicas(self, seg: Segment, n: int) -> None:
        """New replicas for ``seg``'s operator, its state re-split by key among them (a
        stateless one's watermarks copied to each). The old replicas are dropped only
        once the new ones are built: a factory that fails leaves the operator as it was."""
        (op,) = seg.ops
        old = list(seg.units)
        primary = old[0]
        if primary.stateful:
            snaps = [await self.engine.snapshot(u) for u in old]
            parts: list[bytes] = split_snapshot(merge_snapshots([s[op] for s in snaps]), n)
        else:  # no state but its input watermarks, which the peer keeps
            parts = [primary.executor.snapshot()[op]] * n
        try:
            executors = [
                Executor(self.spec, self.resolve, operators=[op], states={op: part})
                for part in parts
            ]
        except Exception as exc:  # user code (a factory): keep the replicas there are
            log.warning("app %s: %s stays at %d instance(s): %s", self.app_id, op, len(old), exc)
            return
        for u in old:
            for name, operator in u.executor.operators.items():
                kept = seg.retired.setdefault(name, {})
                for k, v in op_stats(operator).items():
                    kept[k] = kept.get(k, 0) + v
            await self.engine.drop_unit(u)
        units: list[Unit] = []
        for ex, part in zip(executors, parts, strict=True):
            unit = self.engine.unit(app_id=self.app_id, uid=self._next_uid, executor=ex, queue=seg)
            self._next_uid += 1
            unit.follow(primary, {op: part})
            await self.engine.add_unit(unit)
            units.append(unit)
        seg.units, seg.unit, seg.executor = units, units[0], units[0].executor
        log.info("app %s: %s now runs as %d instance(s) on %s", self.app_id, op, n, self.me)

    async def _snapshot(self, seg: Segment) -> dict[str, bytes]:
        """The states of ``seg``'s operators (its replicas' merged) for a checkpoint."""
        assert seg.unit is not None
        if seg.replicas == 1:
            return await self.engine.snapshot(seg.unit)
        snaps = [await self.engine.snapshot(u) for u in seg.units]
        return {op: merge_snapshots([s[op] for s in snaps]) for op in snaps[0]}

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
                await self._aligned(seg, epoch)

    # -- sinks ------------------------------------------------------------------------

    def checkpoint_committed(self, epoch: int) -> None:
        """The scheduler committed ``epoch``: sinks holding its output may send it."""
        self.local_sinks.checkpoint_committed(epoch)

    def sink_info(self, sink_id: str) -> dict[str, Any]:
        return self.local_sinks.info(sink_id)

    # -- statistics -------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        ops: dict[str, Any] = {}
        now = time.monotonic()
        for seg in self.segments:
            load = seg.meter.reading(now).as_dict()  # shared by the group's operators
            last = self.elastic.last.get("+".join(seg.ops))
            for name in seg.executor.operators:
                counters = seg_op_stats(seg, name)
                for error in counters.get("recent_errors", ()):
                    error["peer"] = self.me
                if name in self.dead_letters:
                    letters = self.dead_letters[name]
                    counters["dead_letters"] = letters.written
                    counters["dead_letter_sink"] = letters.info()
                ops[name] = {
                    **counters,
                    "instances": seg.replicas,
                    "health": None if last is None else last["health"],
                    "queued": seg.pending,
                    "queued_batches": len(seg.inbox),
                    **load,
                }
        return {
            "peer": self.me,
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "started_at": self.started_at_wall,
            "failure": self.failure,
            "generation": self.generation,
            "sources": {sid: dataclasses.asdict(src.stats) for sid, src in self.sources.items()},
            "operators": ops,
            "sinks": {k: self.local_sinks.info(k) for k in self.sinks},
            "edges": {
                f"{e.producer}>{e.dest}": {
                    **dataclasses.asdict(e.stats),
                    "credit": e.window.available,
                }
                for es in self.edges.values()
                for e in es
            },
            "received": dict(self.router.received),
            "scaling": self.elastic.view(),
        }


def _leaves(eg: BaseExceptionGroup[Exception]) -> list[Exception]:
    out: list[Exception] = []
    for e in eg.exceptions:
        out += _leaves(e) if isinstance(e, BaseExceptionGroup) else [e]
    return out
