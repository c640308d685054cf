"""The edges between one peer's part of an app and the other peers' parts: drivers
around the data plane's sans-IO objects (:mod:`agiledart.dataplane`).

* :class:`OutEdge` (sender): records of one local node for its consumers on one other
  peer. A :class:`~agiledart.dataplane.Batcher` numbers them into batches of up to
  ``batch_records``, cut when full, when the producing task has nothing more to do, or
  ``linger_s`` after the first record waited; each batch spends one credit of a
  :class:`~agiledart.dataplane.CreditWindow` and leaves as a ``data`` frame
  (:class:`~agiledart.dataplane.frames.DataFrame`). Watermarks and barriers follow the
  data of their edge in order, without credit.
* :class:`InEdge` (receiver): the same edge at its destination. A
  :class:`~agiledart.dataplane.SequenceTracker` drops copies of a batch; a
  :class:`~agiledart.dataplane.CreditGrantor` (one unit: one batch) hands a credit back
  when every local consumer given the batch has processed it (:class:`BatchAck`), so the
  edge holds at most ``credits`` batches in flight; a sender beyond its credit, or far
  ahead of its own sequence, broke the protocol (:class:`~agiledart.dataplane.ProtocolError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from agiledart.dataplane import (
    Batch,
    Batcher,
    CreditGrantor,
    CreditWindow,
    ProtocolError,
    SequenceTracker,
    Trace,
    TracePoint,
)
from agiledart.dataplane.frames import BarrierFrame, CreditFrame, DataFrame, WatermarkFrame
from agiledart.operators.base import Record
from agiledart.overlay.errors import OverlayError
from agiledart.runtime.deployment import InstanceOptions
from agiledart.runtime.errors import PeerLost
from agiledart.runtime.links import Address, Links

if TYPE_CHECKING:
    from agiledart.runtime.recovery import Uplink
    from agiledart.runtime.relay import Relay

__all__ = ["BatchAck", "EdgeStatistics", "InEdge", "Origin", "OutEdge", "ReplyChannel"]

#: how far a sender's batch numbers may run ahead of the first one missing: farther is
#: a broken sender (the numbers remembered ahead stay bounded)
AHEAD_PER_CREDIT = 64


@dataclass
class EdgeStatistics:
    records: int = 0
    batches: int = 0
    credit_waits: int = 0
    wait_s: float = 0.0  #: time spent waiting for credit or the emulated uplink


class OutEdge:
    """Records from one local node to its consumers on one other peer."""

    def __init__(
        self,
        *,
        app_id: str,
        producer: str,
        sender: str,
        dest: str,
        address: Address,
        links: Links,
        options: InstanceOptions,
        spawn: Callable[[Awaitable[None]], Any],
        relay: Relay | None = None,
        generation: int = 0,
        uplink: Uplink | None = None,
    ) -> None:
        self.app_id = app_id
        self.generation = generation
        self.uplink = uplink  #: the peer's emulated upload rate, which data shares
        self.relay = relay
        #: a relayed edge fills its batches for a link slot: every packet costs attempts
        self.linger_s = (
            options.linger_s
            if relay is None
            else max(options.linger_s, relay.model.slot_ms / 1000.0)
        )
        self.producer = producer
        self.dest = dest
        self.address = address
        self.id = f"{producer}|{sender}"
        self.links = links
        self.options = options
        self.batcher = Batcher(
            self.id, max_records=options.batch_records, max_delay_ms=self.linger_s * 1000.0
        )
        self.window = CreditWindow(options.credits)
        self.stats = EdgeStatistics()
        self._credit = asyncio.Event()
        self._credit.set()
        self._gone = False
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._spawn = spawn

    @property
    def pending(self) -> int:
        """Records waiting for their batch to fill (or for the linger to end)."""
        return len(self.batcher)

    def grant(self, n: int) -> None:
        self.window.grant(n)
        self._credit.set()

    def gone(self) -> None:
        """The destination answered that it does not run the app (it restarted and
        lost its instances): no credit will ever come, the next send raises."""
        self._gone = True
        self._credit.set()

    def _check_gone(self) -> None:
        if self._gone:
            raise PeerLost(self.dest, f"it no longer runs app {self.app_id} (restarted?)")

    async def send(self, records: list[Record], traces: Sequence[Trace]) -> None:
        if not records:
            return
        last = len(records) - 1
        new = tuple.__new__  # a NamedTuple's own constructor is a Python call: skip it
        points = (
            [new(TracePoint, (min(i, last), t)) for i, t in enumerate(traces)] if traces else ()
        )
        loop = asyncio.get_running_loop()
        if self.batcher.extend(records, loop.time() * 1000.0, points):
            await self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger_s, self._linger)

    async def flush_idle(self) -> None:
        """The producer went idle: a partial batch leaves now (a relayed one lingers)."""
        if self.relay is None and len(self.batcher):
            await self.flush()

    def _linger(self) -> None:
        self._timer = None
        if len(self.batcher):
            self._spawn(self.flush())

    async def flush(self) -> None:
        """Every pending record leaves, in batches of at most ``batch_records``."""
        async with self._lock:
            while (batch := self.batcher.cut()) is not None:
                await self._send_batch(batch)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    async def _send_batch(self, batch: Batch) -> None:
        if not self.window.can_send():
            started = time.monotonic()
            while not self.window.can_send():
                self._check_gone()
                self.stats.credit_waits += 1
                self._credit.clear()
                await self._credit.wait()
            self.stats.wait_s += time.monotonic() - started
        self.window.consume()
        frame = DataFrame(self.app_id, self.producer, batch, self.generation)
        body = frame.to_wire()
        if self.uplink is not None:  # the emulated link: the batch takes its time
            started = time.monotonic()
            await self.uplink.send(len(msgpack.packb(body["b"])))
            self.stats.wait_s += time.monotonic() - started
        await self._send(frame.TYPE, body)
        self.stats.records += len(batch.records)
        self.stats.batches += 1

    async def watermark(self, wm: int, wall: float) -> None:
        await self.flush()
        async with self._lock:
            frame = WatermarkFrame(self.app_id, self.producer, wm, wall, self.generation)
            await self._send(frame.TYPE, frame.to_wire())

    async def barrier(self, epoch: int) -> None:
        await self.flush()
        async with self._lock:
            frame = BarrierFrame(self.app_id, self.producer, epoch, self.generation)
            await self._send(frame.TYPE, frame.to_wire())

    async def _send(self, type: str, body: dict[str, Any]) -> None:
        if self.relay is not None:
            await self.relay.submit(self.app_id, self.id, type, body, self.dest, self.address)
            return
        self._check_gone()
        try:
            client = await self.links.client(self.address)
            await client.send(type, body)
        except OverlayError as exc:
            raise PeerLost(self.dest, str(exc)) from None


class ReplyChannel(Protocol):
    """Where a batch's credit goes back: the connection it came on, or, for a batch
    relayed over the emulated network, a direct line to its origin."""

    @property
    def peer_name(self) -> str: ...

    async def send(self, type: str, body: Mapping[str, Any] | None = None) -> None: ...


class Origin:
    """The reply channel of a relayed batch: credits go straight to its origin."""

    def __init__(self, name: str, address: Address, links: Links) -> None:
        self._name, self._address, self._links = name, address, links

    @property
    def peer_name(self) -> str:
        return self._name

    async def send(self, type: str, body: Mapping[str, Any] | None = None) -> None:
        client = await self._links.client(self._address)
        await client.send(type, body)


class InEdge:
    """The receiving end of one edge: copies dropped, one credit back per batch done."""

    __slots__ = ("app_id", "duplicates", "edge", "generation", "grantor", "sequence", "started")

    def __init__(self, *, app_id: str, edge: str, credits: int, generation: int = 0) -> None:
        self.app_id = app_id
        self.edge = edge
        self.generation = generation
        self.sequence = SequenceTracker()
        self.grantor = CreditGrantor(credits, min_grant=1)
        self.duplicates = 0
        self.started = False

    def receive(self, batch: Batch) -> bool:
        """True: a new batch, to process; False: a copy of one already received.

        The edge's numbering starts at the first batch that arrives: an instance
        deployed here again while its sender went on (the same generation) takes the
        sender's numbers from where they are."""
        if not self.started:
            self.started = True
            self.sequence = SequenceTracker(next_expected=batch.seq)
        return self._receive(batch)

    def _receive(self, batch: Batch) -> bool:
        ahead = batch.seq - self.sequence.next_expected
        if ahead > AHEAD_PER_CREDIT * self.grantor.capacity:
            msg = f"edge {self.edge}: batch {batch.seq} runs {ahead} ahead of the first missing"
            raise ProtocolError(msg)
        if not self.sequence.accept(batch.seq):
            self.duplicates += 1
            return False
        self.grantor.on_receive(1)  # beyond the sender's credit: ProtocolError
        return True

    async def processed(self, conn: ReplyChannel) -> None:
        """A batch left the consumers' queues: its credit goes back on ``conn``."""
        self.grantor.on_drain(1)
        n = self.grantor.take_grant()
        if n:
            frame = CreditFrame(self.app_id, self.edge, n, self.generation)
            with contextlib.suppress(OverlayError):
                await conn.send(frame.TYPE, frame.to_wire())


@dataclass
class BatchAck:
    """Tells ``edge`` a batch is processed once every consumer given it has."""

    edge: InEdge
    conn: ReplyChannel
    waiting: int

    async def done(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            await self.edge.processed(self.conn)
