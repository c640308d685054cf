"""The ``mqtt`` sink: each record published to the topic its template makes."""

from __future__ import annotations

import asyncio
import collections
import logging
from pathlib import Path
from typing import Any

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec
from agiledart.app.topics import TopicTemplate
from agiledart.operators import Record
from agiledart.runtime.connectors import SinkStatistics
from agiledart.runtime.mqtt.core import BrokerOptions, encode_payload
from agiledart.runtime.mqtt.pool import PUBLISH_WINDOW, BrokerPool

log = logging.getLogger(__name__)

__all__ = ["RETRY_PAUSE_S", "MqttSink"]

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
