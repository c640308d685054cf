"""The broker pool: per broker, one subscribing and one publishing connection,
shared by every app on a peer.

Subscriptions go over :class:`~agiledart.runtime.mqtt.ingest.Ingest` (our own MQTT 5
reader, fast enough for a broker's bursts); publishing goes over ``aiomqtt``, and this
is the only module that imports it (and ``paho``): their errors end a connection's
session here, which logs them and reconnects; publishing reports which messages the
broker took instead of raising. Nothing escapes into the task group that owns the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import socket
from collections.abc import Callable, Sequence

import aiomqtt

from agiledart.app.errors import ExecutionError
from agiledart.runtime.errors import BrokerError
from agiledart.runtime.mqtt.core import Backoff, BrokerOptions, BrokerPoolStatistics, Deliver
from agiledart.runtime.mqtt.ingest import Ingest

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
#: Incoming messages waiting on a publishing connection, at most (it subscribes to
#: nothing, so none should come).
INBOX = 1000


class _Connection:
    """One publishing connection: its users and reconnecting task."""

    def __init__(self, pool: BrokerPool, options: BrokerOptions) -> None:
        self.pool = pool
        self.options = options
        self.tls = options.ssl_context(f"broker {options.address}")
        self.users = 0
        self.client: aiomqtt.Client | None = None
        self.connected = asyncio.Event()
        self.lost: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None

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
                    log.info("connected to MQTT broker %s (to publish)", self.options.address)
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
            max_queued_incoming_messages=INBOX,
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
        self.lost = asyncio.get_running_loop().create_future()
        self.connected.set()
        try:
            async for _ in client.messages:  # none are asked for; this ends with the session
                self.pool.stats.unrouted += 1
        finally:
            self.client = None
            self.connected.clear()
            self.lost.set_result(None)

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


class _Subscribing:
    """An :class:`~agiledart.runtime.mqtt.ingest.Ingest` with its users and its task."""

    def __init__(self, pool: BrokerPool, options: BrokerOptions) -> None:
        self.pool = pool
        self.options = options
        self.users = 0
        self.task: asyncio.Task[None] | None = None
        self.ingest = Ingest(
            options,
            client_id=lambda: f"{pool.client_id}-in-{pool.rng.getrandbits(48):012x}",
            keepalive_s=pool.keepalive_s,
            timeout_s=pool.timeout_s,
            stats=pool.stats,
        )

    async def run(self) -> None:
        """Run sessions, reconnecting with back-off, until cancelled."""
        attempt = 0
        sessions = 0
        st = self.pool.stats
        while True:
            try:
                if sessions:
                    st.reconnects += 1
                sessions += 1
                await self.ingest.session()
            except BrokerError as exc:  # the first failure in a row is news
                level = logging.WARNING if attempt == 0 else logging.DEBUG
                log.log(level, "MQTT broker %s: %s", self.options.address, exc)
            except Exception:  # a bug must not end the peer: log, count, retry
                st.errors += 1
                log.exception("MQTT connection to %s failed", self.options.address)
            if self.ingest.sessions_connected:
                attempt = 0
            delay = self.pool.backoff.delay(attempt, self.pool.rng)
            attempt += 1
            await asyncio.sleep(delay)


class Subscription:
    """One subscriber's interest in a topic filter; :meth:`close` ends it."""

    def __init__(self, sub: _Subscribing, topic_filter: str, key: int) -> None:
        self._sub: _Subscribing | None = sub
        self.topic_filter = topic_filter
        self._key = key

    @property
    def active(self) -> bool:
        """Whether the broker has acknowledged the filter on the current connection."""
        return self._sub is not None and self._sub.ingest.active(self.topic_filter)

    @property
    def refused(self) -> str | None:
        """The broker's reason, if it refused the filter."""
        return None if self._sub is None else self._sub.ingest.refused.get(self.topic_filter)

    def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is None:
            return
        ingest = sub.ingest
        ingest.watchers.pop(self._key, None)
        ingest.commits.pop(self._key, None)
        last = ingest.table.remove(self.topic_filter, self._key)
        if last:
            ingest.refused.pop(self.topic_filter, None)
        sub.pool._release_sub(sub)
        if last and sub.users:  # else the connection closes, and the filter with it
            ingest.changed.set()


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
    """A peer's MQTT connections, per broker one to subscribe and one to publish,
    shared by all its apps.

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
    ) -> None:
        self.client_id = client_id
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        self.keepalive_s = keepalive_s
        self.timeout_s = timeout_s
        self.stats = BrokerPoolStatistics()
        self._conns: dict[BrokerOptions, _Connection] = {}  #: publishing
        self._subs: dict[BrokerOptions, _Subscribing] = {}
        self._group: asyncio.TaskGroup | None = None
        self._closed = False

    def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        conns: list[_Connection | _Subscribing] = [*self._conns.values(), *self._subs.values()]
        for conn in conns:
            if conn.task is None:
                self._launch(conn)

    async def aclose(self) -> None:
        """Disconnect from every broker; the pool cannot be used again."""
        self._closed = True
        conns: list[_Connection | _Subscribing] = [*self._conns.values(), *self._subs.values()]
        self._conns, self._subs = {}, {}
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
        commit: Callable[[], None] | None = None,
    ) -> Subscription:
        """Have ``deliver(topic, payload)`` called for every message matching
        ``topic_filter`` (synchronously: it must not block); ``commit()`` after each
        read's messages are delivered, before the broker is acknowledged (it must make
        them durable); ``on_active`` hears when the broker has (or no longer has) the
        subscription."""
        sub = self._acquire_sub(broker)
        ingest = sub.ingest
        try:
            key = ingest.table.add(topic_filter, qos, deliver)
        except BaseException:
            self._release_sub(sub)
            raise
        if on_active is not None:
            ingest.watchers[key] = (topic_filter, on_active)
        if commit is not None:
            ingest.commits[key] = commit
        ingest.changed.set()
        return Subscription(sub, topic_filter, key)

    def lease(self, broker: BrokerOptions) -> BrokerLease:
        """A share of the connection to ``broker``, to publish on."""
        return BrokerLease(self._acquire(broker))

    def statistics(self) -> BrokerPoolStatistics:
        st = self.stats
        ingests = [s.ingest for s in self._subs.values()]
        st.connections = len(self._conns) + len(ingests)
        st.connected = sum(c.client is not None for c in self._conns.values()) + sum(
            i.connected for i in ingests
        )
        st.subscriptions = sum(len(i.granted) for i in ingests)
        st.subscribers = sum(len(i.table) for i in ingests)
        return dataclasses.replace(st)

    def _acquire_sub(self, broker: BrokerOptions) -> _Subscribing:
        if self._closed:
            msg = "the peer's broker pool is closed"
            raise ExecutionError(msg)
        sub = self._subs.get(broker)
        if sub is None:
            sub = self._subs[broker] = _Subscribing(self, broker)
            if self._group is not None:
                self._launch(sub)
        sub.users += 1
        return sub

    def _release_sub(self, sub: _Subscribing) -> None:
        sub.users -= 1
        if sub.users > 0 or self._subs.get(sub.options) is not sub:
            return
        del self._subs[sub.options]
        if sub.task is not None:
            sub.task.cancel()

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

    def _launch(self, conn: _Connection | _Subscribing) -> None:
        assert self._group is not None
        conn.task = self._group.create_task(conn.run(), name=f"mqtt {conn.options.address}")
