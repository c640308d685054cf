"""The ``http`` source: a webhook receiver on the source's peer.

POST a JSON object (one record) or a JSON list of objects to
``http://{host}:{port}{path}`` with ``Authorization: Bearer <token>`` (the token is the
peer's environment variable ``token_env``). Answers: 202 once the records are in the
source's buffer; 401 without the token; 413 for a body over ``max_body_kb``; 400 for a
body that is not JSON, or not an object or a list of objects (with the reason); 429
(``Retry-After: 1``) when the buffer (``buffer`` records) cannot take them all, so
the sender tries again later; 503 once the source has ended (``count`` records). A
request is taken whole or not at all. Records get the source's usual fields: a record
without an integer ``ts`` gets the wall-clock time of its arrival, in milliseconds.

*Guarantee.* The buffer is in the peer's memory, not on its disk: a 2xx means the
records are in it, not that they are durable. Records taken but not yet through a
checkpoint are lost if the app restores (its source cannot replay them), so the
source is at-most-once across a failure, and at-least-once to the app from a client
that retries on anything but a 2xx while nothing fails.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from agiledart.app.errors import DataError, ExecutionError
from agiledart.app.spec import SourceSpec
from agiledart.operators import Record
from agiledart.runtime.connectors import SourceStatistics
from agiledart.runtime.http.sink import token_of

__all__ = ["HttpSource", "HttpSourceStatistics", "records_of"]


@dataclass(slots=True)
class HttpSourceStatistics(SourceStatistics):
    """A webhook source's statistics: what came, and what it refused and why."""

    received: int = 0  #: records taken into the buffer
    backlog: int = 0  #: records in the buffer, not yet handed on
    unauthorized: int = 0  #: requests answered 401
    too_large: int = 0  #: requests answered 413
    bad_requests: int = 0  #: requests answered 400
    busy: int = 0  #: requests answered 429 (the buffer was full)
    listening: str | None = None  #: host:port, once the receiver listens


class BadBody(DataError):
    """A body that is not one record or a list of records (answered 400)."""


def records_of(body: bytes, wall_ms: float) -> list[Record]:
    """The records of a request's body; :class:`BadBody` says what is wrong."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        msg = f"not JSON: {e}"[:200]
        raise BadBody(msg) from None
    items = value if isinstance(value, list) else [value]
    out: list[Record] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            msg = f"record {i} is not a JSON object"
            raise BadBody(msg)
        ts = item.get("ts")
        if isinstance(ts, float) and ts.is_integer():
            item["ts"] = int(ts)
        elif not isinstance(ts, int) or isinstance(ts, bool):
            if ts is not None:
                msg = f"record {i}: 'ts' must be an integer (ms), got {ts!r}"[:200]
                raise BadBody(msg)
            item["ts"] = int(wall_ms)
        out.append(item)
    return out


class HttpSource:
    """An ``http`` source: the records POSTed to its peer (see the module)."""

    def __init__(
        self,
        spec: SourceSpec,
        *,
        batch_size: int = 1000,
        wall_ms: Callable[[], float] = lambda: time.time() * 1000.0,
    ) -> None:
        p = spec.params
        self.spec = spec
        self.stats = HttpSourceStatistics()
        self.host = str(p.get("host", "127.0.0.1"))
        self.port = int(p["port"])
        self.path = str(p.get("path", "/"))
        self.count: int | None = p.get("count")
        self.limit = int(p.get("buffer", 10_000))
        self.max_body = int(p.get("max_body_kb", 1024)) * 1024
        self._token = f"Bearer {token_of(str(p['token_env']))}".encode()
        self._batch_size = batch_size
        self._wall_ms = wall_ms
        self._buffer: deque[Record] = deque()
        self._accepted = 0  #: records taken, toward ``count``
        self._wake = asyncio.Event()
        self._started = False

    # -- the receiver (aiohttp's server: HTTP parsing, body limit, 413) --------------------

    async def _receive(self, request: web.Request) -> web.Response:
        st = self.stats
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, self._token):
            st.unauthorized += 1
            return web.Response(
                status=401, text="a bearer token is needed", headers={"WWW-Authenticate": "Bearer"}
            )
        try:
            body = await request.read()  # past client_max_size: 413
        except web.HTTPRequestEntityTooLarge:
            st.too_large += 1
            raise
        try:
            records = records_of(body, self._wall_ms())
        except BadBody as e:
            st.bad_requests += 1
            return web.Response(status=400, text=str(e))
        if self.count is not None and self._accepted >= self.count:
            return web.Response(status=503, text="this source has ended")
        if len(self._buffer) + len(records) > self.limit:
            st.busy += 1
            return web.Response(
                status=429, text="the source's buffer is full", headers={"Retry-After": "1"}
            )
        if self.count is not None:
            records = records[: self.count - self._accepted]
        self._buffer.extend(records)
        self._accepted += len(records)
        st.received += len(records)
        st.backlog = len(self._buffer)
        self._wake.set()
        return web.json_response({"accepted": len(records)}, status=202)

    async def _start(self) -> web.AppRunner:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post(self.path, self._receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as e:
            await runner.cleanup()
            msg = f"source {self.spec.id!r}: cannot listen on {self.host}:{self.port}: {e}"
            raise ExecutionError(msg) from e
        self.stats.listening = f"{self.host}:{self.port}"
        return runner

    # -- the SourceConnector protocol ---------------------------------------------------

    async def run(self, emit: Callable[[list[Record]], Awaitable[None]]) -> None:
        """Hand the records POSTed to ``emit`` in batches; return after ``count``."""
        if self._started:
            msg = f"source {self.spec.id!r} runs once; make a new HttpSource"
            raise ExecutionError(msg)
        self._started = True
        st = self.stats
        runner = await self._start()
        try:
            while self.count is None or st.emitted < self.count:
                if not self._buffer:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                n = min(self._batch_size, len(self._buffer))
                batch = [self._buffer.popleft() for _ in range(n)]
                st.backlog = len(self._buffer)
                await emit(batch)
                st.emitted += len(batch)
                st.batches += 1
        finally:
            await runner.cleanup()
            st.listening = None
        st.finished = True
