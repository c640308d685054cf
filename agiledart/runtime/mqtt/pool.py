"""The broker pool: per broker, one subscribing and one publishing connection,
shared by every app on a peer.

Subscriptions go to the broker's ingest process (:mod:`.subscriptions`,
:mod:`.worker`: our own MQTT 5 reader, fast enough for a broker's bursts); publishing
goes over ``aiomqtt``, and this is the only module that imports it (and ``paho``):
their errors end a connection's session here, which logs them and reconnects;
publishing reports which messages the broker took instead of raising. Nothing escapes
into the task group that owns the pool.

**Sessions that outlive the peer's processes.** With ``session_expiry_s`` (a peer's
pool sets it) the ingest process connects under a client id fixed by the pool's and
the broker's identity and resumes its session at the broker (clean start 0): what
matches our subscriptions while we are away (the peer restarting, the broker
restarting with persistence) is queued there and arrives when we are back.

**A durable QoS 1 subscription** (a checkpointed app's source) has a session of its own
instead (:func:`source_session`: its own ingest process, a client id fixed by app,
source and broker, the same on every peer) whose acknowledgements are held until a
committed epoch covers them (:mod:`.acks`): the broker keeps what the source has not
made safe, so the session follows the source to whichever peer runs it. Its log stays
under ``log_root`` for the app's next source on this peer (read on from a checkpoint;
a pool started on the directory leaves it for that source, removing logs untouched for
``linger_s``); detached between two generations it goes on logging, and one nobody
attaches within ``linger_s`` is closed and its log removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import random
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agiledart.app.errors import ExecutionError
from agiledart.app.topics import filter_problem
from agiledart.runtime.errors import BrokerError
from agiledart.runtime.mqtt.core import Backoff, BrokerOptions, BrokerPoolStatistics, Deliver
from agiledart.runtime.mqtt.subscriptions import (
    SUBSCRIPTION_FILE,
    Subscribing,
    Subscription,
    delivering,
)

log = logging.getLogger(__name__)
_client_log = logging.getLogger(f"{__name__}.client")

__all__ = [
    "ID_PROPERTY",
    "INBOX",
    "PUBLISH_WINDOW",
    "SESSION_EXPIRY_S",
    "BrokerLease",
    "BrokerPool",
    "BrokerPoolStatistics",
    "Subscription",
    "source_log_dir",
    "source_session",
]

#: The bound of a :meth:`BrokerPool.subscribe` subscriber's private log.
DELIVER_LOG_BYTES = 64 << 20
#: QoS 1 messages a sink has in flight (published, not yet acknowledged) at most.
PUBLISH_WINDOW = 64
#: The MQTT 5 user property naming a message's deterministic id (``<app>/<sink>/<epoch>/<n>``).
ID_PROPERTY = "agiledart-id"
#: Incoming messages waiting on a publishing connection, at most (it subscribes to
#: nothing, so none should come).
INBOX = 1000
#: A peer's MQTT session expiry interval (seconds): how long a broker keeps the
#: subscriptions of a peer that is away, and what matches them.
SESSION_EXPIRY_S = 3600
#: Under a pool's ``log_root``: durable logs (``apps/<app>/<source>``), and the logs of
#: sources that are not replayed, removed when a pool starts there.
APPS, ONCE = "apps", "once"
#: How long a detached durable subscription waits for its app's next source (seconds).
LINGER_S = 600.0


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
        #: why the broker is not connected now, and since when (wall-clock seconds)
        self.last_error: str | None = None
        self.down_since: float | None = time.time()

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
                    self.last_error, self.down_since = None, None
                    log.info("connected to MQTT broker %s (to publish)", self.options.address)
                    await self._session(client)
            except* aiomqtt.MqttError as eg:  # the first failure in a row is news
                level = logging.WARNING if attempt == 0 else logging.DEBUG
                log.log(level, "MQTT broker %s: %s", self.options.address, eg.exceptions[0])
                self._down(str(eg.exceptions[0]))
            except* Exception as eg:  # a bug must not end the peer: log, count, retry
                st.errors += 1
                log.error("MQTT connection to %s failed", self.options.address, exc_info=eg)
                self._down(f"{type(eg.exceptions[0]).__name__}: {eg.exceptions[0]}")
            delay = self.pool.backoff.delay(attempt, self.pool.rng)
            attempt += 1
            await asyncio.sleep(delay)

    def _down(self, error: str) -> None:
        self.last_error = error
        if self.down_since is None:
            self.down_since = time.time()

    def connection(self) -> dict[str, Any]:
        """As a source's: ``{"state": connected | retrying | connecting, "since",
        "last_error"}``."""
        if self.client is not None:
            return {"state": "connected", "since": None, "last_error": None}
        return {
            "state": "retrying" if self.last_error else "connecting",
            "since": self.down_since,
            "last_error": self.last_error,
        }

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

    async def publish_many(
        self, messages: Sequence[tuple[str, bytes]], qos: int, ids: Sequence[str] | None = None
    ) -> list[bool]:
        """Publish ``messages``; which of them the broker took (QoS 1: acknowledged)."""
        ok = [False] * len(messages)
        client, lost = self.client, self.lost
        if client is None or lost is None or lost.done():
            return ok
        send = self._send(client, messages, qos, ok, ids)
        work = asyncio.get_running_loop().create_task(send)
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
        ids: Sequence[str] | None,
    ) -> None:
        async def one(i: int) -> None:
            topic, payload = messages[i]
            props = None if ids is None else _with_id(ids[i])
            await client.publish(topic, payload, qos=qos, properties=props)
            ok[i] = True

        try:  # side by side: even a QoS 0 publish waits for the socket to take it
            async with asyncio.TaskGroup() as group:
                for i in range(len(messages)):
                    group.create_task(one(i))
        except* aiomqtt.MqttError as eg:
            log.debug("publish to %s failed: %s", self.options.address, eg.exceptions[0])


def _with_id(message_id: str) -> Properties:
    """A PUBLISH's properties: the message's id as the user property ``ID_PROPERTY``."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = (ID_PROPERTY, message_id)
    return props


class BrokerLease:
    """A share of one broker connection, for publishing; :meth:`close` gives it back."""

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self.options = conn.options
        self._closed = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.client is not None

    def connection(self) -> dict[str, Any]:
        """The broker connection this lease shares (see ``_Connection.connection``)."""
        if self._conn is None:
            return {"state": "closed", "since": None, "last_error": None}
        return self._conn.connection()

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

    async def publish_many(
        self, messages: Sequence[tuple[str, bytes]], qos: int, ids: Sequence[str] | None = None
    ) -> list[bool]:
        """Publish ``messages`` (topic, payload) with ``qos``, each with its id in
        ``ids`` (an MQTT 5 user property ``ID_PROPERTY``) if given; which went out.

        Never raises for broker trouble: what did not go out is False (retry it).
        """
        if self._conn is None:
            msg = f"the lease on {self.options.address} is closed"
            raise BrokerError(msg)
        return await self._conn.publish_many(messages, qos, ids)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._closed.set()
        if conn is not None:
            conn.pool._release(conn)


def _remove_unread(root: Path, linger_s: float) -> None:
    """Remove the logs under ``root`` no source will read: ``once/`` (and what older
    versions left), and sources' logs untouched for ``linger_s``; then the folders
    that are left empty."""
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if entry.name != APPS:
            shutil.rmtree(entry, ignore_errors=True)
    for directory in root.glob(f"{APPS}/*/*"):
        with contextlib.suppress(OSError):
            age = time.time() - directory.stat().st_mtime
            if age > linger_s:
                shutil.rmtree(directory, ignore_errors=True)
    for directory in [*root.glob(f"{APPS}/*"), root / APPS, root]:
        with contextlib.suppress(OSError):
            directory.rmdir()  # only if empty


def source_log_dir(root: Path, app_id: str | None, source_id: str) -> Path:
    """Where a source keeps its log under a pool's ``log_root``: the same directory for
    every generation of app ``app_id`` (a durable log), or, without an app, a new one
    (removed when a pool starts on ``root``)."""
    if app_id is None:
        return root / ONCE / f"{source_id}-{secrets.token_hex(6)}"
    return root / APPS / app_id / source_id


def source_session(log_dir: Path, broker: BrokerOptions) -> str:
    """The client id of a durable source's own broker session: fixed by its app and
    source (its log directory's last two names) and the broker, the same on every peer,
    so the peer a source moves to resumes the session the dead one had."""
    who = f"{log_dir.parent.name}\0{log_dir.name}\0{broker.address}\0{broker.username or ''}"
    return f"agiledart-src-{hashlib.sha256(who.encode()).hexdigest()[:16]}"


class Tracer(Protocol):
    """Where trace records go (a peer's trace writer)."""

    def emit(self, type: str, **fields: Any) -> None: ...


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
        trace: Tracer | None = None,
        session_expiry_s: int = 0,
        log_root: Path | None = None,
        linger_s: float = LINGER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client_id = client_id
        #: 0: a clean session per connection; above, a persistent one (module docstring)
        self.session_expiry_s = session_expiry_s
        self.log_root = log_root  #: where durable subscriptions' logs are found again
        self.linger_s = linger_s  #: how long a detached subscription waits for its source
        self.clock = clock
        self.trace = trace  #: where sources write their ``ingest`` trace records
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        self.keepalive_s = keepalive_s
        self.timeout_s = timeout_s
        self.stats = BrokerPoolStatistics()
        self._conns: dict[BrokerOptions, _Connection] = {}  #: publishing
        #: ingest processes: per broker, and per durable source's own session
        self._subs: dict[tuple[BrokerOptions, str | None], Subscribing] = {}
        self._ended: list[Subscribing] = []
        self._next_key = 0
        self._group: asyncio.TaskGroup | None = None
        self._closed = False
        self._durable: dict[Path, Subscription] = {}  #: by log directory
        self._sweeper: asyncio.Task[None] | None = None

    def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        self._adopt()
        conns: list[_Connection | Subscribing] = [*self._conns.values(), *self._subs.values()]
        for conn in conns:
            if conn.task is None:
                self._launch(conn)
        self._sweeper = group.create_task(self._sweep(), name="mqtt detached logs")

    def ingest_client_id(self, broker: BrokerOptions) -> str:
        """The ingest connection's client id: fixed per pool and broker when sessions
        persist (the broker finds our session again), else a new one per process."""
        if not self.session_expiry_s:
            return f"{self.client_id}-in-{self.rng.getrandbits(48):012x}"
        who = f"{broker.address}\0{broker.username or ''}".encode()
        return f"{self.client_id}-in-{hashlib.sha256(who).hexdigest()[:8]}"

    async def aclose(self) -> None:
        """Disconnect from every broker; the pool cannot be used again."""
        self._closed = True
        conns: list[_Connection | Subscribing] = [*self._conns.values(), *self._subs.values()]
        self._conns, self._subs = {}, {}
        tasks = [c.task for c in conns if c.task is not None]
        if self._sweeper is not None:
            tasks.append(self._sweeper)
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
        ``topic_filter``, once it is in a private log (see :meth:`subscribe_log`);
        ``on_active`` hears when the broker has (or no longer has) the subscription."""
        directory, bind = delivering(deliver, self.stats)
        sub = self.subscribe_log(
            broker,
            topic_filter,
            qos=qos,
            log_dir=directory,
            max_bytes=DELIVER_LOG_BYTES,
            on_commit=lambda: None,
            on_active=on_active,
        )
        sub.on_commit = bind(sub)
        return sub

    def subscribe_log(
        self,
        broker: BrokerOptions,
        topic_filter: str,
        *,
        qos: int,
        log_dir: Path,
        max_bytes: int,
        limit: int | None = None,
        on_commit: Callable[[], None],
        on_active: Callable[[bool], None] | None = None,
        durable: bool = False,
        start: int = 0,
        seed: list[Any] | None = None,
    ) -> Subscription:
        """Have the broker's messages on ``topic_filter`` written to a log in
        ``log_dir`` by the broker's ingest process (QoS 1: acknowledged once written),
        holding at most ``max_bytes`` and ``limit`` unread messages (then shed);
        ``on_commit()`` says more is committed: read it with the subscription's
        ``reader`` (from position ``start``) and say how far with ``read_to``.

        ``durable``: the log is continued if ``log_dir`` holds one (a subscription
        detached there is attached again), written down to be taken up again by a
        pool started on ``log_root``, and detached rather than ended by
        :meth:`detach`; with QoS 1 it has a broker session of its own (:func:`source_session`),
        whatever peer runs it, its acknowledgements held until positions are done
        (:mod:`.acks`; ``seed``: the packet ids its checkpoint recorded)."""
        old = self._durable.pop(log_dir, None)
        if old is not None and old._owner is not None:
            want = (broker, topic_filter, qos, max_bytes, limit)
            if (old._owner.options, old.topic_filter, old.qos, old.max_bytes, old.limit) == want:
                self._durable[log_dir] = old
                old.attach(start, on_commit=on_commit, on_active=on_active)
                return old
            old.close(remove=False)  # another subscription in this directory: the log stays
        bad = filter_problem(topic_filter)
        if bad is not None:
            msg = f"bad topic filter {topic_filter!r}: {bad}"
            raise ExecutionError(msg)
        if qos not in (0, 1):
            msg = f"qos must be 0 or 1, got {qos!r}"
            raise ExecutionError(msg)
        # QoS 0: the broker neither keeps nor redelivers; the peer's connection does
        session = source_session(log_dir, broker) if durable and qos == 1 else None
        owner = self._acquire_sub(broker, session)
        self._next_key += 1
        sub = Subscription(
            owner,
            self._next_key,
            topic_filter,
            qos=qos,
            log_dir=log_dir,
            max_bytes=max_bytes,
            limit=limit,
            on_commit=on_commit,
            on_active=on_active,
            start=start,
            seed=seed,
        )
        if durable:
            self._durable[log_dir] = sub
            self._write_down(sub, broker)
        owner.add(sub)
        return sub

    def detach(self, sub: Subscription, attachment: int) -> None:
        """Its source stopped without ending: a durable subscription goes on logging
        (for ``linger_s``, or until a source attaches); another one is closed. Nothing
        happens when a newer source attached since (``attachment`` is not its last)."""
        if sub.attachments != attachment:
            return
        if self._durable.get(sub.reader.directory) is sub and sub._owner is not None:
            sub.detach(self.clock())
        else:
            sub.close()

    def _write_down(self, sub: Subscription, broker: BrokerOptions) -> None:
        what = {
            "broker": {**dataclasses.asdict(broker), "password": None},
            "password": broker.password is not None,  # not on disk: not taken up again
            "filter": sub.topic_filter,
            "qos": sub.qos,
            "max_bytes": sub.max_bytes,
            "limit": sub.limit,
        }
        try:
            path = sub.reader.directory / SUBSCRIPTION_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(what))
        except OSError as exc:  # it still works; a restart will not take it up
            log.warning("cannot write down the subscription in %s: %s", path.parent, exc)

    def _adopt(self) -> None:
        """Remove the logs under ``log_root`` no source will read (``once/``, and
        sources' logs untouched for ``linger_s``). A durable log is not taken up before
        its source comes back: its broker session (the source's own, :mod:`.acks`)
        holds every message not yet covered by a committed epoch, and a source that
        moved to another peer meanwhile has that session now."""
        root = self.log_root
        if root is None or self._closed:
            return
        _remove_unread(root, self.linger_s)

    async def _sweep(self) -> None:
        """Close the detached subscriptions nobody attached within ``linger_s``."""
        while True:
            await asyncio.sleep(min(10.0, max(0.1, self.linger_s / 2)))
            now = self.clock()
            for directory, sub in list(self._durable.items()):
                if sub._owner is None:
                    del self._durable[directory]
                elif sub.detached_at is not None and now - sub.detached_at >= self.linger_s:
                    log.info("no source came back for the MQTT log in %s: removed", directory)
                    del self._durable[directory]
                    sub.close()

    def lease(self, broker: BrokerOptions) -> BrokerLease:
        """A share of the connection to ``broker``, to publish on."""
        return BrokerLease(self._acquire(broker))

    def statistics(self) -> BrokerPoolStatistics:
        st = dataclasses.replace(self.stats)
        subs = [*self._subs.values(), *self._ended]
        for name in ("connects", "reconnects", "messages_in", "unrouted", "errors"):
            setattr(st, name, getattr(st, name) + sum(s.counters()[name] for s in subs))
        live = self._subs.values()
        st.connections = len(self._conns) + len(live)
        st.connected = sum(c.client is not None for c in self._conns.values())
        st.connected += sum(s.connected for s in live)
        st.subscriptions = sum(s.subscriptions for s in live)
        st.subscribers = sum(len(s.subs) for s in live)
        return st

    def _acquire_sub(self, broker: BrokerOptions, session: str | None = None) -> Subscribing:
        if self._closed:
            msg = "the peer's broker pool is closed"
            raise ExecutionError(msg)
        sub = self._subs.get((broker, session))
        if sub is None:
            broker.ssl_context(f"broker {broker.address}")  # a bad CA file fails here
            sub = self._subs[broker, session] = Subscribing(self, broker, session)
            if self._group is not None:
                self._launch(sub)
        return sub

    def _release_sub(self, sub: Subscribing) -> None:
        if sub.subs or self._subs.get((sub.options, sub.session)) is not sub:
            return
        del self._subs[sub.options, sub.session]
        self._ended.append(sub)  # its counters still count
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

    def _launch(self, conn: _Connection | Subscribing) -> None:
        assert self._group is not None
        conn.task = self._group.create_task(conn.run(), name=f"mqtt {conn.options.address}")
