"""The ``http`` source: a webhook receiver on the source's peer.

POST a JSON object (one record) or a JSON list of objects to
``http://{host}:{port}{path}`` with ``Authorization: Bearer <token>`` (the token is the
peer's environment variable ``token_env``). Answers: 202 once the records are in the
source's log on the peer's disk (:mod:`.log`; requests arriving together share one
write); 401 without the token; 413 for a body over ``max_body_kb``; 400 for a body
that is not JSON, or not an object or a list of objects (with the reason), or an
``Idempotency-Key`` over 200 bytes; 429 (``Retry-After: 1``) when the log cannot take
them all (``buffer`` records not yet handed on, ``buffer_mb`` MiB on disk), so the
sender tries again later; 503 once the source has ended (``count`` records), or when
the disk failed. A request is taken whole or not at all. A request with an
``Idempotency-Key`` header that the source has taken already (one of the last
``idempotency_keys``) is answered 202 again and not logged twice. Records get the
source's usual fields: a record without an integer ``ts`` gets the wall-clock time of
its arrival, in milliseconds.

*Guarantee.* A checkpointed app's source (``durable``) logs under ``log_dir``, the
same directory for every generation of the app: :meth:`HttpSource.checkpoint` gives
the log position a checkpoint records, :meth:`HttpSource.committed` lets the log drop
what a committed epoch covers, and a restored source, made with ``start`` = that
position, reads on from there. So a 2xx'd record reaches the app exactly once while
the source's peer lives, or restarts on its state directory; a client that retries
until a 2xx (with an ``Idempotency-Key``, also after a lost answer) sends each record
exactly once into the app. Without checkpoints the log is private to the source and
removed when it ends.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from agiledart.app.errors import DataError, ExecutionError
from agiledart.app.spec import SourceSpec
from agiledart.operators import Record
from agiledart.runtime.connectors import SourceStatistics
from agiledart.runtime.http.log import MAX_KEY, Offer, RequestLog
from agiledart.runtime.http.sink import token_of

__all__ = ["HttpSource", "HttpSourceStatistics", "records_of"]


@dataclass(slots=True)
class HttpSourceStatistics(SourceStatistics):
    """A webhook source's statistics: what came, and what it refused and why."""

    received: int = 0  #: records taken into the log (by this source object)
    backlog: int = 0  #: records in the log, not yet handed on
    log_position: int = 0  #: records read from the log so far (a replay point)
    repeated: int = 0  #: requests answered 2xx again for an Idempotency-Key seen
    unauthorized: int = 0  #: requests answered 401
    too_large: int = 0  #: requests answered 413
    bad_requests: int = 0  #: requests answered 400
    busy: int = 0  #: requests answered 429 (the log was full)
    failed_writes: int = 0  #: requests answered 503: the log's disk failed
    listening: str | None = None  #: host:port, once the receiver listens


class BadBody(DataError):
    """A body that is not one record or a list of records (answered 400)."""


def records_of(body: bytes, wall_ms: float) -> list[Record]:
    """The records of a request's body; :class:`BadBody` says what is wrong."""
    return parse_body(body, wall_ms)[0]


def parse_body(body: bytes, wall_ms: float) -> tuple[list[Record], bool]:
    """The records of a request's body, and whether they differ from it (a ``ts``
    given or made an integer); :class:`BadBody` says what is wrong."""
    changed = False
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
            item["ts"], changed = int(ts), True
        elif not isinstance(ts, int) or isinstance(ts, bool):
            if ts is not None:
                msg = f"record {i}: 'ts' must be an integer (ms), got {ts!r}"[:200]
                raise BadBody(msg)
            item["ts"], changed = int(wall_ms), True
        out.append(item)
    return out, changed


#: how long a restored source waits for its port, while the generation before closes
BIND_WAIT_S = 10.0


class HttpSource:
    """An ``http`` source: the records POSTed to its peer (see the module)."""

    def __init__(
        self,
        spec: SourceSpec,
        *,
        log_dir: Path | None = None,
        durable: bool = False,
        start: int = 0,
        batch_size: int = 1000,
        tick_s: float = 0.005,
        wall_ms: Callable[[], float] = lambda: time.time() * 1000.0,
    ) -> None:
        p = spec.params
        self.spec = spec
        self.stats = HttpSourceStatistics(log_position=start)
        self.host = str(p.get("host", "127.0.0.1"))
        self.port = int(p["port"])
        self.path = str(p.get("path", "/"))
        self.count: int | None = p.get("count")
        self.limit = int(p.get("buffer", 10_000))
        self.max_bytes = int(p.get("buffer_mb", 256)) << 20
        self.max_keys = int(p.get("idempotency_keys", 10_000))
        self.max_body = int(p.get("max_body_kb", 1024)) * 1024
        self._token = f"Bearer {token_of(str(p['token_env']))}".encode()
        if log_dir is None:  # a source outside a peer (tests, tools): a private directory
            log_dir = Path(tempfile.mkdtemp(prefix=f"agiledart-http-{spec.id}-"))
        self.log_dir = log_dir
        self._durable = durable
        self._from = start  #: the log position to read on from (a restored source's)
        self._batch_size = batch_size
        self._tick_s = tick_s
        self._wall_ms = wall_ms
        self._log: RequestLog | None = None
        self._emitted_at = start  #: records emitted (counted from the app's first)
        self._emitted_frame = 0  #: the log position (a frame) after the last batch emitted
        self._marks: dict[int, int] = {}  #: epoch -> its log position, until committed
        self._released: int | None = None  #: the log position of the last committed epoch
        self._wake = asyncio.Event()
        self._started = False

    # -- checkpoints ----------------------------------------------------------------------

    def checkpoint(self, epoch: int) -> int:
        """Where barrier ``epoch`` cuts the source: the records emitted before it (a
        restored source made with ``start`` = that reads on from the next)."""
        self._marks[epoch] = self._emitted_frame
        return self._emitted_at

    def committed(self, epoch: int) -> None:
        """Epoch ``epoch`` is committed: the log may drop what came before its position."""
        done = [e for e in self._marks if e <= epoch]
        if not done:
            return
        self._released = max(self._released or 0, *(self._marks.pop(e) for e in done))
        if self._log is not None:
            self._log.read_to(self._released)

    # -- the receiver (aiohttp's server: HTTP parsing, body limit, 413) --------------------

    async def _receive(self, request: web.Request) -> web.Response:
        st, log = self.stats, self._log
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, self._token):
            st.unauthorized += 1
            return web.Response(
                status=401, text="a bearer token is needed", headers={"WWW-Authenticate": "Bearer"}
            )
        if log is None:  # listening, the log not open yet: a moment
            return web.Response(status=503, text="the source is starting")
        key = request.headers.get("Idempotency-Key", "")
        try:
            body = await request.read()  # past client_max_size: 413
        except web.HTTPRequestEntityTooLarge:
            st.too_large += 1
            raise
        try:
            if len(key.encode()) > MAX_KEY:
                msg = f"an Idempotency-Key is at most {MAX_KEY} bytes"
                raise BadBody(msg)
            records, changed = parse_body(body, self._wall_ms())
        except BadBody as e:
            st.bad_requests += 1
            return web.Response(status=400, text=str(e))
        if self.count is not None:
            if log.logged >= self.count:
                if log.seen(key):
                    st.repeated += 1
                    return web.json_response({"accepted": 0, "repeated": True}, status=202)
                return web.Response(status=503, text="this source has ended")
            taken = records[: self.count - log.logged]
            changed, records = changed or len(taken) < len(records), taken
        offer = log.offer(records, key, None if changed else body)
        if offer is Offer.SEEN:
            st.repeated += 1
            return web.json_response({"accepted": 0, "repeated": True}, status=202)
        if offer is Offer.FULL:
            st.busy += 1
            return web.Response(
                status=429, text="the source's log is full", headers={"Retry-After": "1"}
            )
        if not await log.commit():
            st.failed_writes += 1
            return web.Response(status=503, text="the source cannot write its log")
        st.received += len(records)
        st.backlog = log.backlog
        self._wake.set()
        return web.json_response({"accepted": len(records)}, status=202)

    async def _listen(self) -> web.AppRunner:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post(self.path, self._receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        waited = 0.0
        while True:
            try:
                await web.TCPSite(runner, self.host, self.port).start()
                break
            except OSError as e:
                if e.errno == errno.EADDRINUSE and waited < BIND_WAIT_S:
                    await asyncio.sleep(0.2)  # the app's generation before may be closing
                    waited += 0.2
                    continue
                await runner.cleanup()
                msg = f"source {self.spec.id!r}: cannot listen on {self.host}:{self.port}: {e}"
                raise ExecutionError(msg) from e
        self.stats.listening = f"{self.host}:{self.port}"
        return runner

    # -- the SourceConnector protocol ---------------------------------------------------

    def _ended(self, log: RequestLog) -> bool:
        return self.count is not None and log.records_read >= self.count

    async def run(self, emit: Callable[[list[Record]], Awaitable[None]]) -> None:
        """Hand the records POSTed to ``emit`` in batches; return after ``count``."""
        if self._started:
            msg = f"source {self.spec.id!r} runs once; make a new HttpSource"
            raise ExecutionError(msg)
        self._started = True
        st = self.stats
        runner: web.AppRunner | None = None
        log: RequestLog | None = None
        try:
            # listening first: then the app's generation before has let go of the log
            runner = await self._listen()
            log = self._log = RequestLog(
                self.log_dir,
                start=self._from,
                limit=self.limit,
                max_bytes=self.max_bytes,
                keys=self.max_keys,
            )
            self._emitted_frame = log.position
            if self._durable:
                self._released = log.position
            while not self._ended(log):
                batch = log.read(self._batch_size)
                read, frame = log.records_read, log.position
                st.backlog, st.log_position = log.backlog, read
                if batch:
                    await emit(batch)
                    st.emitted += len(batch)
                    st.batches += 1
                # before any await: a barrier may come next
                self._emitted_at, self._emitted_frame = read, frame
                if batch:
                    log.read_to(self._released)
                elif not log.backlog:
                    self._wake.clear()
                    await self._wake.wait()
                    if log.backlog < self._batch_size:
                        await asyncio.sleep(self._tick_s)  # let a batch gather
        finally:
            if runner is not None:
                await runner.cleanup()
            st.listening = None
            if log is not None:
                log.close(remove=not self._durable)
            if not self._durable:
                shutil.rmtree(self.log_dir, ignore_errors=True)
        st.finished = True
