"""The ``sql`` sink: a peer's driver of :class:`~agiledart.runtime.sql.db.Database`
and :class:`~agiledart.runtime.sql.spool.Spool` (see the package's theory of operation)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from itertools import takewhile
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec
from agiledart.operators import Record
from agiledart.runtime.connectors import SinkStatistics
from agiledart.runtime.sql.db import (
    FINAL_EPOCH,
    Batch,
    Database,
    DatabaseDown,
    DatabaseRefused,
    Target,
    column_type,
    location_of,
    password_of,
)
from agiledart.runtime.sql.spool import Entry, Spool

if TYPE_CHECKING:
    from agiledart.runtime.confine import DataPolicy

__all__ = ["DEFAULT_BUFFER_MB", "SqlSink"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: the store-and-forward buffer of a sink that sets no ``buffer_mb``
DEFAULT_BUFFER_MB = 64
#: seconds between two attempts to reach a database that is down: first, at most
RETRY_S = (0.2, 5.0)
#: rows a sink without checkpoints sends in one batch, at most
BATCH_ROWS = 5_000


def _value(v: Any) -> Any:
    """A record's value as the database takes it: numbers, text, bools and None as
    they are (NaN and infinities: None), bytes as hex, anything else as JSON text."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    item = getattr(v, "item", None)  # numpy scalars
    if callable(item):
        with contextlib.suppress(TypeError, ValueError):
            return _value(item())
    return json.dumps(v, sort_keys=True, default=str)


def _same_epoch(head: Entry, rest: list[Entry]) -> list[Entry]:
    """The entries after ``head`` of its epoch (an epoch's rows go out together)."""
    if head.epoch is None:
        return []
    return list(takewhile(lambda e: e.epoch == head.epoch and not e.open, rest))


class SqlSink:
    """Rows of an app's records into a table: per epoch, after its checkpoint commits
    (``checkpointed``), else in batches; through a spool on disk while the database
    is down."""

    path: Path | None = None

    def __init__(
        self,
        spec: SinkSpec,
        *,
        app_id: str,
        instance: str,
        out_dir: str | Path,
        checkpointed: bool,
        resume: Mapping[str, Any] | None = None,
        policy: DataPolicy | None = None,
    ) -> None:
        self.id = spec.id
        self.app_id = app_id
        self.instance = instance
        self.checkpointed = checkpointed
        self.stats = SinkStatistics()
        p = spec.params
        owner = f"sink {spec.id!r}"
        dialect, location = location_of(str(p.get("url", f"sqlite:///{spec.id}.db")))
        if dialect == "sqlite":
            if policy is None:
                location = str(Path(out_dir) / location)
            else:
                location = str(policy.sink_path(owner, location, out_dir))
            self.path = Path(location)
        env = p.get("password_env")
        if env is not None and policy is not None:
            policy.check_env(owner, str(env))
        upsert = p.get("upsert_on", ())
        self.target = Target(
            dialect=dialect,
            location=location,
            table=str(p["table"]),
            upsert_on=(upsert,) if isinstance(upsert, str) else tuple(upsert),
            password=None if dialect == "sqlite" or env is None else password_of(str(env)),
        )
        declared = p.get("columns")
        self._columns: tuple[tuple[str, str], ...] | None = (
            tuple((str(k), str(v)) for k, v in declared.items()) if declared else None
        )
        self.flush_s = int(p.get("flush_ms", 1000)) / 1000.0
        buffer_mb = int(p.get("buffer_mb", DEFAULT_BUFFER_MB))
        self.spool = Spool(Path(out_dir) / f".{spec.id}.spool", buffer_mb * 1024 * 1024)
        #: the last epoch the app committed (rows up to it may go out)
        self.committed: int | None = None
        if resume is not None and resume.get("epoch") is not None:
            self.committed = int(resume["epoch"])
        self.spool.drop_after(self.committed)  # what came after is replayed
        self._rows: list[list[Any]] = []
        self._db = Database(self.target)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, f"sql-{spec.id}")
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one spool append at a time
        self._ending = False  #: the input ended: everything left goes out
        self._complete: bool | None = None  #: the database holds the whole output
        self._drained = asyncio.Event()
        self._closed = False
        self._state = "connecting"
        self._since: float | None = time.time()
        self._last_error: str | None = None
        self.overflowed = 0  #: entries refused by the full spool

    # -- the Sink protocol (agiledart.runtime.connectors.Sink) ---------------------------

    def write(self, records: list[Record]) -> None:
        if self._closed:
            msg = f"sink {self.id!r} is closed"
            raise ExecutionError(msg)
        if not records or self._complete:
            return
        if self._columns is None:
            first = records[0]
            self._columns = tuple((str(k), column_type(first[k])) for k in sorted(first, key=str))
        names = [n for n, _ in self._columns]
        self._rows.extend([_value(r.get(n)) for n in names] for r in records)
        self.stats.batches += 1
        if len(self._rows) >= BATCH_ROWS:  # to disk, not to the memory's end
            self._wake.set()

    def flush(self) -> None:
        """Nothing to do: rows go out per committed epoch, or per batch in :meth:`run`."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.submit(self._db.close)
        self._thread.shutdown(wait=False)

    # -- checkpoints ----------------------------------------------------------------------

    async def seal(self, epoch: int) -> dict[str, Any]:
        """Barrier ``epoch`` passed: its rows wait on disk for the epoch's commit
        (:meth:`committed`); what a restore from ``epoch`` needs of this sink."""
        rows, self._rows = self._rows, []  # the barrier's moment: later rows are not E's
        async with self._lock:
            if rows and not self._complete:
                await self._put(Batch(epoch, self._columns or (), rows))
            if any(e.open for e in self.spool.entries):
                await asyncio.to_thread(self._disk, self.spool.seal_open, epoch)
        return {"epoch": epoch}

    def committed_epoch(self, epoch: int) -> None:
        """The app committed ``epoch``: its rows, and those before, may go out."""
        if self.committed is None or epoch > self.committed:
            self.committed = epoch
            self._wake.set()

    async def _spill(self, *, pending: bool) -> None:
        """The rows so far to the spool: ``pending``, rows of the epoch not sealed yet,
        else a batch (without checkpoints)."""
        rows, self._rows = self._rows, []
        if rows:
            async with self._lock:
                await self._put(Batch(None, self._columns or (), rows), pending=pending)

    async def _put(self, batch: Batch, *, pending: bool = False) -> None:
        """``batch`` to the spool, or counted as dropped if it does not fit (the caller
        holds the lock: entries go in the order their rows came)."""
        ok = await asyncio.to_thread(self._disk, self.spool.append, batch, pending=pending)
        if not ok:
            self.stats.dropped += len(batch.rows)
            self.overflowed += 1
            log.warning(
                "sink %r: its buffer (%d MiB) is full: %d rows dropped",
                self.id, self.spool.limit // (1024 * 1024), len(batch.rows),
            )  # fmt: skip
        self._wake.set()

    def _disk(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        try:
            return fn(*args, **kw)
        except OSError as e:
            msg = f"sink {self.id!r}: cannot write its buffer {self.spool.folder}: {e}"
            raise ExecutionError(msg) from e

    # -- the forwarder --------------------------------------------------------------------

    async def run(self) -> None:
        """Send what may go out, in order, while the sink is open; a database that is
        down is tried again with back-off. A refusal fails the app."""
        loop = asyncio.get_running_loop()
        delay = RETRY_S[0]
        next_batch = loop.time() + self.flush_s
        while not self._closed:
            due = bool(self._rows) and (loop.time() >= next_batch or len(self._rows) >= BATCH_ROWS)
            if not self.checkpointed and (due or self._ending):
                await self._spill(pending=False)
                next_batch = loop.time() + self.flush_s
            elif self.checkpointed and len(self._rows) >= BATCH_ROWS and not self._complete:
                await self._spill(pending=True)
            try:
                await self._forward()
            except DatabaseDown as e:
                self._down(str(e))
                await self._sleep(delay)
                delay = min(delay * 2, RETRY_S[1])
                continue
            except DatabaseRefused as e:
                msg = f"sink {self.id!r}: the database refused the rows: {e}"
                raise ExecutionError(msg) from e
            delay = RETRY_S[0]
            if self._ending and not self._rows and not self.spool.entries:
                self._drained.set()
            wait = max(0.0, next_batch - loop.time()) if not self.checkpointed else None
            await self._sleep(wait)

    async def _sleep(self, seconds: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    async def _forward(self) -> None:
        if self._complete is None:
            self._complete = await self._call(self._db.applied, self.app_id, self.id, FINAL_EPOCH)
            if self._complete:
                self._rows = []
                self.spool.drop_after(None)
            self._up()
        if self._ending and self.checkpointed:  # all at once, with the final mark
            await self._apply(list(self.spool.entries), final=True)
            return
        while self.spool.entries:
            head, *rest = self.spool.entries
            if head.open or (
                head.epoch is not None and (self.committed is None or head.epoch > self.committed)
            ):
                return
            await self._apply([head, *_same_epoch(head, rest)])  # one transaction

    async def _apply(self, entries: list[Entry], *, final: bool = False) -> None:
        written = await self._call(self._send, entries, final)
        self._up()
        self.stats.records += written
        if final:
            self._complete = True

    def _send(self, entries: list[Entry], final: bool) -> int:
        """In the database's thread: ``entries`` into the database, then off the disk."""
        batches = [self.spool.load(e) for e in entries]
        written = self._db.apply(self.app_id, self.id, self.instance, batches, final=final)
        self.spool.remove(entries)
        return written

    async def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, lambda: fn(*args, **kw))

    def _down(self, error: str) -> None:
        if self._state == "connected" or self._since is None:
            self._since = time.time()
        if self._last_error is None or self._state == "connected":
            log.warning("sink %r: database unreachable, rows wait on disk: %s", self.id, error)
        self._state, self._last_error = "retrying", error

    def _up(self) -> None:
        self._state, self._since, self._last_error = "connected", None, None

    # -- the end and status ---------------------------------------------------------------

    async def drain(self) -> None:
        """The input ended: the rows after the last checkpoint go out with everything
        still waiting; until the database holds them all (however long it is down)."""
        if self.checkpointed and self._rows and not self._complete:
            rows, self._rows = self._rows, []
            async with self._lock:
                await self._put(Batch(FINAL_EPOCH, self._columns or (), rows))
        self._ending = True
        self._wake.set()
        await self._drained.wait()

    def connection(self) -> dict[str, Any]:
        """As an mqtt sink's: ``{"state", "since", "last_error"}``."""
        return {"state": self._state, "since": self._since, "last_error": self._last_error}

    def buffered(self) -> dict[str, Any]:
        """What waits on disk for the database, and what the full buffer refused."""
        return {
            "buffered_rows": self.spool.rows,
            "buffered_bytes": self.spool.bytes,
            "buffer_limit_bytes": self.spool.limit,
            "buffer_overflows": self.overflowed,
        }
