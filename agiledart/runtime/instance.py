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
import collections
import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from agiledart.app.errors import ExecutionError
from agiledart.app.functions import Resolver
from agiledart.app.local import Emission, Executor
from agiledart.dataplane import Batch, KeyPartitioner, Trace, TraceSampler
from agiledart.dataplane.frames import check_records
from agiledart.operators import BoundedOutOfOrderness
from agiledart.operators.base import FINAL_WATERMARK, MIN_WATERMARK, OperatorStats, Record
from agiledart.runtime.checkpoints import CheckpointError, Holder, Uplink, fit_code, load, save
from agiledart.runtime.code import code_ids_in
from agiledart.runtime.confine import DataPolicy
from agiledart.runtime.connectors import Sink, SourceConnector, open_sink, open_source
from agiledart.runtime.deadletters import DeadLetters
from agiledart.runtime.deployment import Deployment, InstanceOptions
from agiledart.runtime.edges import BatchAck, InEdge, OutEdge, ReplyChannel
from agiledart.runtime.elastic import ElasticDriver
from agiledart.runtime.epochs import Alignment, Channel
from agiledart.runtime.errors import PeerLost
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import Engine, InlineEngine, Unit
from agiledart.runtime.links import Links
from agiledart.runtime.metrics import InstanceMeter, LatencyHistogram, quantile
from agiledart.runtime.mqtt import BrokerPool, MqttSink
from agiledart.runtime.replicas import (
    combine,
    merge_snapshots,
    split_records,
    split_snapshot,
)
from agiledart.runtime.topology import LocalTopology, replicable
from agiledart.runtime.twophase import SpooledSink

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


@dataclass
class _Item:
    """An inbox entry: a batch or a watermark from ``producer``."""

    producer: str
    records: list[Record] | None
    traces: list[Trace]
    wm: int = 0
    wall: float = 0.0
    ack: BatchAck | None = None
    local: bool = False
    sender: str = ""
    #: a watermark of the same producer and sender that came after this batch while it
    #: waited (watermarks are merged into queued items, so they cannot pile up)
    wm_after: int | None = None
    wall_after: float = 0.0
    popped: bool = False
    queued_at: float = 0.0  #: time.monotonic() when it entered the inbox
    offset: int = 0  #: records already run (a turn takes at most ``turn`` of them)
    barrier: int | None = None  #: a checkpoint barrier (records None, no watermark)


class Tracer(Protocol):
    def emit(self, type: str, **fields: Any) -> None: ...


@dataclass
class SinkState:
    sink: Sink
    inputs: dict[str, int]  #: input id -> watermark
    done: bool = False
    senders: dict[str, dict[str, int]] = field(default_factory=dict)
    first_at: float | None = None  #: wall-clock s of the first and last write
    last_at: float | None = None
    latencies: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=4096)
    )
    histogram: LatencyHistogram = field(default_factory=LatencyHistogram)  #: every sample
    align: Alignment = field(default_factory=lambda: Alignment(()))
    #: what came on channels waiting for the others' barrier: ("d", channel, records,
    #: traces) or ("w", channel, producer, watermark)
    held: list[tuple[Any, ...]] = field(default_factory=list)


class Segment:
    """Local operators (one, or a chained group inline), one task, one inbox, run as
    one :class:`~agiledart.runtime.execution.Unit` of the peer's engine."""

    def __init__(self, ops: list[str], executor: Executor) -> None:
        self.ops = ops
        self.executor = executor
        self.unit: Unit | None = None
        self.inbox: collections.deque[_Item] = collections.deque()
        self.pending = 0  #: records and watermarks waiting (the EdgeWise queue length)
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.local_items = 0
        self.processed = 0
        #: producer -> sender peer -> watermark, for producers with several instances
        self.watermarks: dict[str, dict[str, int]] = {}
        #: (producer, sender) -> its latest inbox item
        self.last: dict[tuple[str, str], _Item] = {}
        self.meter = InstanceMeter(time.monotonic())
        self.align = Alignment(())  #: checkpoint barriers of its input channels
        self.held: list[_Item] = []  #: items of channels waiting for the others' barrier
        #: the replicas of a scaled-up operator (agiledart.runtime.replicas); [unit]
        self.units: list[Unit] = []
        self.scalable = False  #: whether the operator may run as several replicas here
        self.split_field: str | None = None  #: what splits a batch over the replicas
        self.resize_to: int | None = None  #: a change of the replica count, asked for
        self.resized = asyncio.Event()  #: set when a resize asked for is done
        #: counters for the scaling controller (agiledart.runtime.elastic), cumulative
        self.arrived = 0  #: records put in the inbox
        self.executed = 0  #: records executed
        self.service_s = 0.0  #: execution time, summed over the replicas
        self.retired: dict[str, dict[str, int]] = {}  #: counters of replicas gone

    @property
    def replicas(self) -> int:
        return max(1, len(self.units))

    def oldest_s(self, now: float) -> float | None:
        return now - self.inbox[0].queued_at if self.inbox else None

    def rate(self, now: float) -> float:
        return self.meter.reading(now).rate


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
        out_dir = data.sink_dir(self.app_id)
        local_sinks = [k for k in spec.sinks if k.id in topo.sinks]
        self.sinks: dict[str, SinkState] = {}  # opened last: nothing below may leak them
        #: operator -> its dead-letter sink here (``on_error: dead_letter``), opened last too
        self.dead_letters: dict[str, DeadLetters] = {}
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
        segs = self.segments
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
        self._next_uid = len(self.segments)  #: the next replica's unit id
        #: the scaling controllers of the operators here (agiledart.runtime.elastic)
        self.elastic = ElasticDriver(self, spec.scaling, trace=trace, request=on_scaling)
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
        try:
            for k in local_sinks:
                resume = self.restore.get("sinks", {}).get(k.id) if self.restore else None
                sink = open_sink(
                    k,
                    out_dir=out_dir,
                    brokers=brokers,
                    resume=resume,
                    policy=data,
                    app=(self.app_id, self.me, spec.checkpointed),
                )
                self.sinks[k.id] = SinkState(sink, dict.fromkeys(k.inputs, MIN_WATERMARK))
                self.sinks[k.id].align = Alignment(topo.sink_channels(k.id))
            for op in self.local_ops:
                letters = spec.operator(op).dead_letter
                if letters is not None:
                    self.dead_letters[op] = DeadLetters(
                        letters, app=self.app_id, op=op, peer=me, out_dir=out_dir,
                        brokers=brokers, policy=data,
                    )  # fmt: skip
        except BaseException:
            self._close_sinks()
            raise

    def _edge(self, producer: str, peer: str) -> OutEdge:
        edge = OutEdge(
            app_id=self.app_id,
            producer=producer,
            sender=self.me,
            dest=peer,
            address=self.deployment.addresses[peer],
            links=self.links,
            options=self.options,
            spawn=self._spawn,
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
            for letters in self.dead_letters.values():
                await letters.drain()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self._close_sinks()

    def _close_sinks(self) -> None:
        for state in self.sinks.values():
            with contextlib.suppress(OSError):
                state.sink.close()
        for letters in self.dead_letters.values():
            letters.close()

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
                for state in self.sinks.values():
                    if isinstance(state.sink, MqttSink | SpooledSink):  # its publisher
                        group.create_task(state.sink.run())
                for letters in self.dead_letters.values():
                    publisher = letters.publisher()
                    if publisher is not None:
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
            self._close_sinks()
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
            traces = self._sample(len(records))
            await self._deliver(sid, records, traces)
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
                await self._deliver_wm(sid, wmgen.watermark, now_ms())

        await source.run(emit)
        async with lock:
            await self._deliver_wm(sid, wmgen.finish(), now_ms())
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
                    await self._deliver_barrier(sid, epoch)
                offset = source.stats.emitted
            report = {"kind": "source", "id": sid, "offset": offset, "finished": finished}
            await self._report(epoch, report)

    async def _report(self, epoch: int, report: dict[str, Any]) -> None:
        if self.on_checkpoint is not None:
            await self.on_checkpoint({**report, "epoch": epoch, "peer": self.me})

    async def _deliver_barrier(self, producer: str, epoch: int) -> None:
        segs, sinks = self.consumers.get(producer, ((), ()))
        for sink in sinks:
            await self._sink_barrier(sink, (producer, self.me), epoch)
        for seg in segs:
            await self._put_local(seg, _Item(producer, None, [], barrier=epoch))
        for edge in self.edges.get(producer, ()):
            await edge.barrier(epoch)
        for _, targets in self.groups.get(producer, ()):
            for target in targets:
                if isinstance(target, Segment):
                    await self._put_local(target, _Item(producer, None, [], barrier=epoch))

    async def accept_barrier(self, producer: str, epoch: int, sender: str) -> None:
        segs, sinks = self._inputs_of(producer)
        for sink in sinks:
            await self._sink_barrier(sink, (producer, sender), epoch)
        for seg in segs:
            _append(seg, _Item(producer, None, [], barrier=epoch, sender=sender))

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
                await self._deliver_barrier(op, epoch)
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

    def _sample(self, n: int) -> list[Trace]:
        return [t for _, t in self._sampler.sample_batch(n, now_ms())]

    async def _deliver(self, producer: str, records: list[Record], traces: list[Trace]) -> None:
        """A local node's output: to local sinks, consuming segments, remote peers."""
        segs, sinks = self.consumers.get(producer, ((), ()))
        for sink in sinks:
            self._write_sink(sink, records, traces, (producer, self.me))
        for seg in segs:
            await self._put_local(seg, _Item(producer, records, traces))
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
                    await self._put_local(target, _Item(producer, part, tags))

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

    async def _deliver_wm(self, producer: str, wm: int, wall: float) -> None:
        segs, sinks = self.consumers.get(producer, ((), ()))
        for sink in sinks:
            await self._sink_wm(sink, producer, wm, self.me)
        for seg in segs:
            item = _Item(producer, None, [], wm=wm, wall=wall)
            await self._put_local(seg, item)
        for edge in self.edges.get(producer, ()):
            await edge.watermark(wm, wall)
        for _, targets in self.groups.get(producer, ()):
            for target in targets:
                if isinstance(target, Segment):
                    item = _Item(producer, None, [], wm=wm, wall=wall)
                    await self._put_local(target, item)

    async def _put_local(self, seg: Segment, item: _Item) -> None:
        """A batch or watermark of a node of this peer; waits while the segment holds
        ``source_queue`` such items."""
        item.local, item.sender = True, self.me
        if item.records is None and item.barrier is None and _merge_wm(seg, item):
            return
        if item.records is not None and self._merge_batch(seg, item):
            return
        while seg.local_items >= self.options.source_queue:
            seg.room.clear()
            await seg.room.wait()
        seg.local_items += 1
        _append(seg, item)

    def _merge_batch(self, seg: Segment, item: _Item) -> bool:
        """Append ``item``'s records to the queued batch of the same producer when that
        batch has not started and stays within ``batch_records``: small outputs (a
        worker's turn) then cost the queue one entry, not one each."""
        last = _mergeable(seg, item, self.options.batch_records)
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
        segs, sinks = self._inputs_of(producer)
        if segs or sinks:
            self.received[producer] += len(records)
        for sink in sinks:
            self._write_sink(sink, records, traces, (producer, conn.peer_name))
        if not segs:
            self._spawn(BatchAck(edge, conn, 1).done())
            return
        ack = BatchAck(edge, conn, len(segs))
        for seg in segs:
            _append(seg, _Item(producer, records, traces, ack=ack, sender=conn.peer_name))

    async def accept_wm(self, producer: str, wm: int, wall: float, sender: str) -> None:
        segs, sinks = self._inputs_of(producer)
        for sink in sinks:
            await self._sink_wm(sink, producer, wm, sender)
        for seg in segs:
            item = _Item(producer, None, [], wm=wm, wall=wall, sender=sender)
            if not _merge_wm(seg, item):
                _append(seg, item)

    def _inputs_of(self, producer: str) -> tuple[list[Segment], list[str]]:
        """Local consumers of what ``producer`` sends from other peers."""
        return self._remote_inputs.get(producer, ([], []))

    def _merged_wm(self, tracker: dict[str, int], producer: str, sender: str, wm: int) -> int:
        """The watermark of ``producer`` over all its instances (their minimum)."""
        if producer not in self.parallel:
            return wm
        tracker[sender] = max(wm, tracker.get(sender, MIN_WATERMARK))
        hosts = self.deployment.hosts[producer]
        return min(tracker.get(h, MIN_WATERMARK) for h in hosts)

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
                        _fail_on_error(seg, strict)
                    if dead:
                        _post_dead_letters(seg, dead, self.dead_letters)
                    await self._forward(emitted, item.traces if first == 0 else [])
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
                for k, v in _op_stats(operator).items():
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

    async def _watermark(self, seg: Segment, item: _Item, wm: int, wall: float) -> None:
        assert seg.unit is not None
        tracker = seg.watermarks.setdefault(item.producer, {})
        merged = self._merged_wm(tracker, item.producer, item.sender, wm)
        if seg.replicas == 1:
            emitted = await seg.unit.watermark(item.producer, merged)
        else:
            outs = await asyncio.gather(*(u.watermark(item.producer, merged) for u in seg.units))
            emitted = combine(outs)
        await self._forward(emitted, [Trace(0, wall)], wall=wall)
        if wm >= FINAL_WATERMARK:  # the channel ended: alignment stops waiting for it
            epoch = seg.align.finish((item.producer, item.sender))
            if epoch is not None:
                await self._aligned(seg, epoch)

    async def _forward(
        self, emitted: list[Emission], traces: list[Trace], *, wall: float | None = None
    ) -> None:
        for node, what in emitted:
            if isinstance(what, list):
                await self._deliver(node, what, traces)
            else:
                await self._deliver_wm(node, what, now_ms() if wall is None else wall)

    # -- sinks ------------------------------------------------------------------------

    def _write_sink(
        self, sink_id: str, records: list[Record], traces: list[Trace], channel: Channel
    ) -> None:
        state = self.sinks[sink_id]
        if state.align.blocked(channel):  # after its barrier: waits for the others'
            state.held.append(("d", channel, records, traces))
            return
        try:
            state.sink.write(records)
        except ExecutionError as exc:
            self.fail(str(exc))
            return
        state.last_at = time.time()
        if state.first_at is None:
            state.first_at = state.last_at
        if traces:
            now = now_ms()
            fresh = [now - ts for _, ts in traces]
            state.latencies.extend(fresh)
            state.histogram.observe(fresh)
            if self.trace is not None:
                for (tid, ts), latency in zip(traces, fresh, strict=True):
                    self.trace.emit(
                        "tuple",
                        app=self.app_id,
                        sink=sink_id,
                        trace_id=tid,
                        source_ts=ts,
                        sink_ts=now,
                        latency_ms=round(latency, 3),
                    )

    async def _sink_barrier(self, sink_id: str, channel: Channel, epoch: int) -> None:
        state = self.sinks[sink_id]
        aligned = state.align.barrier(channel, epoch)
        if aligned is not None:
            await self._sink_aligned(sink_id, aligned)

    async def _sink_aligned(self, sink_id: str, epoch: int) -> None:
        """What came before barrier ``epoch`` on every channel is written: commit it."""
        state = self.sinks[sink_id]
        commit = getattr(state.sink, "commit", None)
        try:
            if isinstance(state.sink, SpooledSink):  # its rows wait for the epoch's commit
                committed: Any = await state.sink.seal(epoch)
            else:
                committed = commit() if commit is not None else None
        except ExecutionError as exc:
            self.fail(str(exc))
            return
        await self._report(epoch, {"kind": "sink", "id": sink_id, "commit": committed})
        held, state.held = state.held, []
        for entry in held:
            if entry[0] == "d":
                self._write_sink(sink_id, entry[2], entry[3], entry[1])
            else:
                await self._sink_wm(sink_id, entry[2], entry[3], entry[1][1])

    async def _sink_wm(self, sink_id: str, producer: str, wm: int, sender: str = "") -> None:
        state = self.sinks[sink_id]
        channel = (producer, sender)
        if state.align.blocked(channel):
            state.held.append(("w", channel, producer, wm))
            return
        if wm >= FINAL_WATERMARK:
            epoch = state.align.finish(channel)
            if epoch is not None:
                await self._sink_aligned(sink_id, epoch)
        wm = self._merged_wm(state.senders.setdefault(producer, {}), producer, sender, wm)
        if producer in state.inputs and wm > state.inputs[producer]:
            state.inputs[producer] = wm
        if state.done or any(w < FINAL_WATERMARK for w in state.inputs.values()):
            return
        state.done = True
        state.sink.flush()
        if isinstance(state.sink, MqttSink | SpooledSink):  # done once the broker has it all
            self._spawn(self._drained(sink_id, state.sink))
            return
        await self.on_sink_done(sink_id, self.sink_info(sink_id))

    def checkpoint_committed(self, epoch: int) -> None:
        """The scheduler committed ``epoch``: sinks holding its output may send it."""
        for state in self.sinks.values():
            if isinstance(state.sink, SpooledSink):
                state.sink.committed_epoch(epoch)

    async def _drained(self, sink_id: str, sink: MqttSink | SpooledSink) -> None:
        await sink.drain()  # what it cannot publish in time it drops, and counts
        await self.on_sink_done(sink_id, self.sink_info(sink_id))

    # -- statistics -------------------------------------------------------------------

    def sink_info(self, sink_id: str) -> dict[str, Any]:
        state = self.sinks[sink_id]
        lat = sorted(state.latencies)
        path = state.sink.path
        return {
            "records": state.sink.stats.records,
            "dropped": state.sink.stats.dropped,
            "errors": state.sink.stats.errors,
            "done": state.done,
            "path": None if path is None else os.path.abspath(path),
            **_connection_of(state.sink),
            "latency_p50_ms": quantile(lat, 0.5),
            "latency_p99_ms": quantile(lat, 0.99),
            "latency_samples": len(lat),
            "latency_recent_ms": [round(x, 2) for x in list(state.latencies)[-256:]],
            "first_at": state.first_at,
            "last_at": state.last_at,
        }

    def statistics(self) -> dict[str, Any]:
        ops: dict[str, Any] = {}
        now = time.monotonic()
        for seg in self.segments:
            load = seg.meter.reading(now).as_dict()  # shared by the group's operators
            last = self.elastic.last.get("+".join(seg.ops))
            for name in seg.executor.operators:
                counters = _seg_op_stats(seg, name)
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
            "sinks": {k: self.sink_info(k) for k in self.sinks},
            "edges": {
                f"{e.producer}>{e.dest}": {
                    **dataclasses.asdict(e.stats),
                    "credit": e.window.available,
                }
                for es in self.edges.values()
                for e in es
            },
            "received": dict(self.received),
            "scaling": self.elastic.view(),
        }


def _leaves(eg: BaseExceptionGroup[Exception]) -> list[Exception]:
    out: list[Exception] = []
    for e in eg.exceptions:
        out += _leaves(e) if isinstance(e, BaseExceptionGroup) else [e]
    return out


def _connection_of(sink: Any) -> dict[str, Any]:
    """An mqtt, sql or http sink's connection, as its statistics show it (others:
    none), and what an sql or http sink holds for its destination."""
    if not isinstance(sink, MqttSink | SpooledSink):
        return {}
    c = sink.connection()
    return {
        "connection": c["state"],
        "retrying_since": c["since"] if c["state"] != "connected" else None,
        "last_error": c["last_error"],
        **(sink.buffered() if isinstance(sink, SpooledSink) else {}),
    }


def _fail_on_error(seg: Segment, ops: list[str]) -> None:
    """ExecutionError, naming the error and its record, if one of ``ops`` (whose
    ``on_error`` is ``fail``) dropped a record."""
    for name in ops:
        for unit in seg.units:
            st = unit.executor.operators[name].stats
            if st.errors:
                e = st.recent_errors[0] if st.recent_errors else {}
                record = f" on record {e['record']}" if e.get("record") else ""
                msg = (
                    f"operator {name} raised {e.get('type', 'an error')}: "
                    f"{e.get('message', st.last_error)}{record} (on_error: fail)"
                )
                raise ExecutionError(msg)


def _post_dead_letters(seg: Segment, ops: list[str], sinks: Mapping[str, DeadLetters]) -> None:
    """The records ``ops`` (whose ``on_error`` is ``dead_letter``) dropped in the turn
    just run, to their dead-letter sinks."""
    ts = int(now_ms())
    for name in ops:
        for unit in seg.units:
            st = unit.executor.operators[name].stats
            if st.failed:
                failed, st.failed = st.failed, []
                sinks[name].write(failed, ts=ts)


def _op_stats(op: Any) -> dict[str, Any]:
    return {k: v for k, v in op.stats.as_dict().items() if isinstance(v, int | float)}


def _seg_op_stats(seg: Segment, name: str) -> dict[str, Any]:
    """Counters of operator ``name`` over the segment's replicas, gone ones included,
    and its recent distinct errors."""
    total: dict[str, Any] = dict(seg.retired.get(name, {}))
    merged = OperatorStats()
    for unit in seg.units:
        op = unit.executor.operators[name]
        for k, v in _op_stats(op).items():
            total[k] = total.get(k, 0) + v
        for error in op.stats.recent_errors:
            merged.note_error(error)
    if merged.recent_errors:
        total["recent_errors"] = merged.recent_errors
    return total


def _append(seg: Segment, item: _Item) -> None:
    item.queued_at = now = time.monotonic()
    if not seg.inbox:
        seg.meter.queued(now)
    seg.inbox.append(item)
    seg.pending += 1 if item.records is None else len(item.records)
    seg.arrived += 0 if item.records is None else len(item.records)
    seg.last[(item.producer, item.sender)] = item
    seg.wake.set()


def _mergeable(seg: Segment, item: _Item, batch_records: int) -> _Item | None:
    """The queued batch that ``item``'s records may join: the same channel's latest
    item, still last in the inbox (not held back by barrier alignment, where the inbox
    may be empty), not started, without a watermark or an acknowledgement riding on it,
    and with room for ``item``'s records."""
    last = seg.last.get((item.producer, item.sender))
    if (
        last is None
        or last.popped
        or not seg.inbox
        or last is not seg.inbox[-1]
        or last.offset
        or last.records is None
        or last.wm_after is not None
        or last.ack is not None
        or item.records is None
        or len(last.records) + len(item.records) > batch_records
    ):
        return None
    return last


def _merge_wm(seg: Segment, item: _Item) -> bool:
    """Fold watermark ``item`` into the queued item of its producer and sender, if any."""
    last = seg.last.get((item.producer, item.sender))
    if last is None or last.popped or last.barrier is not None:
        return False
    if last.records is None:
        if item.wm > last.wm:
            last.wm, last.wall = item.wm, item.wall
    elif last.wm_after is None or item.wm > last.wm_after:
        last.wm_after, last.wall_after = item.wm, item.wall
    return True
