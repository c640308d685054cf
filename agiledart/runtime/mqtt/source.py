"""The ``mqtt`` source: the records of the messages on a topic filter."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agiledart.app.errors import DataError, ExecutionError
from agiledart.app.spec import SourceSpec
from agiledart.operators import Record
from agiledart.runtime.connectors import SourceStatistics
from agiledart.runtime.mqtt.acks import replay_ids
from agiledart.runtime.mqtt.core import BrokerOptions, PayloadDecoder
from agiledart.runtime.mqtt.pool import BrokerPool
from agiledart.runtime.mqtt.subscriptions import Subscription

__all__ = ["MqttSource", "MqttSourceStatistics"]

_POLICIES = ("shed-oldest", "shed-newest")
#: a source that sheds writes an ``ingest`` trace record at most this often
TRACE_EVERY_S = 1.0


@dataclass(slots=True)
class MqttSourceStatistics(SourceStatistics):
    """A source's statistics, and whether the broker has its subscription now.

    ``shed`` counts every message the engine took from the broker and gave up: the
    log was full (its ``buffer`` or ``buffer_mb``), or the disk failed."""

    received: int = 0  #: messages that reached the source (parsed or not)
    subscribed: bool = False
    backlog: int = 0  #: messages in the source's log, not yet handed on
    log_position: int = 0  #: messages read from the log so far (a replay point)
    #: the broker's redeliveries of messages already logged (or checkpointed), dropped
    duplicates: int = 0
    #: the broker connection: connecting, connected or retrying (since when, wall-clock
    #: seconds, and the last error: a wrong port shows as "cannot connect: ... refused")
    connection: str = "connecting"
    retrying_since: float | None = None
    last_error: str | None = None


class MqttSource:
    """An ``mqtt`` source: the records of the messages on a topic filter.

    Every message goes into the source's log on the peer's disk as it arrives,
    written by the broker's ingest process (:mod:`.worker`; a QoS 1 message is
    acknowledged once written), so the broker never waits on the engine.
    :meth:`run` reads the log behind, decoding each message with a
    :class:`~agiledart.runtime.mqtt.PayloadDecoder` (a bad one counts in
    ``parse_errors``) and handing downstream up to ``batch_size`` records at a
    time, lingering ``tick_s`` for a batch to gather.
    The log holds at most ``buffer`` messages and ``buffer_mb`` MiB: past that the
    source sheds, the oldest unread or the newest arrivals (``overload``), counted
    in ``shed``. With ``count`` it returns after that many records (those shed
    included), unsubscribing.

    ``durable`` (a checkpointed app's source): the log in ``log_dir`` is the same for
    every generation of the app. :meth:`checkpoint` gives the log position a
    checkpoint records (the messages read into the batches emitted so far),
    :meth:`committed` lets the log drop what a committed epoch covers (not what was
    merely read), and a source of a restored app, made with ``start`` = that
    position, reads on from there: what came after the checkpoint is replayed once.
    Stopped without ending, it leaves the subscription logging for the next
    generation; ended, it unsubscribes and leaves the log for a restore to read.
    A durable source has its own broker session, the same on any peer, and its QoS 1
    messages are acknowledged only once a committed epoch covers them (:mod:`.acks`):
    :meth:`replay_ids` is what a checkpoint records besides the position, and a source
    made with ``replay`` (a checkpoint's, on a peer that lacks the log) drops the
    broker's redeliveries of what the checkpoint covers.
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
        durable: bool = False,
        start: int = 0,
        replay: list[Any] | None = None,
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
        self._max_bytes = int(p.get("buffer_mb", 256)) << 20
        if log_dir is None:  # a source outside a peer (tests, tools): a private directory
            log_dir = Path(tempfile.mkdtemp(prefix=f"agiledart-mqtt-{spec.id}-"))
        self.log_dir = log_dir
        self._brokers = brokers
        self._batch_size = batch_size
        self._tick_s = tick_s
        self._sleep = sleep
        self._durable = durable
        self._start = start  #: the log position to read on from (a restored source's)
        self._replay = replay  #: the packet ids its checkpoint recorded
        #: records handed on, toward ``count`` (a restored source: counted from its start)
        self._taken = start
        self._emitted_at = start  #: the log position after the last batch emitted
        self._marks: dict[int, int] = {}  #: epoch -> its position, until committed
        self._released = start  #: the position of the last committed epoch
        self._ended = self.count == 0
        self._wake = asyncio.Event()
        self._started = False
        self._sub: Subscription | None = None
        self._traced_shed = 0
        self._traced_at = -TRACE_EVERY_S

    def checkpoint(self, epoch: int) -> int:
        """The log position barrier ``epoch`` follows: the messages read into the
        batches emitted before it (records, bad payloads and messages shed alike)."""
        self._marks[epoch] = self._emitted_at
        return self._emitted_at

    def replay_ids(self, position: int) -> list[Any] | None:
        """What a checkpoint at log ``position`` records besides it: the packet ids of
        the messages before it that the broker may still redeliver (None: not durable)."""
        if not self._durable:
            return None
        return replay_ids(self.log_dir, position)

    def committed(self, epoch: int) -> None:
        """Epoch ``epoch`` is committed: the log may drop what came before its position."""
        done = [e for e in self._marks if e <= epoch]
        if not done:
            return
        self._released = max(self._released, *(self._marks.pop(e) for e in done))
        if self._sub is not None:
            self._sub.read_to(self._emitted_at, self._released)

    def _on_commit(self) -> None:
        self._update()
        self._wake.set()

    def _on_active(self, active: bool) -> None:
        self.stats.subscribed = active

    def _on_connection(self, state: dict[str, Any]) -> None:
        st = self.stats
        st.connection = str(state.get("state"))
        st.retrying_since = state.get("since") if st.connection != "connected" else None
        st.last_error = state.get("last_error")

    @property
    def _shed(self) -> int:
        sub = self._sub
        return 0 if sub is None else sub.shed + sub.reader.skipped

    def _update(self, *, ending: bool = False) -> None:
        sub, st = self._sub, self.stats
        if sub is None:
            return
        st.shed = self._shed
        st.received = sub.received
        st.duplicates = sub.duplicates
        st.backlog = sub.reader.backlog
        st.log_position = sub.reader.position
        trace = self._brokers.trace
        now = time.monotonic()
        if trace is None or st.shed == self._traced_shed:
            return
        if ending or now - self._traced_at >= TRACE_EVERY_S:
            self._traced_shed, self._traced_at = st.shed, now
            trace.emit(
                "ingest",
                source=self.spec.id,
                broker=self.broker.address,
                topic=self.topic_filter,
                received=st.received,
                shed=st.shed,
                backlog=st.backlog,
            )

    def _take(self, sub: Subscription) -> list[Record]:
        """Decode the next batch from the log (shedding its oldest past ``buffer``)."""
        reader = sub.reader
        over = reader.backlog - self._limit
        if self._shed_oldest and over > 0:
            reader.skip(over)
        want = self._batch_size
        if self.count is not None:
            want = min(want, self.count - self._taken - self._shed)
        records: list[Record] = []
        while len(records) < want:
            messages = reader.read(want - len(records))
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
        return self.count is not None and self._taken + self._shed >= self.count

    async def run(self, emit: Callable[[list[Record]], Awaitable[None]]) -> None:
        """Hand the records to ``emit`` in batches; return after ``count`` records.

        Runs once; cancelling it unsubscribes.
        """
        if self._started:
            msg = f"source {self.spec.id!r} runs once; make a new MqttSource"
            raise ExecutionError(msg)
        self._started = True
        sub = self._sub = self._brokers.subscribe_log(
            self.broker,
            self.topic_filter,
            qos=self.qos,
            log_dir=self.log_dir,
            max_bytes=self._max_bytes,
            limit=None if self._shed_oldest else self._limit,
            on_commit=self._on_commit,
            on_active=self._on_active,
            durable=self._durable,
            start=self._start,
            seed=self._replay if self._durable else None,
        )
        attachment = sub.attachments
        sub.on_connection = self._on_connection
        if sub._owner is not None:  # the broker's connection as it is now
            self._on_connection(sub._owner.connection())
        st = self.stats
        try:
            while not self._ended:
                batch = self._take(sub)
                position = sub.reader.position
                self._update()
                if batch:
                    await emit(batch)
                    st.emitted += len(batch)
                    st.batches += 1
                # before any await: a barrier may come next (a batch of only bad
                # payloads or shed messages emits nothing, and is past as well)
                self._emitted_at = position
                if batch:
                    sub.read_to(position, self._released if self._durable else None)
                if self._done():
                    self._ended = True
                elif not batch and not sub.reader.backlog:
                    self._wake.clear()
                    await self._wake.wait()
                    if sub.reader.backlog < self._batch_size:
                        await self._sleep(self._tick_s)  # let a batch gather
        finally:
            self._update(ending=True)
            if not self._durable:
                sub.close()
            elif self._ended and sub.attachments == attachment:
                sub.close(remove=False)  # a restore may read it again
            else:  # the next generation's source reads on (unless it does already)
                self._brokers.detach(sub, attachment)
            st.subscribed = False
        st.finished = True
