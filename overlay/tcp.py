"""asyncio drivers for authenticated frames: :class:`FrameServer` and :class:`FrameClient`.

Thin shells around :class:`~.frames.FrameConnection` (trio's ``serve_listeners`` and
h11's example servers are the models). After the handshake both ends of a connection
are the same :class:`_Channel`: it multiplexes requests by id, answers requests with
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
* Bytes: a small protocol class (:class:`_Stream`) hands received chunks to the
  connection task as they came from the socket (asyncio's StreamReader would copy each
  byte twice) and pauses reading while more than ``read_chunk`` bytes wait. Frames
  queued in one turn of the event loop leave in one ``write`` (at once when
  ``coalesce_bytes`` accumulate); senders wait while the transport holds more than
  ``write_buffer_high`` bytes. Memory per connection is bounded by these three limits
  and one frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, cast

from agiledart.errors import AgiledartError, error_from_wire, error_to_wire

from .admission import HandshakeAdmission
from .auth import ClusterKey
from .errors import (
    BadMessage,
    ConfigError,
    KeyMismatch,
    MalformedError,
    OverlayError,
    OversizeError,
    PeerUnreachable,
    RemoteError,
    UnknownRequest,
)
from .frames import (
    DEFAULT_MAX_FRAME,
    NEED_DATA,
    ConnectionClosed,
    FrameConnection,
    FrameStateError,
    HandshakeComplete,
    OneWay,
    Reply,
    Request,
    Role,
    State,
    error_reply,
    ok_reply,
    request_message,
)

log = logging.getLogger(__name__)

RequestHandler = Callable[[dict[str, Any], "ConnectionInfo"], Awaitable[Any]]
StreamHandler = Callable[[dict[str, Any], "ConnectionInfo"], Awaitable[None]]

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


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameLimits:
    max_frame: int = DEFAULT_MAX_FRAME  #: largest frame body accepted or sent, bytes
    max_connections: int = 1024  #: server: proven sessions open at once
    max_handshakes: int = 256  #: server: connections still in the handshake (oldest shed)
    max_handshakes_per_address: int = 8  #: server: of those, from one source address
    handshake_timeout_s: float = 3.0  #: server: a connection must prove the key by then
    max_concurrent_requests: int = 64  #: request handlers in flight per connection
    read_chunk: int = 256 * 1024  #: reading pauses while this much waits to be parsed
    coalesce_bytes: int = 64 * 1024  #: queued frames are written at once beyond this
    write_buffer_high: int = 1024 * 1024  #: senders wait in drain() above this
    log_interval_s: float = 10.0  #: at most one log line per kind of rejection per interval

    def __post_init__(self) -> None:
        sizes = (
            self.max_frame,
            self.max_connections,
            self.max_handshakes,
            self.max_handshakes_per_address,
            self.max_concurrent_requests,
        )
        if min(sizes) < 1 or min(self.read_chunk, self.coalesce_bytes) < 1:
            msg = "frame limits must be positive"
            raise ValueError(msg)
        if self.handshake_timeout_s <= 0 or self.write_buffer_high < 1:
            msg = "handshake_timeout_s and write_buffer_high must be positive"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class FrameStatistics:
    open_connections: int
    sessions: int  #: handshakes completed
    frames_in: int
    frames_out: int
    bytes_in: int  #: on the wire, handshakes and headers included
    bytes_out: int
    rejected: dict[str, int]  #: connections closed for bad input, by reason
    events: dict[str, int]  #: everything else worth counting, by name


class _Stats:
    """Counters shared by a server (or client) and its connections."""

    def __init__(self, log_interval_s: float, clock: Callable[[], float]) -> None:
        self.live: set[FrameConnection] = set()
        self.totals = [0, 0, 0, 0]  # frames in, frames out, bytes in, bytes out
        self.sessions = 0
        self.rejected: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self._interval = log_interval_s
        self._clock = clock
        self._last_log: dict[str, float] = {}

    def retire(self, conn: FrameConnection) -> None:
        if conn in self.live:
            self.live.remove(conn)
            for i, n in enumerate((conn.frames_in, conn.frames_out, conn.bytes_in, conn.bytes_out)):
                self.totals[i] += n

    def reject(self, reason: str, detail: object, peer: object) -> None:
        self.rejected[reason] += 1
        if self._due(reason):
            total = self.rejected[reason]
            log.warning(
                "closed frame connection %s: %s (%s, %d so far)", peer, detail, reason, total
            )

    def trouble(self, event: str, detail: str, *args: object) -> None:
        """Count an event and log it, with the current traceback, at a bounded rate."""
        self.events[event] += 1
        if self._due(event):
            log.warning(detail + " (%d so far)", *args, self.events[event], exc_info=True)

    def _due(self, key: str) -> bool:
        now = self._clock()
        if now - self._last_log.get(key, -1e18) < self._interval:
            return False
        self._last_log[key] = now
        return True

    def snapshot(self, open_connections: int) -> FrameStatistics:
        counts = list(self.totals)
        for c in self.live:
            for i, n in enumerate((c.frames_in, c.frames_out, c.bytes_in, c.bytes_out)):
                counts[i] += n
        frames_in, frames_out, bytes_in, bytes_out = counts
        return FrameStatistics(
            open_connections=open_connections,
            sessions=self.sessions,
            frames_in=frames_in,
            frames_out=frames_out,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            rejected=dict(self.rejected),
            events=dict(self.events),
        )


@dataclass(slots=True)
class _Handlers:
    routes: dict[str, RequestHandler] = field(default_factory=dict)
    streams: dict[str, StreamHandler] = field(default_factory=dict)

    def route(self, type: str, handler: RequestHandler) -> None:
        self.routes[type] = handler

    def on_stream(self, type: str, handler: StreamHandler) -> None:
        self.streams[type] = handler


class ConnectionInfo:
    """The authenticated peer at the other end of one connection, as handlers see it."""

    __slots__ = ("_channel", "address", "id", "peer_name")

    def __init__(self, channel: _Channel, peer_name: str, address: tuple[str, int], id: int):
        self._channel = channel
        self.peer_name = peer_name  #: the name it gave in the handshake; it holds the key
        self.address = address
        self.id = id

    async def send(self, type: str, body: Mapping[str, Any] | None = None) -> None:
        """A one-way frame back over this connection (credits, acks)."""
        await self._channel.send_message(request_message(type, None, body))

    async def request(
        self,
        type: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        return await self._channel.request(type, body, timeout)

    def __repr__(self) -> str:
        return f"<connection {self.id} {self.peer_name!r} {self.address[0]}:{self.address[1]}>"


class _Aborted(OverlayError):
    """The peer closed the connection before the handshake completed."""


class _Stream(asyncio.Protocol):
    """The bytes of one TCP connection for the task that serves it: asyncio's
    StreamReader/StreamWriter pair without the two copies of every received byte."""

    def __init__(self, limit: int, on_open: Callable[[_Stream], None] | None = None) -> None:
        self.transport: asyncio.Transport
        self.address = ("?", 0)
        self._limit = limit  # pause reading while more than this waits for the task
        self._on_open = on_open
        self._loop = asyncio.get_running_loop()
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._error: Exception | None = None
        self._reading_paused = self._writing_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._drainers: list[asyncio.Future[None]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.address = (str(peer[0]), int(peer[1]))
        if self._on_open is not None:
            self._on_open(self)

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > self._limit and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> None:
        self._eof = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()
        for drainer in self._drainers:
            if not drainer.done():
                drainer.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for drainer in self._drainers:
            if not drainer.done():
                drainer.set_result(None)
        self._drainers.clear()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def receive(self) -> list[bytes]:
        """The chunks received since the last call; ``[]`` at EOF; OSError if it broke."""
        if not self._chunks and not self._eof:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks, self._chunks, self._size = self._chunks, [], 0
        if self._reading_paused and not self._eof:
            self._reading_paused = False
            self.transport.resume_reading()
        if not chunks and self._error is not None:
            raise self._error
        return chunks

    async def drain(self) -> None:
        """Wait while the transport holds more than its high-water mark."""
        while self._writing_paused and not self._eof:
            drainer = self._loop.create_future()
            self._drainers.append(drainer)
            await drainer
        if self._eof and self.transport.is_closing():
            msg = "connection lost while sending"
            raise ConnectionResetError(msg)


async def _handshake(
    conn: FrameConnection, stream: _Stream, on_data: Callable[[], None] | None = None
) -> str:
    while True:
        try:
            event = conn.next_event()
        finally:  # a refusal goes out even when the handshake fails
            if out := conn.data_to_send():
                stream.transport.write(out)
        if event is NEED_DATA:
            chunks = await stream.receive()
            if on_data is not None and chunks:
                on_data()
            for chunk in chunks:
                conn.receive_data(chunk)
            if not chunks:
                conn.receive_data(b"")
        elif isinstance(event, HandshakeComplete):
            return event.peer_name
        else:  # only ConnectionClosed can come before the handshake completes
            raise _Aborted


class _Channel:
    """One open session: multiplexed requests, replies, one-way messages, write coalescing."""

    def __init__(
        self,
        conn: FrameConnection,
        stream: _Stream,
        *,
        handlers: _Handlers,
        limits: FrameLimits,
        stats: _Stats,
        conn_id: int,
    ) -> None:
        assert conn.peer_name is not None
        self.conn = conn
        self.info = ConnectionInfo(self, conn.peer_name, stream.address, conn_id)
        self._stream, self._transport = stream, stream.transport
        self._handlers, self._limits, self._stats = handlers, limits, stats
        self._loop = asyncio.get_running_loop()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_scheduled = False
        self._failure: OverlayError | None = None
        self._slots = asyncio.Semaphore(limits.max_concurrent_requests)
        self._requests: set[asyncio.Task[None]] = set()
        self._transport.set_write_buffer_limits(high=limits.write_buffer_high)

    @property
    def closed(self) -> bool:
        return self._failure is not None

    def _closed_error(self) -> OverlayError:
        if self._failure is not None:
            return _fresh(self._failure)
        return PeerUnreachable(f"connection to {self.info.peer_name} closed")

    # -- sending ---------------------------------------------------------------------

    async def send_message(self, message: Mapping[str, Any]) -> None:
        if self.conn.state is not State.OPEN:
            raise self._closed_error()
        self._write(self.conn.send(message))
        if self._transport.get_write_buffer_size() > self._limits.write_buffer_high:
            try:
                await self._stream.drain()
            except ConnectionError as exc:
                msg = f"connection to {self.info.peer_name} lost: {exc}"
                raise PeerUnreachable(msg) from None

    async def request(
        self,
        type: str,
        body: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> Any:
        rid = self._next_id
        self._next_id += 1
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[rid] = future
        try:
            async with asyncio.timeout(timeout):
                await self.send_message(request_message(type, rid, body))
                return await future
        except TimeoutError:
            msg = f"{self.info.peer_name} did not answer {type!r} within {timeout} s"
            raise PeerUnreachable(msg) from None
        finally:
            del self._pending[rid]

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= self._limits.coalesce_bytes:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out:
            if not self._transport.is_closing():
                self._transport.write(b"".join(self._out))
            self._out.clear()
            self._out_size = 0

    # -- receiving -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the peer closes; raises the BadMessage or OSError that ended it."""
        failure: BadMessage | OSError | None = None
        try:
            async with asyncio.TaskGroup() as requests:
                try:
                    await self._read_loop(requests)
                except (BadMessage, OSError) as exc:  # raised outside the group, not grouped
                    failure = exc
                for task in self._requests:
                    task.cancel()
        finally:
            self._close(failure)
        if failure is not None:
            raise failure

    async def _read_loop(self, requests: asyncio.TaskGroup) -> None:
        conn, stream, streams, info = self.conn, self._stream, self._handlers.streams, self.info
        while True:
            while True:
                event = conn.next_event()
                if isinstance(event, OneWay):
                    handler = streams.get(event.type)
                    if handler is None:
                        self._stats.events["unknown_stream_type"] += 1
                        continue
                    try:
                        await handler(event.message, info)
                    except BadMessage:
                        raise
                    except Exception:
                        self._stats.trouble(
                            "stream_handler_errors", "stream handler for %r failed", event.type
                        )
                elif isinstance(event, Request):
                    await self._on_request(event, requests)
                elif isinstance(event, Reply):
                    self._on_reply(event)
                elif isinstance(event, ConnectionClosed):
                    return
                else:
                    break  # NEED_DATA
            chunks = await stream.receive()
            for chunk in chunks:
                conn.receive_data(chunk)
            if not chunks:
                conn.receive_data(b"")  # EOF

    async def _on_request(self, event: Request, requests: asyncio.TaskGroup) -> None:
        handler = self._handlers.routes.get(event.type)
        if handler is None:
            self._stats.events["unknown_request_type"] += 1
            error = UnknownRequest(f"no handler for requests of type {event.type!r}")
            await self._reply(event, error_reply(event.id, *error_to_wire(error)))
            return
        await self._slots.acquire()  # at the bound, stop reading: TCP pushes back
        task = requests.create_task(self._serve_request(handler, event))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _serve_request(self, handler: RequestHandler, event: Request) -> None:
        try:
            try:
                reply = ok_reply(event.id, await handler(event.message, self.info))
            except AgiledartError as exc:
                reply = error_reply(event.id, *error_to_wire(exc))
            except Exception:
                self._stats.events["internal_errors"] += 1
                log.exception("handler for %r requests failed", event.type)
                error = f"the handler for {event.type!r} failed (see the peer's log)"
                reply = error_reply(event.id, "InternalError", error)
            await self._reply(event, reply)
        finally:
            self._slots.release()

    async def _reply(self, event: Request, reply: dict[str, Any]) -> None:
        try:
            await self.send_message(reply)
        except (TypeError, ValueError, OverflowError, OversizeError) as exc:  # the result
            self._stats.trouble("unencodable_replies", "cannot encode the reply to %r", event.type)
            error = f"cannot encode the reply to {event.type!r}: {type(exc).__name__}: {exc}"
            with contextlib.suppress(OverlayError):
                await self.send_message(error_reply(event.id, "InternalError", error[:1000]))
        except OverlayError:
            pass  # the connection is gone; nobody is left to answer

    def _on_reply(self, event: Reply) -> None:
        future = self._pending.get(event.id)
        if future is None or future.done():
            self._stats.events["unexpected_replies"] += 1
        elif event.ok:
            future.set_result(event.result)
        else:
            future.set_exception(_remote_error(event, self.info.peer_name))

    def _close(self, failure: BadMessage | OSError | None) -> None:
        if isinstance(failure, BadMessage):
            self._failure = failure
        elif self._failure is None:
            reason = f": {failure}" if failure else ""
            self._failure = PeerUnreachable(f"connection to {self.info.peer_name} closed{reason}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(_fresh(self._failure))
        if isinstance(failure, BadMessage):
            self._transport.abort()
        else:
            self._flush()
            self._transport.close()

    def shutdown(self) -> None:
        """Close from our side (queued frames still go out)."""
        self._close(None)


def _remote_error(reply: Reply, peer: str) -> AgiledartError:
    """The error a peer answered with, as the class it raised there (see the module
    docstring); whatever it sent, one of our errors."""
    name, message = reply.error_type, reply.error_message
    try:
        error = error_from_wire(name, message, reply.error_fields)
    except ValueError as exc:
        msg = f"{peer} answered a {name[:64]} that does not fit its class: {exc}"
        error = MalformedError(msg)
    if error is None:
        error = RemoteError(name[:64], message[:1000], peer=peer)
    error.remote_peer = peer
    error.add_note(f"raised by peer {peer}")
    return error


def _fresh(exc: OverlayError) -> OverlayError:
    return type(exc)(*exc.args)


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
        self._handlers = _Handlers()
        self._stats = _Stats(self.limits.log_interval_s, clock)
        self._group: asyncio.TaskGroup | None = None
        self._server: asyncio.Server | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._clock = clock
        self._admission: HandshakeAdmission[_Stream] = HandshakeAdmission(
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
                lambda: _Stream(self.limits.read_chunk, self._accept), host, port, backlog=512
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

    def _accept(self, stream: _Stream) -> None:
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

    async def _connection(self, stream: _Stream, conn_id: int) -> None:
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
                    await _handshake(conn, stream, lambda: self._admission.heard(stream))
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
            channel = _Channel(
                conn, stream, handlers=handlers, limits=limits, stats=stats, conn_id=conn_id
            )
            await channel.run()
        except _Aborted:
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

    def __init__(self, channel: _Channel, handlers: _Handlers, stats: _Stats) -> None:
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
        stats = _Stats(limits.log_interval_s, clock)
        conn = FrameConnection(
            role=Role.CLIENT, key=key, name=name, max_frame=limits.max_frame, rng=rng
        )
        stream: _Stream | None = None
        try:
            async with asyncio.timeout(timeout):
                _, stream = await asyncio.get_running_loop().create_connection(
                    lambda: _Stream(limits.read_chunk), host, port
                )
                await _handshake(conn, stream)
        except BaseException as exc:
            if stream is not None:
                stream.transport.abort()
            if isinstance(exc, TimeoutError):
                msg = f"no frame session with {host}:{port} within {timeout} s"
                raise PeerUnreachable(msg) from None
            if isinstance(exc, OSError | _Aborted) and stream is not None:
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
        handlers = _Handlers()
        channel = _Channel(conn, stream, handlers=handlers, limits=limits, stats=stats, conn_id=0)
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
