"""The ``mqtt`` source: the records of the messages on a topic filter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agiledart.app.errors import DataError, ExecutionError
from agiledart.app.spec import SourceSpec
from agiledart.dataplane import OverloadPolicy, SourceBuffer
from agiledart.operators import Record
from agiledart.runtime.connectors import SourceStatistics
from agiledart.runtime.mqtt.core import BrokerOptions, PayloadDecoder
from agiledart.runtime.mqtt.pool import BrokerPool

__all__ = ["MqttSource", "MqttSourceStatistics"]

_SHED = {"shed-oldest": OverloadPolicy.SHED_OLDEST, "shed-newest": OverloadPolicy.SHED_NEWEST}


@dataclass(slots=True)
class MqttSourceStatistics(SourceStatistics):
    """A source's statistics, and whether the broker has its subscription now."""

    received: int = 0  #: messages that reached the source (parsed or not)
    subscribed: bool = False


class MqttSource:
    """An ``mqtt`` source: the records of the messages on a topic filter.

    Each message is decoded by a :class:`~agiledart.runtime.mqtt.PayloadDecoder`
    (a bad one counts in ``parse_errors``) into a bounded buffer that sheds when full,
    oldest or newest first (``shed``): the connection is shared, so one slow app must
    not hold the others back. :meth:`run` hands downstream up to ``batch_size``
    records at a time, lingering ``tick_s`` for a batch to gather; with ``count`` it
    returns after that many records (those shed included), unsubscribing.
    """

    def __init__(
        self,
        spec: SourceSpec,
        *,
        brokers: BrokerPool,
        batch_size: int = 1000,
        tick_s: float = 0.005,
        wall_ms: Callable[[], float] = lambda: time.time() * 1000.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if spec.connector != "mqtt":
            msg = f"source {spec.id!r}: an MqttSource needs the mqtt connector"
            raise ExecutionError(msg)
        p = spec.params
        owner = f"source {spec.id!r}"
        self.spec = spec
        self.stats = MqttSourceStatistics()
        self.broker = BrokerOptions.from_params(p, owner=owner)
        self.topic_filter: str = p["topic"]
        self.qos = int(p.get("qos", 0))
        self.count: int | None = p.get("count")
        fields = p.get("fields")
        self._decode = PayloadDecoder(
            format=p.get("format", "json"),
            fields=fields,
            topic_field=p.get("topic_field"),
            wall_ms=wall_ms,
        )
        policy = _SHED.get(p.get("overload", "shed-oldest"))
        if policy is None:
            msg = f"{owner}: overload must be shed-oldest or shed-newest"
            raise ExecutionError(msg)
        self._buffer = SourceBuffer(int(p.get("buffer", 10_000)), policy)
        self._brokers = brokers
        self._batch_size = batch_size
        self._tick_s = tick_s
        self._sleep = sleep
        self._taken = 0
        self._ended = self.count == 0
        self._wake = asyncio.Event()
        self._started = False

    def _on_message(self, topic: str, payload: bytes) -> None:
        if self._ended:
            return
        self.stats.received += 1
        try:
            record = self._decode(topic, payload)
        except DataError:
            self.stats.parse_errors += 1
            return
        self._buffer.send_nowait(record)
        self._taken += 1
        if self.count is not None and self._taken >= self.count:
            self._ended = True
        self._wake.set()

    def _on_active(self, active: bool) -> None:
        self.stats.subscribed = active

    async def run(self, emit: Callable[[list[Record]], Awaitable[None]]) -> None:
        """Hand the records to ``emit`` in batches; return after ``count`` records.

        Runs once; cancelling it unsubscribes.
        """
        if self._started:
            msg = f"source {self.spec.id!r} runs once; make a new MqttSource"
            raise ExecutionError(msg)
        self._started = True
        sub = self._brokers.subscribe(
            self.broker,
            self.topic_filter,
            self._on_message,
            qos=self.qos,
            on_active=self._on_active,
        )
        st = self.stats
        try:
            while True:
                if not self._buffer:
                    if self._ended:
                        break
                    self._wake.clear()
                    await self._wake.wait()
                    if len(self._buffer) < self._batch_size and not self._ended:
                        await self._sleep(self._tick_s)  # let a batch gather
                    continue
                batch = self._buffer.take(self._batch_size)
                st.shed = self._buffer.statistics().shed
                await emit(batch)
                st.emitted += len(batch)
                st.batches += 1
        finally:
            sub.close()
            st.subscribed = False
            st.shed = self._buffer.statistics().shed
        st.finished = True
