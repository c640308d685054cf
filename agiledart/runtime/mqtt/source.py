"""The ``mqtt`` source: the records of the messages on a topic filter."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agiledart.app.errors import DataError, ExecutionError
from agiledart.app.spec import SourceSpec
from agiledart.operators import Record
from agiledart.runtime.connectors import SourceStatistics
from agiledart.runtime.mqtt.core import BrokerOptions, PayloadDecoder
from agiledart.runtime.mqtt.log import SourceLog
from agiledart.runtime.mqtt.pool import BrokerPool

__all__ = ["MqttSource", "MqttSourceStatistics"]

_POLICIES = ("shed-oldest", "shed-newest")


@dataclass(slots=True)
class MqttSourceStatistics(SourceStatistics):
    """A source's statistics, and whether the broker has its subscription now.

    ``shed`` counts every message the engine took from the broker and gave up: the
    log was full (its ``buffer`` or ``buffer_mb``), or the disk failed."""

    received: int = 0  #: messages that reached the source (parsed or not)
    subscribed: bool = False
    backlog: int = 0  #: messages in the source's log, not yet handed on
    log_bytes: int = 0  #: bytes the log holds on the peer's disk
    log_position: int = 0  #: messages read from the log so far (a replay point)


class MqttSource:
    """An ``mqtt`` source: the records of the messages on a topic filter.

    Every message goes into the source's :class:`~agiledart.runtime.mqtt.log.SourceLog`
    on the peer's disk as it arrives (a QoS 1 message is acknowledged once written),
    so the broker never waits on the engine. :meth:`run` reads the log behind,
    decoding each message with a :class:`~agiledart.runtime.mqtt.PayloadDecoder`
    (a bad one counts in ``parse_errors``) and handing downstream up to
    ``batch_size`` records at a time, lingering ``tick_s`` for a batch to gather.
    The log holds at most ``buffer`` messages and ``buffer_mb`` MiB: past that the
    source sheds, the oldest unread or the newest arrivals (``overload``), counted
    in ``shed``. With ``count`` it returns after that many records (those shed
    included), unsubscribing.
    """

    def __init__(
        self,
        spec: SourceSpec,
        *,
        brokers: BrokerPool,
        log_dir: Path | None = None,
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
        policy = p.get("overload", "shed-oldest")
        if policy not in _POLICIES:
            msg = f"{owner}: overload must be shed-oldest or shed-newest"
            raise ExecutionError(msg)
        self._shed_oldest = policy == "shed-oldest"
        self._limit = int(p.get("buffer", 1_000_000))
        if log_dir is None:  # a source outside a peer (tests, tools): a private directory
            log_dir = Path(tempfile.mkdtemp(prefix=f"agiledart-mqtt-{spec.id}-"))
        try:
            self._log = SourceLog(log_dir, max_bytes=int(p.get("buffer_mb", 256)) << 20)
        except OSError as exc:
            msg = f"{owner}: cannot keep its log in {log_dir}: {exc}"
            raise ExecutionError(msg) from None
        self._brokers = brokers
        self._batch_size = batch_size
        self._tick_s = tick_s
        self._sleep = sleep
        self._taken = 0  #: records handed on, and messages shed, toward ``count``
        self._ended = self.count == 0
        self._wake = asyncio.Event()
        self._started = False

    def _on_message(self, topic: str, payload: bytes) -> None:
        """Take a message from the connection (never blocks: full means shed)."""
        if self._ended:
            return
        self.stats.received += 1
        self._log.append(topic, payload, limit=None if self._shed_oldest else self._limit)

    def _on_commit(self) -> None:
        """Write what arrived in one go; then the connection acknowledges it."""
        if self._log.commit():
            self._wake.set()

    def _on_active(self, active: bool) -> None:
        self.stats.subscribed = active

    def _update(self) -> None:
        st, ls = self.stats, self._log.stats
        st.shed = ls.shed
        st.backlog = self._log.backlog
        st.log_bytes = ls.bytes
        st.log_position = self._log.position

    def _take(self) -> list[Record]:
        """Decode the next batch from the log (shedding its oldest past ``buffer``)."""
        log = self._log
        over = log.backlog - self._limit
        if self._shed_oldest and over > 0:
            log.skip(over)
        want = self._batch_size
        if self.count is not None:
            want = min(want, self.count - self._taken - log.stats.shed)
        records: list[Record] = []
        while len(records) < want:
            messages = log.read(want - len(records))
            if not messages:
                break
            for topic, payload in messages:
                try:
                    records.append(self._decode(topic, payload))
                except DataError:
                    self.stats.parse_errors += 1
        self._taken += len(records)
        return records

    def _done(self) -> bool:
        return self.count is not None and self._taken + self._log.stats.shed >= self.count

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
            commit=self._on_commit,
        )
        st = self.stats
        try:
            while not self._ended:
                batch = self._take()
                self._update()
                if batch:
                    await emit(batch)
                    st.emitted += len(batch)
                    st.batches += 1
                    self._log.release(self._log.position)
                if self._done():
                    self._ended = True
                elif not batch and not self._log.backlog:
                    self._wake.clear()
                    await self._wake.wait()
                    if self._log.backlog < self._batch_size:
                        await self._sleep(self._tick_s)  # let a batch gather
        finally:
            sub.close()
            st.subscribed = False
            self._update()
            self._log.close()
        st.finished = True
