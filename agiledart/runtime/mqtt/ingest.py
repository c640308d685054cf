"""A peer's subscribing connection to one broker: reads at the broker's speed.

The driver of :mod:`.wire`: an asyncio protocol takes each ``recv`` of packets in one
pass, hands every PUBLISH to its subscribers (who append it to their logs), has them
commit (one write each, :meth:`~agiledart.runtime.mqtt.log.SourceLog.commit`), and
only then writes the PUBACKs of that pass in one buffer. Nothing waits on the
engine: a subscriber that cannot keep up sheds (and counts it) instead of leaving
messages queued at the broker, where Mosquitto drops them uncounted past
``max_queued_messages``.

A session: connect (TCP_NODELAY, TLS if asked), CONNECT (with ``session_expiry_s``,
resuming the broker's persistent session under a fixed client id: what matched our
subscriptions while we were away comes first), CONNACK, then keep the broker's
subscriptions equal to the table's (:func:`~.core.plan`), ping every
``keepalive_s / 2`` and call the broker dead after ``1.5 * keepalive_s`` without a
byte. :meth:`Ingest.run` reconnects with back-off, like the publishing connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar, cast

from agiledart.runtime.errors import BrokerError
from agiledart.runtime.mqtt.core import (
    MAX_PAYLOAD,
    Backoff,
    BrokerOptions,
    BrokerPoolStatistics,
    Deliver,
    SubscriptionTable,
    plan,
)
from agiledart.runtime.mqtt.wire import (
    PINGREQ,
    ConnAck,
    Disconnect,
    Event,
    PacketReader,
    Publish,
    SubAck,
    UnsubAck,
    encode_connect,
    encode_disconnect,
    encode_pubacks,
    encode_subscribe,
    encode_unsubscribe,
)

log = logging.getLogger(__name__)

__all__ = ["MAX_PACKET", "ROUTE_CACHE", "Ingest"]

_T = TypeVar("_T")

#: The largest packet we let a broker send (a payload over MAX_PAYLOAD is still
#: counted as a parse error by its source; a bigger packet the broker drops).
MAX_PACKET = MAX_PAYLOAD + (64 << 10)
#: (topic, subscription ids) -> subscribers, remembered for this many topics at most
ROUTE_CACHE = 10_000


def _subscribe(topic_filter: str, qos: int, sub_id: int, packet_id: int) -> bytes:
    return encode_subscribe(packet_id, topic_filter, qos, sub_id)


def _unsubscribe(topic_filter: str, packet_id: int) -> bytes:
    return encode_unsubscribe(packet_id, topic_filter)


class _Protocol(asyncio.Protocol):
    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest
        self.reader = PacketReader(max_packet=MAX_PACKET)
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last_received = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.last_received = time.monotonic()
        try:
            events = self.reader.receive_data(data)
            acks = self.ingest.handle(events)
        except BrokerError as exc:
            self.fail(exc)
            return
        if acks and self.transport is not None:
            self.transport.write(encode_pubacks(acks))

    def fail(self, exc: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            msg = f"connection lost: {exc}" if exc else "the broker closed the connection"
            self.closed.set_exception(BrokerError(msg))


class Ingest:
    """Subscriptions to one broker over our own connection, reconnecting until cancelled."""

    def __init__(
        self,
        options: BrokerOptions,
        *,
        client_id: str,
        keepalive_s: int,
        timeout_s: float,
        stats: BrokerPoolStatistics,
        session_expiry_s: int = 0,
    ) -> None:
        self.options = options
        self.tls = options.ssl_context(f"broker {options.address}")
        self.client_id = client_id
        self.keepalive_s = keepalive_s
        self.timeout_s = timeout_s
        self.session_expiry_s = session_expiry_s
        self.stats = stats  #: the pool's BrokerPoolStatistics (messages_in, unrouted, errors)
        self.table = SubscriptionTable()
        self.granted: dict[str, tuple[int, int]] = {}
        #: what the broker held when the last session ended: a resumed session has it
        self._held: dict[str, tuple[int, int]] = {}
        self.refused: dict[str, str] = {}
        self.changed = asyncio.Event()
        #: subscriber key -> (its filter, what to tell when the broker has it or not)
        self.watchers: dict[int, tuple[str, Callable[[bool], None]]] = {}
        #: subscriber key -> what makes its delivered messages durable (before PUBACK)
        self.commits: dict[int, Callable[[], None]] = {}
        #: set for a session of held acknowledgements (:mod:`.acks`): every PUBLISH
        #: goes to it instead of the table, and is not acknowledged here (:meth:`ack`)
        self.hold: Callable[[Publish], None] | None = None
        #: called when a session is up, before its first PUBLISH is handled
        self.on_session: Callable[[], None] | None = None
        self._proto: _Protocol | None = None
        self._open: _Protocol | None = None  #: the connection, from its CONNECT on
        self._replies: dict[int, asyncio.Future[SubAck | UnsubAck]] = {}
        self._connack: asyncio.Future[ConnAck] | None = None
        self._next_pid = 0
        self._routes: dict[tuple[str, tuple[int, ...]], list[Deliver]] = {}
        self._routes_version = -1
        self.sessions_connected = 0  #: sessions that got a CONNACK (the pool counts connects)
        #: why the broker is not connected now (None once a session is up), and since when
        #: (wall-clock seconds): what ``status`` shows as the source's connection
        self.last_error: str | None = None
        self.down_since: float | None = time.time()

    @property
    def connected(self) -> bool:
        return self._proto is not None

    def _down(self, error: str) -> None:
        self.last_error = error
        if self.down_since is None:
            self.down_since = time.time()

    def active(self, topic_filter: str) -> bool:
        return self._proto is not None and topic_filter in self.granted

    def _notify(self) -> None:
        for topic_filter, watch in list(self.watchers.values()):
            watch(self.active(topic_filter))

    def _route(self, topic: str, sub_ids: tuple[int, ...]) -> list[Deliver]:
        """The table's route, remembered while the table does not change."""
        if self._routes_version != self.table.version:
            self._routes.clear()
            self._routes_version = self.table.version
        key = (topic, sub_ids)
        targets = self._routes.get(key)
        if targets is None:
            if len(self._routes) >= ROUTE_CACHE:
                self._routes.clear()
            targets = self._routes[key] = self.table.route(topic, sub_ids)
        return targets

    # -- the packets of one recv --------------------------------------------------------

    def handle(self, events: Sequence[Event]) -> list[int]:
        """Dispatch ``events``; the packet ids to acknowledge once all is committed."""
        st = self.stats
        acks: list[int] = []
        delivered = False
        for ev in events:
            if isinstance(ev, Publish):
                st.messages_in += 1
                if self.hold is not None:
                    try:
                        self.hold(ev)
                    except Exception:
                        st.errors += 1
                        log.exception("an MQTT subscriber failed on a message from %s", ev.topic)
                    delivered = True
                    continue
                targets = self._route(ev.topic, ev.sub_ids)
                if not targets:
                    st.unrouted += 1
                for deliver in targets:
                    try:
                        deliver(ev.topic, ev.payload)
                    except Exception:  # one bad subscriber must not stop the others
                        st.errors += 1
                        log.exception("an MQTT subscriber failed on a message from %s", ev.topic)
                delivered = True
                if ev.qos:
                    acks.append(ev.packet_id)
            elif isinstance(ev, ConnAck):
                if self.on_session is not None and ev.reason < 0x80:
                    self.on_session()  # before the PUBLISHes that may follow in this read
                if self._connack is not None and not self._connack.done():
                    self._connack.set_result(ev)
            elif isinstance(ev, SubAck | UnsubAck):
                reply = self._replies.pop(ev.packet_id, None)
                if reply is not None and not reply.done():
                    reply.set_result(ev)
            elif isinstance(ev, Disconnect):
                msg = f"the broker disconnected (reason 0x{ev.reason:02x})"
                raise BrokerError(msg)
        if delivered:
            for commit in list(self.commits.values()):
                try:
                    commit()
                except Exception:
                    st.errors += 1
                    log.exception("an MQTT subscriber failed to commit")
        return acks

    def ack(self, packet_ids: list[int]) -> None:
        """PUBACK ``packet_ids`` now (a held session's; lost if no session is up: the
        broker redelivers them, and they are acknowledged then)."""
        proto = self._open
        if packet_ids and proto is not None and proto.transport is not None:
            proto.transport.write(encode_pubacks(packet_ids))

    async def run(self, backoff: Backoff, rng: random.Random) -> None:
        """Run sessions, reconnecting with back-off, until cancelled."""
        attempt = 0
        st = self.stats
        while True:
            before = self.sessions_connected
            try:
                await self.session()
            except BrokerError as exc:  # the first failure in a row is news
                level = logging.WARNING if attempt == 0 else logging.DEBUG
                log.log(level, "MQTT broker %s: %s", self.options.address, exc)
                self._down(str(exc))
            except Exception as exc:  # a bug must not end the ingest: log, count, retry
                st.errors += 1
                log.exception("MQTT connection to %s failed", self.options.address)
                self._down(f"{type(exc).__name__}: {exc}")
            if self.sessions_connected > before:
                attempt = 0
            await asyncio.sleep(backoff.delay(attempt, rng))
            attempt += 1

    # -- a session --------------------------------------------------------------------

    async def session(self) -> None:
        """Connect, subscribe and read until the connection ends (BrokerError)."""
        loop = asyncio.get_running_loop()
        o = self.options
        try:
            async with asyncio.timeout(self.timeout_s):
                transport, proto = await loop.create_connection(
                    lambda: _Protocol(self),
                    o.host,
                    o.port,
                    ssl=self.tls,
                    server_hostname=o.host if self.tls is not None else None,
                )
        except (OSError, TimeoutError) as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc) or "timed out"
            msg = f"cannot connect to {o.host}:{o.port}: {why}"
            raise BrokerError(msg) from None
        self._open = proto
        try:
            self._connack = loop.create_future()
            transport.write(
                encode_connect(
                    self.client_id,
                    keepalive_s=self.keepalive_s,
                    max_packet=MAX_PACKET,
                    username=o.username,
                    password=o.password,
                    session_expiry_s=self.session_expiry_s,
                )
            )
            ack = await self._wait(proto, self._connack)
            if ack.reason >= 0x80:
                msg = f"the broker refused the connection (reason 0x{ack.reason:02x})"
                raise BrokerError(msg)
            self._proto = proto
            self.last_error, self.down_since = None, None
            if self.sessions_connected:
                self.stats.reconnects += 1
            self.sessions_connected += 1
            self.stats.connects += 1
            log.info("connected to MQTT broker %s (to subscribe)", o.address)
            # a resumed session still has its subscriptions: those no longer wanted
            # (their sources ended while we were away) are unsubscribed, not kept
            self.granted = self._held if ack.session_present else {}
            self.refused = {}
            self.changed.set()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._reconcile(proto))
                group.create_task(self._keepalive(proto))
                await proto.closed
        except BaseExceptionGroup as eg:  # why the session ended: the first broker error
            first = next((e for e in eg.exceptions if isinstance(e, BrokerError)), None)
            if first is None:
                raise
            raise first from None
        finally:
            if self._proto is not None:  # the session was up: the broker holds these
                self._held = self.granted
            self._proto = self._open = None
            self.granted = {}
            for reply in self._replies.values():
                reply.cancel()
            self._replies.clear()
            if not transport.is_closing():
                transport.write(encode_disconnect())
                transport.close()
            if proto.closed.done():  # why it closed was raised above, or does not matter
                proto.closed.exception()
            self._notify()

    async def _wait(self, proto: _Protocol, fut: asyncio.Future[_T]) -> _T:
        """``fut``'s result, unless the connection ends or the broker is too slow."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.wait((fut, proto.closed), return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            msg = f"no answer from the broker in {self.timeout_s} s"
            raise BrokerError(msg) from None
        if not fut.done():
            proto.closed.result()  # raises why it closed
        return fut.result()

    async def _request(self, proto: _Protocol, packet: Callable[[int], bytes]) -> object:
        self._next_pid = self._next_pid % 0xFFFF + 1
        pid = self._next_pid
        reply: asyncio.Future[SubAck | UnsubAck] = asyncio.get_running_loop().create_future()
        self._replies[pid] = reply
        assert proto.transport is not None
        proto.transport.write(packet(pid))
        return await self._wait(proto, reply)

    async def _reconcile(self, proto: _Protocol) -> None:
        """Keep the broker's subscriptions equal to the table's, as it changes."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            subscribe, unsubscribe = plan(self.table.wanted(), self.granted, self.refused)
            for topic_filter in unsubscribe:
                await self._request(proto, partial(_unsubscribe, topic_filter))
                del self.granted[topic_filter]
            for topic_filter, qos, sub_id in subscribe:
                ack = await self._request(proto, partial(_subscribe, topic_filter, qos, sub_id))
                assert isinstance(ack, SubAck)
                code = ack.reasons[0] if ack.reasons else 0x80
                if code >= 0x80:
                    self.refused[topic_filter] = f"reason 0x{code:02x}"
                    self.stats.errors += 1
                    log.warning(
                        "broker %s refused subscription %r: 0x%02x",
                        self.options.address,
                        topic_filter,
                        code,
                    )
                else:
                    self.granted[topic_filter] = (qos, sub_id)
            self._notify()

    async def _keepalive(self, proto: _Protocol) -> None:
        while True:
            await asyncio.sleep(self.keepalive_s / 2)
            if time.monotonic() - proto.last_received > 1.5 * self.keepalive_s:
                proto.fail(BrokerError(f"nothing from the broker in {1.5 * self.keepalive_s} s"))
                return
            if proto.transport is not None:
                proto.transport.write(PINGREQ)
