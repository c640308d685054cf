"""One peer's part of a running app: its sources, operators and sinks, and the edges
between them and the other peers' parts.

Theory of operation
-------------------
The scheduler sends every hosting peer the same :class:`Deployment` (spec, which peer
hosts each node, peer addresses). Each peer builds an :class:`AppInstance` from it:

* **Tasks.** Every local source runs in its own task (the connector paces it). The
  local operators are split into *segments* (:mod:`agiledart.runtime.topology`, pure):
  connected groups of operators joined by local edges, each driven by one
  :class:`~agiledart.local.executor.Executor` in one task that owns an inbox
  (:mod:`agiledart.runtime.segloop`). A segment through which a path leaves the peer
  and comes back is split into single operators, so no task ever waits on a peer that
  waits on it (tasks form a DAG like the app, so back-pressure cannot deadlock). The
  instance's task owns all of them; :meth:`AppInstance.aclose` ends them.
* **Edges.** Records for a node on another peer leave through an
  :class:`~agiledart.runtime.edges.OutEdge` (one per producer and destination peer,
  routed by :mod:`agiledart.runtime.routing`): batches of up to ``batch_records`` records,
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
  watermark; it flushes, and the instance reports it to the scheduler
  (:mod:`agiledart.runtime.sinks`).

Checkpoints are :mod:`agiledart.runtime.snapshots`, replicas of a scaled-up operator
:mod:`agiledart.runtime.replication`; this module is the instance's lifecycle.
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

from agiledart.app.errors import ExecutionError
from agiledart.app.functions import Resolver
from agiledart.dataplane import Batch
from agiledart.local.executor import Executor
from agiledart.operators import BoundedOutOfOrderness
from agiledart.operators.base import MIN_WATERMARK, Record
from agiledart.runtime.code import code_ids_in
from agiledart.runtime.confine import DataPolicy
from agiledart.runtime.connectors import SourceConnector, open_source
from agiledart.runtime.deployment import Deployment, InstanceOptions
from agiledart.runtime.edges import OutEdge, ReplyChannel
from agiledart.runtime.epochs import Alignment
from agiledart.runtime.errors import PeerLost
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import Engine, InlineEngine
from agiledart.runtime.http import HttpSource
from agiledart.runtime.links import Links
from agiledart.runtime.mqtt import BrokerPool, MqttSource
from agiledart.runtime.recovery import Holder, Uplink
from agiledart.runtime.replication import Replication
from agiledart.runtime.routing import Router
from agiledart.runtime.scaling import ElasticDriver
from agiledart.runtime.segloop import SegmentLoop
from agiledart.runtime.segments import (
    Segment,
    seg_op_stats,
)
from agiledart.runtime.sinks import LocalSinks, SinkState, Tracer
from agiledart.runtime.snapshots import InstanceCheckpoints
from agiledart.runtime.topology import LocalTopology, replicable

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
                replay=self.restore.get("replay", {}).get(s.id),
                policy=data,
                app_id=self.app_id,
                checkpointed=spec.checkpointed,
                state_dir=state_dir,
            )
            for s in spec.sources
            if s.id in topo.sources
        }
        self._source_locks = {sid: asyncio.Lock() for sid in self.sources}
        self.local_sinks = LocalSinks(
            app_id=self.app_id,
            topology=topo,
            fail=self.fail,
            report=self._report,
            on_sink_done=on_sink_done,
            spawn=self._spawn,
            trace=trace,
            keep=None if holders is None else lambda *a: self.checkpoints.keep(*a),
            fetch=lambda entry, epoch: self.checkpoints.fetch(entry, epoch),
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
        self.replication = Replication(
            app_id=self.app_id,
            me=me,
            spec=spec,
            resolve=resolve,
            engine=self.engine,
            next_uid=len(self.segments),
        )
        self.checkpoints = InstanceCheckpoints(
            app_id=self.app_id,
            topology=topo,
            router=self.router,
            replication=self.replication,
            sources=self.sources,
            source_locks=self._source_locks,
            segment_of=self.segment_of,
            links=links,
            report=self._report,
            spawn=self._spawn,
            on_checkpoint=on_checkpoint,
            holders=holders,
            uplink=uplink,
            restore=self.restore,
        )
        self.loop = SegmentLoop(
            topology=topo,
            router=self.router,
            replication=self.replication,
            checkpoints=self.checkpoints,
            dead_letters=self.local_sinks.dead_letters,
        )
        #: the scaling controllers of the operators here (agiledart.runtime.scaling)
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

    def start(self, group: asyncio.TaskGroup) -> None:
        """Start the instance's task in ``group``: its segments wait for input, its
        sources for :meth:`start_sources`; every other task is a child of that one."""
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

    async def aclose(self) -> None:
        """Stop every task of the instance and close its sinks."""
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
                await self.checkpoints.restore_states()
                await self.local_sinks.restore(self.restore)
            await self.engine.open_app(self.app_id, self.spec, units, code)
            self._ready.set()
            async with asyncio.TaskGroup() as group:
                self._group = group
                for seg in self.segments:
                    group.create_task(self.loop.run(seg))
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

    async def _report(self, epoch: int, report: dict[str, Any]) -> None:
        if self.on_checkpoint is not None:
            await self.on_checkpoint({**report, "epoch": epoch, "peer": self.me})

    # -- segments ---------------------------------------------------------------------

    # -- elastic scaling (agiledart.runtime.scaling, agiledart.runtime.replicas) ------

    # -- checkpoints and scaling ----------------------------------------------------------

    async def inject_barrier(self, epoch: int) -> None:
        """Barrier ``epoch`` into every local source's output (:mod:`.snapshots`)."""
        await self.checkpoints.inject_barrier(epoch)

    def resize(self, seg: Segment, replicas: int) -> asyncio.Event:
        """Ask ``seg`` for ``replicas`` replicas (:mod:`.replication`)."""
        return self.replication.resize(seg, replicas)

    # -- sinks ------------------------------------------------------------------------

    def checkpoint_committed(self, epoch: int) -> None:
        """The scheduler committed ``epoch``: sinks holding its output may send it, and
        mqtt sources' logs may let go of what it covers."""
        self.local_sinks.checkpoint_committed(epoch)
        for source in self.sources.values():
            if isinstance(source, MqttSource | HttpSource):  # its log keeps what came after
                source.committed(epoch)

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
