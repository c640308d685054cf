"""The ``mqtt`` sinks: each record published to the topic its template makes.

Without checkpoints an :class:`MqttSink` publishes as records come (at most once
through a failure). With checkpoints an :class:`MqttEpochSink` is a two-phase sink
(:mod:`agiledart.runtime.twophase`, Flink's model): an epoch's messages are spooled
on the sink's peer's disk at its barrier and published only after the epoch commits,
in order, QoS 1, each acknowledged before the spool lets it go; while the broker is
down they wait on disk (``buffer_mb``), and with each checkpoint on leaf-set peers, so
the sink moves to another peer when its own dies for good. A message published
again (the sink's peer restarted mid-epoch or died, a QoS 1 redelivery) carries the
same id, ``<app>/<sink>/<epoch>/<n>`` (:func:`message_id`), as the MQTT 5 user
property ``agiledart-id`` and, with
``id_in_payload``, as the payload's ``agiledart_id`` field: a consumer that drops
repeated ids sees every result exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import secrets
from collections.abc import Mapping
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec
from agiledart.app.topics import TopicTemplate
from agiledart.operators import Record
from agiledart.runtime.connectors import SinkStatistics, json_line
from agiledart.runtime.mqtt.core import BrokerOptions, encode_payload
from agiledart.runtime.mqtt.pool import PUBLISH_WINDOW, BrokerPool
from agiledart.runtime.spool import FINAL_EPOCH, Entry
from agiledart.runtime.twophase import DEFAULT_BUFFER_MB, DestinationDown, SpooledSink

if TYPE_CHECKING:
    from agiledart.runtime.confine import DataPolicy

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BUFFER_MB",
    "ID_FIELD",
    "RETRY_PAUSE_S",
    "BrokerDown",
    "MqttEpochSink",
    "MqttSink",
    "message_id",
]

#: A sink whose whole batch failed waits this long before it tries again.
RETRY_PAUSE_S = 0.05


class MqttSink:
    """An ``mqtt`` sink: publishes each record to the topic its template makes.

    ``write`` only queues (never blocks, never raises for bad records or an absent
    broker): a record without the fields its topic needs, or that cannot be encoded,
    counts in ``errors``; when ``buffer`` messages wait, the oldest is dropped and
    counted in ``dropped``. :meth:`run` is the publisher, run by the owner in its task
    group until the sink is closed; what fails to go out is queued again, first.
    :meth:`drain` waits for the queue to empty.
    """

    path: Path | None = None

    def __init__(self, spec: SinkSpec, *, brokers: BrokerPool) -> None:
        if spec.connector != "mqtt":
            msg = f"sink {spec.id!r}: an MqttSink needs the mqtt connector"
            raise ExecutionError(msg)
        p = spec.params
        self.id = spec.id
        self.stats = SinkStatistics()
        self.broker = BrokerOptions.from_params(p, owner=f"sink {spec.id!r}")
        try:
            self.topic = TopicTemplate(p["topic"])
        except ValueError as exc:
            msg = f"sink {spec.id!r}: {exc}"
            raise ExecutionError(msg) from None
        self.qos = int(p.get("qos", 0))
        self.format: str = p.get("format", "json")
        self.capacity = int(p.get("buffer", 10_000))
        self.drain_timeout_s = float(p.get("drain_timeout_ms", 30_000)) / 1000.0
        if self.qos not in (0, 1) or self.format not in ("json", "msgpack") or self.capacity < 1:
            msg = f"sink {spec.id!r}: need qos 0 or 1, format json or msgpack, buffer >= 1"
            raise ExecutionError(msg)
        self._queue: collections.deque[tuple[str, bytes]] = collections.deque()
        self._inflight = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._lease = brokers.lease(self.broker)

    @property
    def queued(self) -> int:
        """Messages waiting to be published or in flight."""
        return len(self._queue) + self._inflight

    @property
    def connected(self) -> bool:
        return self._lease.connected

    def connection(self) -> dict[str, Any]:
        """The broker connection: connected, connecting or retrying (since, last error)."""
        return self._lease.connection()

    async def wait_connected(self) -> bool:
        """Wait until the broker is connected (True) or the sink is closed (False)."""
        return await self._lease.wait_connected()

    def write(self, records: list[Record]) -> None:
        if self._closed:
            msg = f"sink {self.id!r} is closed"
            raise ExecutionError(msg)
        st = self.stats
        for r in records:
            try:
                message = (self.topic.fill(r), encode_payload(r, self.format))
            except (ValueError, TypeError, OverflowError) as exc:
                st.errors += 1
                if st.errors == 1:
                    log.warning("sink %r cannot publish a record: %s", self.id, exc)
                continue
            if self.queued >= self.capacity:
                st.dropped += 1
                if not self._queue:  # everything is in flight: drop this one
                    continue
                self._queue.popleft()
            self._queue.append(message)
        if self._queue:
            self._idle.clear()
            self._wake.set()

    def flush(self) -> None:
        """Publishing goes on in :meth:`run`; await :meth:`drain` to wait for it."""
        self._wake.set()

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything written is published (True). After ``timeout``
        seconds (default: the sink's ``drain_timeout_ms``) what is still queued is
        dropped and counted, and the answer is False."""
        limit = self.drain_timeout_s if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                await self._idle.wait()
        except TimeoutError:
            left = len(self._queue)
            self._queue.clear()
            self.stats.dropped += left
            log.warning(
                "sink %r: broker %s took not all records in %.1f s; %d dropped",
                self.id,
                self.broker.address,
                limit,
                left,
            )
            return False
        return True

    def close(self) -> None:
        """Stop publishing: what is still queued is dropped (counted); idempotent."""
        if self._closed:
            return
        self._closed = True
        self.stats.dropped += len(self._queue)
        self._queue.clear()
        self._lease.close()
        self._wake.set()

    async def run(self) -> None:
        """Publish what is written until the sink is closed (the owner runs this)."""
        while not self._closed:
            if not self._queue:
                if not self._inflight:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            if not await self._lease.wait_connected():
                continue
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), PUBLISH_WINDOW))]
            self._inflight = len(batch)
            try:
                ok = await self._lease.publish_many(batch, self.qos)
            finally:
                self._inflight = 0
            self._account(batch, ok)
            if not any(ok):
                await asyncio.sleep(RETRY_PAUSE_S)  # the broker is going away: don't spin

    def _account(self, batch: list[tuple[str, bytes]], ok: list[bool]) -> None:
        st = self.stats
        sent = [m for m, good in zip(batch, ok, strict=True) if good]
        if sent:
            st.records += len(sent)
            st.batches += 1
            st.bytes += sum(len(p) for _, p in sent)
        failed = [m for m, good in zip(batch, ok, strict=True) if not good]
        if self._closed:
            st.dropped += len(failed)
            return
        self._queue.extendleft(reversed(failed))  # again, first (QoS 1: at least once)
        while len(self._queue) > self.capacity:
            self._queue.popleft()
            st.dropped += 1


#: the payload field carrying a message's id, with ``id_in_payload``
ID_FIELD = "agiledart_id"


class BrokerDown(DestinationDown):
    """The broker did not acknowledge every message: they wait and go again."""


def message_id(app: str, sink: str, epoch: int | str, n: int) -> str:
    """A message's id: the same for the ``n``-th message of the same epoch, however
    often it is published (``final``: the messages after the last checkpoint)."""
    tag = "final" if epoch == FINAL_EPOCH else str(epoch)
    return f"{app}/{sink}/{tag}/{n}"


def _plain(record: Record) -> Any:
    """A record as JSON takes it (what the spool holds)."""
    return json.loads(json_line(record))


class MqttEpochSink(SpooledSink):
    """An ``mqtt`` sink of a checkpointed app: per committed epoch, QoS 1, with ids
    (see the module's docstring)."""

    destination: ClassVar[str] = "the broker"
    unit: ClassVar[str] = "messages"
    path: Path | None = None

    def __init__(
        self,
        spec: SinkSpec,
        *,
        brokers: BrokerPool,
        app_id: str,
        instance: str,
        out_dir: str | Path,
        resume: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            spec,
            app_id=app_id,
            instance=instance,
            out_dir=out_dir,
            checkpointed=True,
            resume=resume,
        )
        self._marker = Path(out_dir) / f".{spec.id}.complete"
        self._run = secrets.token_hex(4)  #: tags rows never sealed into an epoch
        #: (first entry's seq, messages of it acknowledged) of a delivery cut short
        self._acked: tuple[int, int] = (-1, 0)
        self._lease = brokers.lease(self.broker)

    def _configure(
        self, spec: SinkSpec, owner: str, out_dir: Path, policy: DataPolicy | None
    ) -> None:
        p = spec.params
        self.broker = BrokerOptions.from_params(p, owner=owner)
        try:
            self.topic = TopicTemplate(p["topic"])
        except ValueError as exc:
            msg = f"{owner}: {exc}"
            raise ExecutionError(msg) from None
        self.format: str = p.get("format", "json")
        self.id_in_payload = bool(p.get("id_in_payload", False))
        if self.format not in ("json", "msgpack"):
            msg = f"{owner}: need format json or msgpack"
            raise ExecutionError(msg)

    def _rows_of(self, records: list[Record]) -> list[Any]:
        rows = []
        for r in records:
            try:
                rows.append([self.topic.fill(r), _plain(r)])
            except (ValueError, TypeError, OverflowError) as exc:
                self.stats.errors += 1
                if self.stats.errors == 1:
                    log.warning("sink %r cannot publish a record: %s", self.id, exc)
        return rows

    def close(self) -> None:
        if not self._closed:
            self._lease.close()
        super().close()

    async def _already_complete(self) -> bool:
        return await asyncio.to_thread(self._marker.exists)

    async def _deliver(self, entries: list[Entry], final: bool) -> int:
        """The entries' messages published epoch by epoch, in order, each numbered
        from its epoch's first: an epoch published again gets the same ids."""
        loaded = await asyncio.to_thread(lambda: [(e, self.spool.load(e)) for e in entries])
        messages: list[tuple[str, bytes]] = []
        ids: list[str] = []
        for epoch, grouped in groupby(loaded, key=lambda eb: eb[1].epoch):
            group = list(grouped)
            tag = f"{self._run}-{group[0][0].seq}" if epoch is None else epoch
            rows = [row for _, b in group for row in b.rows]
            for n, (topic, record) in enumerate(rows):
                mid = message_id(self.app_id, self.id, tag, n)
                if self.id_in_payload:
                    record = {**record, ID_FIELD: mid}
                messages.append((topic, encode_payload(record, self.format)))
                ids.append(mid)
        await self._publish(entries[0].seq if entries else -1, messages, ids)
        if final:
            await asyncio.to_thread(self._marker.touch)
        await asyncio.to_thread(self.spool.remove, entries)
        self._acked = (-1, 0)
        return len(messages)

    async def _publish(self, first: int, messages: list[tuple[str, bytes]], ids: list[str]) -> None:
        """``messages`` to the broker, a window at a time, each acknowledged (QoS 1);
        after a failure, on from the first one not acknowledged."""
        start = self._acked[1] if self._acked[0] == first else 0
        for i in range(start, len(messages), PUBLISH_WINDOW):
            window = slice(i, i + PUBLISH_WINDOW)
            ok = await self._lease.publish_many(messages[window], 1, ids[window])
            done = next((j for j, good in enumerate(ok) if not good), len(ok))
            self.stats.bytes += sum(len(p) for _, p in messages[i : i + done])
            self._acked = (first, i + done)
            if done < len(ok):
                what = self._lease.connection()["last_error"] or "messages not acknowledged"
                msg = f"broker {self.broker.address}: {what}"
                raise BrokerDown(msg)
