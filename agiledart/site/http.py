"""A tiny HTTP/1.1 server on asyncio for the metrics endpoint and the dashboard.

Theory of operation
-------------------
The protocol half is plain functions over bytes (as h11 does it, without I/O):
:class:`RequestReader` takes what arrived and returns a :class:`Request` once the head
(request line and headers) is complete, and :func:`encode_response` makes the bytes of a
:class:`Response`. Both apply hard limits: a head larger than ``max_head`` bytes (431),
more than ``max_headers`` headers (431), a garbled request line or header (400), a
method other than GET or HEAD (405), a request with a body (413), an HTTP version other
than 1.0 or 1.1 (505). Every violation is one :class:`~agiledart.site.errors.HttpError`
carrying its status.

:class:`HttpServer` is the thin driver: one task per connection, owned by the peer's
task group; one request per connection (``Connection: close``), a head that does not
arrive within ``read_timeout_s`` gets 408, at most ``max_connections`` at a time. A
client at the cap is never refused while a slow one holds a place: the connection that
has waited longest for its head (or to take its answer) is shed, reset at once, to make
room, so a crowd of slow or idle clients cannot keep a scrape out (only connections
whose handler runs are never shed; a full house of those refuses the newcomer). A
failing handler is logged and answered 500. Nothing a client sends can end anything but
its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote

from agiledart.site.errors import HttpError, SiteConfigError

log = logging.getLogger(__name__)

__all__ = [
    "HttpLimits",
    "HttpServer",
    "Request",
    "RequestReader",
    "Response",
    "encode_response",
]

#: headers every answer carries: nothing cached, nothing sniffed, no referrer (a
#: dashboard URL holds its token), never framed
BASE_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpLimits:
    max_head: int = 16 * 1024  #: request line and headers, bytes
    max_headers: int = 64
    read_timeout_s: float = 5.0  #: for the whole head
    write_timeout_s: float = 30.0
    max_connections: int = 32  #: at a time; slow ones are shed for newcomers


@dataclass(frozen=True, slots=True)
class Request:
    method: str  #: GET or HEAD
    path: str  #: percent-decoded
    query: dict[str, str]
    headers: dict[str, str]  #: names in lower case; a repeated header keeps the last


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def text(cls, status: int, text: str, *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        return cls(status, text.encode(), headers=headers)


_METHODS = ("GET", "HEAD")
_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


class RequestReader:
    """Bytes in, one :class:`Request` out (or an :class:`HttpError`)."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self._buf = bytearray()

    def feed(self, data: bytes) -> Request | None:
        """Add ``data``; the request once its head is complete, else None."""
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > self.limits.max_head:
                raise HttpError(431, "request head too large")
            return None
        if end + 4 > self.limits.max_head:
            raise HttpError(431, "request head too large")
        return parse_head(bytes(self._buf[:end]), self.limits)


def parse_head(head: bytes, limits: HttpLimits) -> Request:
    """The request of a head (without its final blank line)."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise HttpError(400, "request head is not ASCII") from None
    line, *header_lines = text.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not all(parts):
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if version.startswith("HTTP/") and len(version) == 8:
            raise HttpError(505, "HTTP version not supported")
        raise HttpError(400, "malformed request line")
    if not method or not set(method) <= _TOKEN_CHARS:
        raise HttpError(400, "malformed method")
    if method not in _METHODS:
        raise HttpError(405, f"method {method} not allowed")
    if not target.startswith("/"):
        raise HttpError(400, "request target must be a path")
    if len(header_lines) > limits.max_headers:
        raise HttpError(431, "too many headers")
    headers: dict[str, str] = {}
    for raw in header_lines:
        name, sep, value = raw.partition(":")
        if not sep or not name or not set(name) <= _TOKEN_CHARS:
            raise HttpError(400, "malformed header")
        headers[name.lower()] = value.strip(" \t")
    if "transfer-encoding" in headers or headers.get("content-length", "0") != "0":
        raise HttpError(413, "requests with a body are not accepted")
    path, _, query = target.partition("#")[0].partition("?")  # origin-form: no netloc
    return Request(method, unquote(path), dict(parse_qsl(query, keep_blank_values=True)), headers)


def encode_response(resp: Response, *, head_only: bool = False) -> bytes:
    """The bytes of ``resp``, closing the connection after it."""
    try:
        reason = HTTPStatus(resp.status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [
        f"HTTP/1.1 {resp.status} {reason}",
        f"Content-Type: {resp.content_type}",
        f"Content-Length: {len(resp.body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in (*BASE_HEADERS, *resp.headers)),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + resp.body


Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class HttpStatistics:
    connections: int = 0
    refused: int = 0  #: over max_connections with every place's handler running
    shed: int = 0  #: slow connections reset to make room for a newcomer
    responses: Counter[int] = field(default_factory=Counter)  #: by status
    handler_errors: int = 0


#: what a connection is doing; those reading or writing may be shed, never a handler
READING, HANDLING, WRITING = "reading", "handling", "writing"


@dataclass(eq=False, slots=True)
class _Connection:
    writer: asyncio.StreamWriter
    opened: float
    phase: str = READING
    task: asyncio.Task[None] | None = None


class HttpServer:
    """Serves ``handler`` on ``host:port`` in the caller's task group until :meth:`aclose`."""

    def __init__(self, handler: Handler, *, name: str, limits: HttpLimits | None = None) -> None:
        self.handler = handler
        self.name = name
        self.limits = limits or HttpLimits()
        self.stats = HttpStatistics()
        self.address: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._group: asyncio.TaskGroup | None = None
        self._conns: set[_Connection] = set()

    async def start(self, group: asyncio.TaskGroup, host: str, port: int) -> tuple[str, int]:
        self._group = group
        try:
            self._server = await asyncio.start_server(self._accept, host, port, backlog=64)
        except OSError as exc:
            msg = f"cannot serve the {self.name} on {host}:{port}/tcp: {exc.strerror or exc}"
            raise SiteConfigError(msg) from exc
        bound = self._server.sockets[0].getsockname()
        self.address = (str(bound[0]), int(bound[1]))
        return self.address

    async def aclose(self) -> None:
        server, self._server, self._group = self._server, None, None
        if server is None:
            return
        server.close()
        tasks = [c.task for c in self._conns if c.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._group is None or not self._make_room():
            self.stats.refused += 1
            writer.transport.abort()
            return
        conn = _Connection(writer, asyncio.get_running_loop().time())
        serve = self._connection(reader, conn)
        try:
            conn.task = self._group.create_task(serve, name=f"{self.name} connection")
        except RuntimeError:  # the group is shutting down
            serve.close()
            writer.transport.abort()
            return
        self._conns.add(conn)
        conn.task.add_done_callback(lambda _: self._conns.discard(conn))

    def _make_room(self) -> bool:
        """Whether a newcomer may have a place, shedding the slowest connection (the one
        reading or writing the longest) when every place is taken."""
        if len(self._conns) < self.limits.max_connections:
            return True
        slow = [c for c in self._conns if c.phase != HANDLING]
        if not slow:
            return False
        victim = min(slow, key=lambda c: (c.phase != READING, c.opened))
        self._conns.discard(victim)
        self.stats.shed += 1
        victim.writer.transport.abort()
        if victim.task is not None:
            victim.task.cancel()
        return True

    async def _connection(self, reader: asyncio.StreamReader, conn: _Connection) -> None:
        self.stats.connections += 1
        writer = conn.writer
        head_only = refused = False
        try:
            try:
                request = await self._read(reader)
                head_only = request.method == "HEAD"
                conn.phase = HANDLING
                response = await self._handle(request)
            except HttpError as exc:
                response, refused = Response.text(exc.status, f"{exc}\n"), True
            conn.phase = WRITING
            self.stats.responses[response.status] += 1
            writer.write(encode_response(response, head_only=head_only))
            async with asyncio.timeout(self.limits.write_timeout_s):
                await writer.drain()
            if refused:
                await _linger(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: nothing to answer
        except Exception:  # a bug here must end this connection, never the peer
            self.stats.handler_errors += 1
            log.exception("%s: connection failed", self.name)
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> Request:
        parser = RequestReader(self.limits)
        try:
            async with asyncio.timeout(self.limits.read_timeout_s):
                while True:
                    data = await reader.read(4096)
                    if not data:
                        raise HttpError(400, "connection closed before the request was complete")
                    request = parser.feed(data)
                    if request is not None:
                        return request
        except TimeoutError:
            raise HttpError(408, "request head not received in time") from None

    async def _handle(self, request: Request) -> Response:
        try:
            return await self.handler(request)
        except HttpError:
            raise
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: handler failed for %s", self.name, request.path)
            return Response.text(500, "internal error\n")


async def _linger(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, limit: int = 1 << 20
) -> None:
    """After refusing a request the client may still be sending: read and drop what comes
    (a second at most, ``limit`` bytes at most) before closing, or the close would reset
    the connection and the client could lose our answer (a "lingering close")."""
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1.0):
            while limit > 0 and (chunk := await reader.read(65536)):
                limit -= len(chunk)
