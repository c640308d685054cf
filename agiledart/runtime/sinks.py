"""The sinks of an app on one peer, and its dead-letter sinks.

A sink writes what its inputs deliver; with checkpoints it aligns their barriers (what
comes on a channel after its barrier waits for the others'), then commits the epoch's
output and reports the commit. It is done when every input delivered the final
watermark: flushed (an mqtt, sql or http sink once its broker or server has it all),
then reported. Latency: a traced record's ``now - source time`` at the write.
"""

from __future__ import annotations

import collections
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agiledart.app.errors import ExecutionError
from agiledart.dataplane import Trace
from agiledart.operators.base import FINAL_WATERMARK, MIN_WATERMARK, Record
from agiledart.runtime.confine import DataPolicy
from agiledart.runtime.connectors import Sink, open_sink
from agiledart.runtime.deadletters import DeadLetters
from agiledart.runtime.epochs import Alignment, Channel
from agiledart.runtime.metrics import LatencyHistogram, quantile
from agiledart.runtime.mqtt import BrokerPool, MqttSink
from agiledart.runtime.recovery import CheckpointError
from agiledart.runtime.topology import LocalTopology, merged_watermark
from agiledart.runtime.twophase import SpooledSink

__all__ = ["Fetch", "Keep", "LocalSinks", "SinkState", "Tracer", "connection_of"]

#: (instance, epoch, blob) -> the ``state`` (or ``state_failed``) report of its fragments
Keep = Callable[[str, int, bytes], Awaitable[dict[str, Any]]]
#: (a ``state`` report, epoch) -> the blob it stored
Fetch = Callable[[Mapping[str, Any], int], Awaitable[bytes]]


def now_ms() -> float:
    return time.time() * 1000.0


class Tracer(Protocol):
    def emit(self, type: str, **fields: Any) -> None: ...


@dataclass
class SinkState:
    sink: Sink
    inputs: dict[str, int]  #: input id -> watermark
    done: bool = False
    ended: bool = False  #: done, flushed (drained) and reported to the scheduler
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


class LocalSinks:
    """The sinks (and dead-letter sinks) of an app on this peer, opened together."""

    def __init__(
        self,
        *,
        app_id: str,
        topology: LocalTopology,
        fail: Callable[[str], None],
        report: Callable[[int, dict[str, Any]], Awaitable[None]],
        on_sink_done: Callable[[str, dict[str, Any]], Awaitable[None]],
        spawn: Callable[[Awaitable[None]], Any],
        trace: Tracer | None = None,
        keep: Keep | None = None,
        fetch: Fetch | None = None,
    ) -> None:
        """``keep`` stores what a sink that may move holds at a checkpoint as
        fragments on leaf-set peers, ``fetch`` gets it back on a restore (both
        :class:`~agiledart.runtime.snapshots.InstanceCheckpoints`'); without them the
        sinks keep it on this peer's disk only."""
        self.app_id = app_id
        self.topology = topology
        self.fail = fail
        self.report = report
        self.on_sink_done = on_sink_done
        self.spawn = spawn
        self.trace = trace
        self.keep = keep
        self.fetch = fetch
        self.states: dict[str, SinkState] = {}
        #: operator -> its dead-letter sink here (``on_error: dead_letter``)
        self.dead_letters: dict[str, DeadLetters] = {}

    def open(
        self,
        *,
        out_dir: Path,
        brokers: BrokerPool | None,
        restore: dict[str, Any],
        policy: DataPolicy,
        checkpointed: bool,
    ) -> None:
        """Open the local sinks and dead-letter sinks; nothing stays open if one fails."""
        topo, spec, me = self.topology, self.topology.spec, self.topology.me
        try:
            for k in spec.sinks:
                if k.id not in topo.sinks:
                    continue
                resume = restore.get("sinks", {}).get(k.id) if restore else None
                sink = open_sink(
                    k,
                    out_dir=out_dir,
                    brokers=brokers,
                    resume=resume,
                    policy=policy,
                    app=(self.app_id, me, checkpointed),
                )
                self.states[k.id] = SinkState(sink, dict.fromkeys(k.inputs, MIN_WATERMARK))
                self.states[k.id].align = Alignment(topo.sink_channels(k.id))
            for op in topo.local_ops:
                letters = spec.operator(op).dead_letter
                if letters is not None:
                    self.dead_letters[op] = DeadLetters(
                        letters, app=self.app_id, op=op, peer=me, out_dir=out_dir,
                        brokers=brokers, policy=policy,
                    )  # fmt: skip
        except BaseException:
            self.close()
            raise

    def publishers(self) -> Iterator[Coroutine[Any, Any, None]]:
        """The tasks that publish what sinks buffered (mqtt, sql, http, dead letters)."""
        for state in self.states.values():
            if isinstance(state.sink, MqttSink | SpooledSink):
                yield state.sink.run()
        for letters in self.dead_letters.values():
            publisher = letters.publisher()
            if publisher is not None:
                yield publisher

    async def drain_dead_letters(self) -> None:
        for letters in self.dead_letters.values():
            await letters.drain()

    def close(self) -> None:
        for state in self.states.values():
            with contextlib.suppress(OSError):
                state.sink.close()
        for letters in self.dead_letters.values():
            letters.close()

    def write(
        self, sink_id: str, records: list[Record], traces: list[Trace], channel: Channel
    ) -> None:
        state = self.states[sink_id]
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

    async def barrier(self, sink_id: str, channel: Channel, epoch: int) -> None:
        state = self.states[sink_id]
        aligned = state.align.barrier(channel, epoch)
        if aligned is not None:
            await self._aligned(sink_id, aligned)

    async def _aligned(self, sink_id: str, epoch: int) -> None:
        """What came before barrier ``epoch`` on every channel is written: commit it."""
        state = self.states[sink_id]
        commit = getattr(state.sink, "commit", None)
        blob: bytes | None = None
        try:
            if isinstance(state.sink, SpooledSink):  # its rows wait for the epoch's commit
                committed: Any = await state.sink.seal(epoch)
                if self.keep is not None and state.sink.movable:
                    blob = await state.sink.held(epoch)
            else:
                committed = commit() if commit is not None else None
        except ExecutionError as exc:
            self.fail(str(exc))
            return
        if blob is None:
            await self.report(epoch, {"kind": "sink", "id": sink_id, "commit": committed})
        else:  # reported once what it holds is stored with the checkpoint
            self.spawn(self._kept(sink_id, epoch, committed, blob))
        held, state.held = state.held, []
        for entry in held:
            if entry[0] == "d":
                self.write(sink_id, entry[2], entry[3], entry[1])
            else:
                await self.watermark(sink_id, entry[2], entry[3], entry[1][1])

    async def _kept(self, sink_id: str, epoch: int, committed: dict[str, Any], blob: bytes) -> None:
        """What sink ``sink_id`` holds at ``epoch`` stored on leaf-set peers, then its
        report of the epoch, naming them (a restore on another peer fetches it)."""
        assert self.keep is not None
        kept = await self.keep(f"{sink_id}@{self.topology.me}", epoch, blob)
        if kept["kind"] != "state":  # the epoch cannot commit
            await self.report(epoch, kept)
            return
        state = {k: v for k, v in kept.items() if k != "kind"}
        await self.report(
            epoch, {"kind": "sink", "id": sink_id, "commit": {**committed, "state": state}}
        )

    async def restore(self, restore: Mapping[str, Any]) -> None:
        """Before anything runs: a sink restored on a peer other than the one that
        sealed the committed epoch gets what that epoch held (:meth:`SpooledSink.seed`)."""
        epoch = restore.get("epoch")
        for sink_id, state in self.states.items():
            resume = restore.get("sinks", {}).get(sink_id)
            if not isinstance(state.sink, SpooledSink) or not isinstance(resume, dict):
                continue
            kept = resume.get("state")
            if kept is None or self.fetch is None or resume.get("peer") == self.topology.me:
                continue
            try:
                blob = await self.fetch(kept, int(epoch or 0))
            except CheckpointError as exc:
                msg = f"sink {sink_id!r}: what checkpoint {epoch} held is lost: {exc}"
                raise ExecutionError(msg) from None
            await state.sink.seed(blob, resume)

    async def watermark(self, sink_id: str, producer: str, wm: int, sender: str = "") -> None:
        state = self.states[sink_id]
        channel = (producer, sender)
        if state.align.blocked(channel):
            state.held.append(("w", channel, producer, wm))
            return
        if wm >= FINAL_WATERMARK:
            epoch = state.align.finish(channel)
            if epoch is not None:
                await self._aligned(sink_id, epoch)
        wm = merged_watermark(
            self.topology, state.senders.setdefault(producer, {}), producer, sender, wm
        )
        if producer in state.inputs and wm > state.inputs[producer]:
            state.inputs[producer] = wm
        if state.done or any(w < FINAL_WATERMARK for w in state.inputs.values()):
            return
        state.done = True
        state.sink.flush()
        if isinstance(state.sink, MqttSink | SpooledSink):  # done once the broker has it all
            self.spawn(self._drained(sink_id, state.sink))
            return
        state.ended = True
        await self.on_sink_done(sink_id, self.info(sink_id))

    def checkpoint_committed(self, epoch: int) -> None:
        """The scheduler committed ``epoch``: sinks holding its output may send it."""
        for state in self.states.values():
            if isinstance(state.sink, SpooledSink):
                state.sink.committed_epoch(epoch)

    async def _drained(self, sink_id: str, sink: MqttSink | SpooledSink) -> None:
        await sink.drain()  # what it cannot publish in time it drops, and counts
        self.states[sink_id].ended = True
        await self.on_sink_done(sink_id, self.info(sink_id))

    def info(self, sink_id: str) -> dict[str, Any]:
        state = self.states[sink_id]
        lat = sorted(state.latencies)
        path = state.sink.path
        return {
            "records": state.sink.stats.records,
            "dropped": state.sink.stats.dropped,
            "errors": state.sink.stats.errors,
            "done": state.done,
            "ended": state.ended,
            "path": None if path is None else os.path.abspath(path),
            **connection_of(state.sink),
            "latency_p50_ms": quantile(lat, 0.5),
            "latency_p99_ms": quantile(lat, 0.99),
            "latency_samples": len(lat),
            "latency_recent_ms": [round(x, 2) for x in list(state.latencies)[-256:]],
            "first_at": state.first_at,
            "last_at": state.last_at,
        }


def connection_of(sink: Any) -> dict[str, Any]:
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
