"""asyncio drivers for authenticated frames: :class:`FrameServer` and :class:`FrameClient`.

Thin shells around :class:`~.frames.FrameConnection` (trio's ``serve_listeners`` and
h11's example servers are the models). After the handshake both ends of a connection
are the same :class:`~.channel.Channel`: it multiplexes requests by id, answers requests with
the handlers registered by type, and feeds one-way messages, in order, to stream
handlers.

* Ownership: :meth:`FrameServer.start` runs the listener and one task per connection
  in the caller's :class:`asyncio.TaskGroup`; each connection task owns a nested group
  with one task per request in flight (at most ``max_concurrent_requests``: beyond that
  the connection stops reading, so TCP pushes back on the sender). A connection task
  never raises: bad input is counted by reason, logged at a bounded rate, and closes
  that connection only.
* Admission: a connection still in the handshake counts against a small budget of
  its own (``max_handshakes``, ``max_handshakes_per_address``), apart from proven
  sessions (``max_connections``); when that budget is full the oldest pending
  connection is shed, never the newcomer (``admission.py``), and one that has not
  proven the key within ``handshake_timeout_s`` is closed. A keyless flood of idle
  sockets therefore competes only with itself.
* Handler errors: an :class:`~agiledart.errors.AgiledartError` becomes the reply
  ``{"ok": False, "error": {"type": wire name, "message": str(exc), "fields": {...}}}``
  (:func:`~agiledart.errors.error_to_wire`); anything else is logged with its
  traceback and answered as ``InternalError``. The connection lives on. On the
  caller's side the reply raises the same class (:func:`~agiledart.errors.error_from_wire`)
  with ``remote_peer`` set; a name not known here raises :class:`RemoteError`, and an
  error whose fields do not fit its class :class:`MalformedError`. This is the one
  place where errors are translated between peers. A stream handler raising
  :class:`BadMessage` closes the connection (the sender broke the protocol and there is
  no reply to carry the error); other exceptions are logged and counted.
* Bytes: a small protocol class (:class:`~.channel.Stream`) hands received chunks to the
  connection task as they came from the socket (asyncio's StreamReader would copy each
  byte twice) and pauses reading while more than ``read_chunk`` bytes wait. Frames
  queued in one turn of the event loop leave in one ``write`` (at once when
  ``coalesce_bytes`` accumulate); senders wait while the transport holds more than
  ``write_buffer_high`` bytes. Memory per connection is bounded by these three limits
  and one frame.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self

from .admission import HandshakeAdmission
from .auth import ClusterKey
from .channel import (
    Channel,
    ConnectionInfo,
    ConnectionStats,
    FrameLimits,
    FrameStatistics,
    Handlers,
    HandshakeAborted,
    RequestHandler,
    Stream,
    StreamHandler,
    handshake,
)
from .errors import (
    BadMessage,
    ConfigError,
    KeyMismatch,
    OverlayError,
    PeerUnreachable,
    RemoteError,
)
from .frames import (
    FrameConnection,
    FrameStateError,
    Role,
    State,
    request_message,
)

log = logging.getLogger(__name__)

__all__ = [
    "ConnectionInfo",
    "FrameClient",
    "FrameLimits",
    "FrameServer",
    "FrameStatistics",
    "RemoteError",
    "RequestHandler",
    "StreamHandler",
]


# -- server ---------------------------------------------------------------------------


class FrameServer:
    """Accepts frame connections on ``PORT``/tcp and dispatches their messages.

    ``route(type, handler)`` answers requests, ``on_stream(type, handler)`` consumes
    one-way messages; register handlers before :meth:`start`. Runs in the caller's
    task group until :meth:`aclose` (or until the group is cancelled).
    """

    def __init__(
        self,
        *,
        key: ClusterKey,
        name: str,
        limits: FrameLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.key, self.name = key, name
        self.limits = limits or FrameLimits()
        self._rng = rng
        self._handlers = Handlers()
        self._stats = ConnectionStats(self.limits.log_interval_s, clock)
        self._group: asyncio.TaskGroup | None = None
        self._server: asyncio.Server | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._clock = clock
        self._admission: HandshakeAdmission[Stream] = HandshakeAdmission(
            max_pending=self.limits.max_handshakes,
            max_per_address=self.limits.max_handshakes_per_address,
        )
        self._sessions = 0
        self._next_id = 0
        self._closing = False
        self.address: tuple[str, int] | None = None

    def route(self, type: str, handler: RequestHandler) -> None:
        self._handlers.route(type, handler)

    def on_stream(self, type: str, handler: StreamHandler) -> None:
        self._handlers.on_stream(type, handler)

    async def start(
        self, group: asyncio.TaskGroup, host: str = "127.0.0.1", port: int = 0
    ) -> tuple[str, int]:
        """Listen on ``host:port`` (0: any free port); returns the bound address."""
        if self._server is not None:
            msg = "this FrameServer was already started"
            raise FrameStateError(msg)
        self._group = group
        try:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(
                lambda: Stream(self.limits.read_chunk, self._accept), host, port, backlog=512
            )
        except OSError as exc:
            msg = f"cannot listen on {host}:{port}/tcp: {exc.strerror or exc}"
            raise ConfigError(msg) from exc
        bound = self._server.sockets[0].getsockname()
        self.address = (str(bound[0]), int(bound[1]))
        name = f"frames-listener {self.address[1]}"
        self._serve_task = group.create_task(self._serve(), name=name)
        return self.address

    def statistics(self) -> FrameStatistics:
        return self._stats.snapshot(len(self._connections))

    async def aclose(self) -> None:
        """Stop listening, close every connection and wait for their tasks to end."""
        if self._closing or self._serve_task is None:
            return
        self._closing = True
        self._serve_task.cancel()
        await asyncio.wait([self._serve_task, *self._connections])

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _serve(self) -> None:
        assert self._server is not None
        try:
            await asyncio.Event().wait()  # until aclose() or the group is cancelled
        finally:
            self._closing = True
            self._server.close()
            for task in self._connections:
                task.cancel()

    def _accept(self, stream: Stream) -> None:
        if self._closing or self._group is None:
            stream.transport.abort()
            return
        for victim in self._admission.admit(stream, stream.address[0], self._clock()):
            # the newcomer is never refused: the oldest unproven connection makes room
            self._stats.events["shed_handshakes"] += 1
            victim.transport.abort()
        self._next_id += 1
        serve = self._connection(stream, self._next_id)
        try:
            task = self._group.create_task(serve, name=f"frames-connection {self._next_id}")
        except RuntimeError:  # the group is shutting down
            serve.close()
            self._admission.done(stream)
            stream.transport.abort()
            return
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _connection(self, stream: Stream, conn_id: int) -> None:
        limits, stats, address = self.limits, self._stats, stream.address
        conn = FrameConnection(
            role=Role.SERVER,
            key=self.key,
            name=self.name,
            max_frame=limits.max_frame,
            rng=self._rng,
        )
        stats.live.add(conn)
        session = refused = False
        try:
            try:
                async with asyncio.timeout(limits.handshake_timeout_s):
                    await handshake(conn, stream, lambda: self._admission.heard(stream))
            except TimeoutError:
                detail = f"no handshake within {limits.handshake_timeout_s} s"
                stats.reject("handshake_timeout", detail, address)
                return
            finally:
                self._admission.done(stream)
            if self._sessions >= limits.max_connections:
                detail = f"{limits.max_connections} sessions open"
                stats.reject("over_capacity", detail, address)
                return
            self._sessions += 1
            session = True
            stats.sessions += 1
            handlers = self._handlers
            channel = Channel(
                conn, stream, handlers=handlers, limits=limits, stats=stats, conn_id=conn_id
            )
            await channel.run()
        except HandshakeAborted:
            stats.events["aborted_handshakes"] += 1
        except BadMessage as exc:
            refused = isinstance(exc, KeyMismatch)  # the refusal must reach the client
            stats.reject(exc.reason, exc, address)
        except OSError:
            stats.events["connection_errors"] += 1
        except Exception:
            stats.events["internal_errors"] += 1
            log.exception("frame connection %d from %s failed", conn_id, address)
        finally:
            if session:
                self._sessions -= 1
            stats.retire(conn)
            if conn.state is State.BROKEN and not refused:
                stream.transport.abort()
            else:
                stream.transport.close()


# -- client ---------------------------------------------------------------------------


class FrameClient:
    """One authenticated connection to a peer's ``PORT``/tcp.

    ``async with await FrameClient.connect(host, port, key=key, name=name) as client``;
    ``await client.request(type, body, timeout=...)`` (any number concurrently) and
    ``await client.send(type, body)`` for one-way frames. The client reads in a task it
    owns from :meth:`connect` until :meth:`aclose`.
    """

    def __init__(self, channel: Channel, handlers: Handlers, stats: ConnectionStats) -> None:
        self._channel = channel
        self._handlers = handlers
        self._stats = stats
        self._task = asyncio.create_task(self._run(), name=f"frames-client {channel.info}")

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        key: ClusterKey,
        name: str,
        limits: FrameLimits | None = None,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> FrameClient:
        """Connect and complete the handshake within ``timeout`` seconds.

        Raises :class:`PeerUnreachable` (refused, timed out, closed) or
        :class:`BadMessage` (:class:`AuthError` when the peer has another cluster key).
        """
        limits = limits or FrameLimits()
        stats = ConnectionStats(limits.log_interval_s, clock)
        conn = FrameConnection(
            role=Role.CLIENT, key=key, name=name, max_frame=limits.max_frame, rng=rng
        )
        stream: Stream | None = None
        try:
            async with asyncio.timeout(timeout):
                _, stream = await asyncio.get_running_loop().create_connection(
                    lambda: Stream(limits.read_chunk), host, port
                )
                await handshake(conn, stream)
        except BaseException as exc:
            if stream is not None:
                stream.transport.abort()
            if isinstance(exc, TimeoutError):
                msg = f"no frame session with {host}:{port} within {timeout} s"
                raise PeerUnreachable(msg) from None
            if isinstance(exc, OSError | HandshakeAborted) and stream is not None:
                msg = f"{host}:{port} closed the connection during the handshake (overloaded?)"
                raise PeerUnreachable(msg) from None
            if isinstance(exc, OSError):
                msg = f"cannot connect to {host}:{port}: {exc.strerror or exc}"
                raise PeerUnreachable(msg) from None
            if isinstance(exc, KeyMismatch):
                msg = f"{host}:{port}: {exc}"
                raise KeyMismatch(msg) from None
            raise
        stats.live.add(conn)
        stats.sessions += 1
        handlers = Handlers()
        channel = Channel(conn, stream, handlers=handlers, limits=limits, stats=stats, conn_id=0)
        return cls(channel, handlers, stats)

    @property
    def peer_name(self) -> str:
        return self._channel.info.peer_name

    @property
    def closed(self) -> bool:
        return self._channel.closed

    def route(self, type: str, handler: RequestHandler) -> None:
        """Answer requests the server sends over this connection."""
        self._handlers.route(type, handler)

    def on_stream(self, type: str, handler: StreamHandler) -> None:
        """Consume one-way messages the server sends over this connection."""
        self._handlers.on_stream(type, handler)

    async def request(
        self,
        type: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """The peer's result; the error its handler raised (its own class) if it failed,
        :class:`PeerUnreachable` on timeout or a lost connection, :class:`BadMessage` if
        the peer broke the protocol."""
        return await self._channel.request(type, body, timeout)

    async def send(self, type: str, body: Mapping[str, Any] | None = None) -> None:
        """A one-way frame; waits while the connection's write buffer is full."""
        await self._channel.send_message(request_message(type, None, body))

    def statistics(self) -> FrameStatistics:
        return self._stats.snapshot(0 if self.closed else 1)

    async def aclose(self) -> None:
        """Close the connection (frames already sent still go out)."""
        if not self._channel.closed:
            self._channel.shutdown()
        self._task.cancel()
        await asyncio.wait([self._task])

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _run(self) -> None:
        channel, stats = self._channel, self._stats
        try:
            await channel.run()
        except BadMessage as exc:
            stats.reject(exc.reason, exc, channel.info)
        except OSError:
            stats.events["connection_errors"] += 1
        except Exception:
            stats.events["internal_errors"] += 1
            log.exception("frame client connection to %s failed", channel.info)
        finally:
            stats.retire(channel.conn)


async def key_differs_at(
    host: str, port: int, *, key: ClusterKey, name: str, timeout: float = 3.0
) -> KeyMismatch | None:
    """Whether the peer at ``host:port`` says our cluster key differs from its own (a
    handshake, nothing more): how a peer whose datagrams go unanswered tells a wrong
    key from a peer that is down."""
    try:
        client = await FrameClient.connect(host, port, key=key, name=name, timeout=timeout)
    except KeyMismatch as exc:
        return exc
    except OverlayError:
        return None
    await client.aclose()
    return None
