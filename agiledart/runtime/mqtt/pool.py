"""The broker pool: one MQTT connection per broker, shared by every app on a peer.

The only module that imports ``aiomqtt`` (and ``paho``): their errors end a
connection's session here, which logs them and reconnects; publishing reports which
messages the broker took instead of raising. Nothing escapes into the task group
that owns the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from agiledart.app.errors import ExecutionError
from agiledart.runtime.errors import BrokerError
from agiledart.runtime.mqtt.core import (
    Backoff,
    BrokerOptions,
    Deliver,
    SubscriptionTable,
    plan,
)

log = logging.getLogger(__name__)
_client_log = logging.getLogger(f"{__name__}.client")

__all__ = [
    "INBOX",
    "PUBLISH_WINDOW",
    "BrokerLease",
    "BrokerPool",
    "BrokerPoolStatistics",
    "Subscription",
]

#: QoS 1 messages a sink has in flight (published, not yet acknowledged) at most.
PUBLISH_WINDOW = 64
#: Incoming messages waiting for dispatch on one connection, at most (then dropped).
INBOX = 100_000


@dataclass(slots=True)
class BrokerPoolStatistics:
    """What a pool has done (a peer reports it in ``ring``)."""

    connections: int = 0  #: broker connections in use (one per broker and credentials)
    connected: int = 0  #: of them, connected now
    connects: int = 0  #: successful connects so far
    reconnects: int = 0  #: connects after a connection was lost
    subscriptions: int = 0  #: topic filters held at brokers (one however many sources)
    subscribers: int = 0  #: sources subscribed through the pool
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0  #: incoming messages dropped: a connection's inbox was full
    unrouted: int = 0  #: incoming messages no subscriber wanted (any more)
    errors: int = 0  #: refused subscriptions, failed publishes, unexpected errors


class _Connection:
    """One broker connection: its users, subscriptions and reconnecting task."""

    def __init__(self, pool: BrokerPool, options: BrokerOptions) -> None:
        self.pool = pool
        self.options = options
        self.tls = options.ssl_context(f"broker {options.address}")
        self.table = SubscriptionTable()
        self.granted: dict[str, tuple[int, int]] = {}
        self.refused: dict[str, str] = {}
        self.users = 0
        self.client: aiomqtt.Client | None = None
        self.connected = asyncio.Event()
        self.lost: asyncio.Future[None] | None = None
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        #: subscriber key -> (its filter, what to tell when the broker has it or not)
        self.watchers: dict[int, tuple[str, Callable[[bool], None]]] = {}

    def active(self, topic_filter: str) -> bool:
        return self.client is not None and topic_filter in self.granted

    def _notify(self) -> None:
        for topic_filter, watch in list(self.watchers.values()):
            watch(self.active(topic_filter))

    async def run(self) -> None:
        """Connect, serve, and reconnect with back-off, until cancelled."""
        attempt = 0
        sessions = 0
        st = self.pool.stats
        while True:
            try:
                async with self._client() as client:
                    st.connects += 1
                    if sessions:
                        st.reconnects += 1
                    sessions += 1
                    attempt = 0
                    log.info("connected to MQTT broker %s", self.options.address)
                    await self._session(client)
            except* aiomqtt.MqttError as eg:  # the first failure in a row is news
                level = logging.WARNING if attempt == 0 else logging.DEBUG
                log.log(level, "MQTT broker %s: %s", self.options.address, eg.exceptions[0])
            except* Exception as eg:  # a bug must not end the peer: log, count, retry
                st.errors += 1
                log.error("MQTT connection to %s failed", self.options.address, exc_info=eg)
            delay = self.pool.backoff.delay(attempt, self.pool.rng)
            attempt += 1
            await asyncio.sleep(delay)

    def _client(self) -> aiomqtt.Client:
        pool = self.pool

        class Inbox(asyncio.Queue[aiomqtt.Message]):
            """aiomqtt's message queue, counting what it drops when full."""

            def put_nowait(self, item: aiomqtt.Message) -> None:
                if self.full():
                    pool.stats.dropped += 1
                    return
                super().put_nowait(item)

        client = aiomqtt.Client(
            self.options.host,
            self.options.port,
            username=self.options.username,
            password=self.options.password,
            identifier=f"{pool.client_id}-{pool.rng.getrandbits(48):012x}",
            protocol=aiomqtt.ProtocolVersion.V5,
            queue_type=Inbox,
            max_queued_incoming_messages=pool.inbox,
            keepalive=pool.keepalive_s,
            timeout=pool.timeout_s,
            tls_context=self.tls,
            max_inflight_messages=PUBLISH_WINDOW,
            # small messages, answered one by one: Nagle would hold each for an ACK
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
            logger=_client_log,
        )
        client.pending_calls_threshold = 4 * PUBLISH_WINDOW  # we bound them ourselves
        return client

    async def _session(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.granted = {}
        self.refused = {}
        self.lost = asyncio.get_running_loop().create_future()
        self.connected.set()
        self.changed.set()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._read(client))
                group.create_task(self._reconcile(client))
        finally:
            self.client = None
            self.granted = {}
            self.connected.clear()
            self.lost.set_result(None)
            self._notify()

    async def _read(self, client: aiomqtt.Client) -> None:
        st = self.pool.stats
        async for message in client.messages:
            st.messages_in += 1
            payload = bytes(message.payload)
            ids = getattr(message.properties, "SubscriptionIdentifier", None)
            topic = message.topic.value
            targets = self.table.route(topic, ids if isinstance(ids, list) else None)
            if not targets:
                st.unrouted += 1
            for deliver in targets:
                try:
                    deliver(topic, payload)
                except Exception:  # one bad subscriber must not stop the others
                    st.errors += 1
                    log.exception("an MQTT subscriber failed on a message from %s", topic)

    async def _reconcile(self, client: aiomqtt.Client) -> None:
        """Keep the broker's subscriptions equal to the table's, as it changes."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            subscribe, unsubscribe = plan(self.table.wanted(), self.granted, self.refused)
            for topic_filter in unsubscribe:
                await client.unsubscribe(topic_filter)
                del self.granted[topic_filter]
            for topic_filter, qos, sub_id in subscribe:
                props = Properties(PacketTypes.SUBSCRIBE)  # type: ignore[no-untyped-call]
                props.SubscriptionIdentifier = sub_id
                codes = await client.subscribe(
                    topic_filter, options=SubscribeOptions(qos=qos), properties=props
                )
                code = codes[0]
                failed = code >= 0x80 if isinstance(code, int) else code.is_failure
                if failed:
                    self.refused[topic_filter] = str(code)
                    self.pool.stats.errors += 1
                    log.warning(
                        "broker %s refused subscription %r: %s",
                        self.options.address,
                        topic_filter,
                        code,
                    )
                else:
                    self.granted[topic_filter] = (qos, sub_id)
            self._notify()

    async def publish_many(self, messages: Sequence[tuple[str, bytes]], qos: int) -> list[bool]:
        """Publish ``messages``; which of them the broker took (QoS 1: acknowledged)."""
        ok = [False] * len(messages)
        client, lost = self.client, self.lost
        if client is None or lost is None or lost.done():
            return ok
        work = asyncio.get_running_loop().create_task(self._send(client, messages, qos, ok))
        try:
            await asyncio.wait((work, lost), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
        sent = sum(ok)
        self.pool.stats.messages_out += sent
        if sent < len(messages):
            self.pool.stats.errors += 1
        return ok

    async def _send(
        self,
        client: aiomqtt.Client,
        messages: Sequence[tuple[str, bytes]],
        qos: int,
        ok: list[bool],
    ) -> None:
        async def one(i: int) -> None:
            topic, payload = messages[i]
            await client.publish(topic, payload, qos=qos)
            ok[i] = True

        try:  # side by side: even a QoS 0 publish waits for the socket to take it
            async with asyncio.TaskGroup() as group:
                for i in range(len(messages)):
                    group.create_task(one(i))
        except* aiomqtt.MqttError as eg:
            log.debug("publish to %s failed: %s", self.options.address, eg.exceptions[0])


class Subscription:
    """One subscriber's interest in a topic filter; :meth:`close` ends it."""

    def __init__(self, conn: _Connection, topic_filter: str, key: int) -> None:
        self._conn: _Connection | None = conn
        self.topic_filter = topic_filter
        self._key = key

    @property
    def active(self) -> bool:
        """Whether the broker has acknowledged the filter on the current connection."""
        return self._conn is not None and self._conn.active(self.topic_filter)

    @property
    def refused(self) -> str | None:
        """The broker's reason, if it refused the filter."""
        return None if self._conn is None else self._conn.refused.get(self.topic_filter)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.watchers.pop(self._key, None)
        last = conn.table.remove(self.topic_filter, self._key)
        if last:
            conn.refused.pop(self.topic_filter, None)
        conn.pool._release(conn)
        if last and conn.users:  # else the connection closes, and the filter with it
            conn.changed.set()


class BrokerLease:
    """A share of one broker connection, for publishing; :meth:`close` gives it back."""

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self.options = conn.options
        self._closed = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.client is not None

    async def wait_connected(self) -> bool:
        """Wait until the broker is connected (True) or the lease is closed (False)."""
        conn = self._conn
        if conn is None:
            return False
        if conn.connected.is_set():
            return True
        waits = [
            asyncio.ensure_future(conn.connected.wait()),
            asyncio.ensure_future(self._closed.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return self.connected

    async def publish_many(self, messages: Sequence[tuple[str, bytes]], qos: int) -> list[bool]:
        """Publish ``messages`` (topic, payload) with ``qos``; which of them went out.

        Never raises for broker trouble: what did not go out is False (retry it).
        """
        if self._conn is None:
            msg = f"the lease on {self.options.address} is closed"
            raise BrokerError(msg)
        return await self._conn.publish_many(messages, qos)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._closed.set()
        if conn is not None:
            conn.pool._release(conn)


class BrokerPool:
    """A peer's MQTT connections, one per broker, shared by all its apps.

    ``start(group)`` runs the connections in the caller's task group; :meth:`aclose`
    ends them. Subscribing or leasing before ``start`` is fine: connecting begins then.
    """

    def __init__(
        self,
        *,
        client_id: str = "agiledart",
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        keepalive_s: int = 30,
        timeout_s: float = 10.0,
        inbox: int = INBOX,
    ) -> None:
        self.client_id = client_id
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        self.keepalive_s = keepalive_s
        self.timeout_s = timeout_s
        self.inbox = inbox
        self.stats = BrokerPoolStatistics()
        self._conns: dict[BrokerOptions, _Connection] = {}
        self._group: asyncio.TaskGroup | None = None
        self._closed = False

    def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        for conn in self._conns.values():
            if conn.task is None:
                self._launch(conn)

    async def aclose(self) -> None:
        """Disconnect from every broker; the pool cannot be used again."""
        self._closed = True
        conns, self._conns = list(self._conns.values()), {}
        tasks = [c.task for c in conns if c.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def subscribe(
        self,
        broker: BrokerOptions,
        topic_filter: str,
        deliver: Deliver,
        *,
        qos: int = 0,
        on_active: Callable[[bool], None] | None = None,
    ) -> Subscription:
        """Have ``deliver(topic, payload)`` called for every message matching
        ``topic_filter`` (synchronously: it must not block); ``on_active`` hears when
        the broker has (or no longer has) the subscription."""
        conn = self._acquire(broker)
        try:
            key = conn.table.add(topic_filter, qos, deliver)
        except BaseException:
            self._release(conn)
            raise
        if on_active is not None:
            conn.watchers[key] = (topic_filter, on_active)
        conn.changed.set()
        return Subscription(conn, topic_filter, key)

    def lease(self, broker: BrokerOptions) -> BrokerLease:
        """A share of the connection to ``broker``, to publish on."""
        return BrokerLease(self._acquire(broker))

    def statistics(self) -> BrokerPoolStatistics:
        st = self.stats
        st.connections = len(self._conns)
        st.connected = sum(c.client is not None for c in self._conns.values())
        st.subscriptions = sum(len(c.granted) for c in self._conns.values())
        st.subscribers = sum(len(c.table) for c in self._conns.values())
        return dataclasses.replace(st)

    def _acquire(self, broker: BrokerOptions) -> _Connection:
        if self._closed:
            msg = "the peer's broker pool is closed"
            raise ExecutionError(msg)
        conn = self._conns.get(broker)
        if conn is None:
            conn = self._conns[broker] = _Connection(self, broker)
            if self._group is not None:
                self._launch(conn)
        conn.users += 1
        return conn

    def _release(self, conn: _Connection) -> None:
        conn.users -= 1
        if conn.users > 0 or self._conns.get(conn.options) is not conn:
            return
        del self._conns[conn.options]
        if conn.task is not None:
            conn.task.cancel()

    def _launch(self, conn: _Connection) -> None:
        assert self._group is not None
        conn.task = self._group.create_task(conn.run(), name=f"mqtt {conn.options.address}")
