"""One authenticated session over a TCP connection, the part both ends share.

After the handshake (:func:`handshake`) the server's and the client's side of a
connection are the same :class:`Channel`: it multiplexes requests by id, answers them
with the handlers registered by type (:class:`Handlers`), feeds one-way messages, in
order, to stream handlers, and coalesces the frames queued in one turn of the event
loop into one write. :class:`Stream` is the bytes of the socket for the task that
serves it. :func:`remote_error` is the one place where an error a peer answered with
becomes the class it raised there. The drivers that own these, and the rules they
keep (ownership, admission, memory bounds), are in :mod:`.tcp`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from agiledart.errors import AgiledartError, error_from_wire, error_to_wire

from .errors import (
    BadMessage,
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
    HandshakeComplete,
    OneWay,
    Reply,
    Request,
    State,
    error_reply,
    ok_reply,
    request_message,
)

#: the driver's logger: frame connections log under one name, as before the split
log = logging.getLogger(__name__.rpartition(".")[0] + ".tcp")

RequestHandler = Callable[[dict[str, Any], "ConnectionInfo"], Awaitable[Any]]
StreamHandler = Callable[[dict[str, Any], "ConnectionInfo"], Awaitable[None]]

__all__ = [
    "Channel",
    "ConnectionInfo",
    "ConnectionStats",
    "FrameLimits",
    "FrameStatistics",
    "Handlers",
    "HandshakeAborted",
    "RequestHandler",
    "Stream",
    "StreamHandler",
    "handshake",
    "remote_error",
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


class ConnectionStats:
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
class Handlers:
    routes: dict[str, RequestHandler] = field(default_factory=dict)
    streams: dict[str, StreamHandler] = field(default_factory=dict)

    def route(self, type: str, handler: RequestHandler) -> None:
        self.routes[type] = handler

    def on_stream(self, type: str, handler: StreamHandler) -> None:
        self.streams[type] = handler


class ConnectionInfo:
    """The authenticated peer at the other end of one connection, as handlers see it."""

    __slots__ = ("_channel", "address", "id", "peer_name")

    def __init__(self, channel: Channel, peer_name: str, address: tuple[str, int], id: int):
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


class HandshakeAborted(OverlayError):
    """The peer closed the connection before the handshake completed."""


class Stream(asyncio.Protocol):
    """The bytes of one TCP connection for the task that serves it: asyncio's
    StreamReader/StreamWriter pair without the two copies of every received byte."""

    def __init__(self, limit: int, on_open: Callable[[Stream], None] | None = None) -> None:
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


async def handshake(
    conn: FrameConnection, stream: Stream, on_data: Callable[[], None] | None = None
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
            raise HandshakeAborted


class Channel:
    """One open session: multiplexed requests, replies, one-way messages, write coalescing."""

    def __init__(
        self,
        conn: FrameConnection,
        stream: Stream,
        *,
        handlers: Handlers,
        limits: FrameLimits,
        stats: ConnectionStats,
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
            return fresh(self._failure)
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
            future.set_exception(remote_error(event, self.info.peer_name))

    def _close(self, failure: BadMessage | OSError | None) -> None:
        if isinstance(failure, BadMessage):
            self._failure = failure
        elif self._failure is None:
            reason = f": {failure}" if failure else ""
            self._failure = PeerUnreachable(f"connection to {self.info.peer_name} closed{reason}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(fresh(self._failure))
        if isinstance(failure, BadMessage):
            self._transport.abort()
        else:
            self._flush()
            self._transport.close()

    def shutdown(self) -> None:
        """Close from our side (queued frames still go out)."""
        self._close(None)


def remote_error(reply: Reply, peer: str) -> AgiledartError:
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


def fresh(exc: OverlayError) -> OverlayError:
    return type(exc)(*exc.args)
