"""Two-phase sinks with store-and-forward: the machinery the ``sql`` and ``http``
sinks share (the theory of operation is :mod:`agiledart.runtime.sql`'s).

A :class:`SpooledSink` keeps the records it is given in memory, seals them into its
:class:`~agiledart.runtime.spool.Spool` on disk at each checkpoint barrier, and
its forwarder (:meth:`SpooledSink.run`) sends the spooled epochs up to the last
committed one to the destination, in order, retrying with back-off while the
destination is down. A subclass says how records become spool rows
(:meth:`~SpooledSink._rows_of`), how entries reach the destination
(:meth:`~SpooledSink._deliver`) and whether it already holds the whole output
(:meth:`~SpooledSink._already_complete`). A sink whose destination is on the network
(:func:`movable`) may move to another peer when its own dies: what it has not
delivered at a barrier goes with the checkpoint (:meth:`SpooledSink.held`) and seeds
its spool where it is restored (:meth:`SpooledSink.seed`); what it sends is named by
app, sink and epoch only, so what went out before is dropped downstream.

::

    ExecutionError                  (agiledart.app.errors)
    ├── DestinationDown             cannot reach the destination now (retried)
    └── DestinationRefused          output the destination will never take (the app fails)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from itertools import takewhile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec
from agiledart.operators import Record
from agiledart.runtime.connectors import SinkStatistics
from agiledart.runtime.spool import FINAL_EPOCH, Batch, Entry, Spool

if TYPE_CHECKING:
    from agiledart.runtime.confine import DataPolicy

__all__ = [
    "BATCH_ROWS",
    "DEFAULT_BUFFER_MB",
    "RETRY_S",
    "DestinationDown",
    "DestinationRefused",
    "SpooledSink",
    "movable",
    "resumed_epoch",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: seconds between two attempts to reach a destination that is down: first, at most
RETRY_S = (0.2, 5.0)
#: rows a sink without checkpoints sends in one batch, at most
BATCH_ROWS = 5_000
#: the default size of a sink's spool on disk, MiB (``buffer_mb``)
DEFAULT_BUFFER_MB = 64


class DestinationDown(ExecutionError):
    """The destination cannot be reached now: try again later."""


class DestinationRefused(ExecutionError):
    """The destination refused output that it will never take: the app fails."""


def movable(spec: SinkSpec) -> bool:
    """Whether sink ``spec`` may move to another peer when its peer dies: its
    destination is on the network (mqtt, http, sql to a PostgreSQL server), not in a
    file of its peer (a file sink, SQLite)."""
    if spec.connector in ("mqtt", "http"):
        return True
    url = str(spec.params.get("url", ""))
    return spec.connector == "sql" and url.startswith(("postgresql://", "postgres://"))


def resumed_epoch(resume: Mapping[str, Any] | None) -> int | None:
    """The committed epoch a sink restored from ``resume`` (its checkpoint) starts at."""
    return None if resume is None or resume.get("epoch") is None else int(resume["epoch"])


def _same_epoch(head: Entry, rest: list[Entry]) -> list[Entry]:
    """The entries after ``head`` of its epoch (an epoch's rows go out together)."""
    if head.epoch is None:
        return []
    return list(takewhile(lambda e: e.epoch == head.epoch and not e.open, rest))


class SpooledSink:
    """Per epoch after its checkpoint commits (``checkpointed``), else in batches
    within ``flush_s``; through ``spool`` while the destination is down."""

    #: names the destination in log lines and errors ("the database")
    destination: ClassVar[str] = "the destination"
    #: what ``_rows`` holds, in log lines ("rows")
    unit: ClassVar[str] = "rows"

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
        """The sink ``spec`` of ``instance``, its spool ``.<id>.spool`` in ``out_dir``
        (``buffer_mb``), resumed at the epoch its checkpoint (``resume``) committed.
        The subclass reads its own parameters first (:meth:`_configure`), so a bad one
        is refused before anything touches the disk."""
        self._columns: tuple[tuple[str, str], ...] | None = None
        self._configure(spec, f"sink {spec.id!r}", Path(out_dir), policy)
        p = spec.params
        buffer_mb = int(p.get("buffer_mb", DEFAULT_BUFFER_MB))
        self.id = spec.id
        self.app_id = app_id
        self.instance = instance
        self.checkpointed = checkpointed
        #: its destination is on the network: it may move, what it holds kept with
        #: the checkpoint (:meth:`held`)
        self.movable = movable(spec)
        self.stats = SinkStatistics()
        self.flush_s = int(p.get("flush_ms", 1000)) / 1000.0
        self.spool = Spool(Path(out_dir) / f".{spec.id}.spool", buffer_mb * 1024 * 1024)
        #: the last epoch the app committed (rows up to it may go out)
        self.committed = resumed_epoch(resume)
        self.spool.drop_after(self.committed)  # what came after is replayed
        self._rows: list[Any] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one spool append at a time
        self._ending = False  #: the input ended: everything left goes out
        self._complete: bool | None = None  #: the destination holds the whole output
        self._drained = asyncio.Event()
        self._closed = False
        self._state = "connecting"
        self._since: float | None = time.time()
        self._last_error: str | None = None
        self.overflowed = 0  #: entries refused by the full spool

    # -- what a subclass provides ------------------------------------------------------

    def _configure(
        self, spec: SinkSpec, owner: str, out_dir: Path, policy: DataPolicy | None
    ) -> None:
        """Read the subclass's own parameters of ``spec`` (``owner`` names the sink in
        errors; ``policy`` confines paths and environment variables)."""
        raise NotImplementedError

    def _rows_of(self, records: list[Record]) -> list[Any]:
        """``records`` as spool rows (JSON values)."""
        raise NotImplementedError

    async def _deliver(self, entries: list[Entry], final: bool) -> int:
        """``entries`` to the destination (``final``: the whole rest of the output),
        then off the disk; how many records went. Raises DestinationDown/Refused."""
        raise NotImplementedError

    async def _already_complete(self) -> bool:
        """Whether the destination already holds the sink's whole output."""
        raise NotImplementedError

    # -- the Sink protocol (agiledart.runtime.connectors.Sink) ---------------------------

    def write(self, records: list[Record]) -> None:
        if self._closed:
            msg = f"sink {self.id!r} is closed"
            raise ExecutionError(msg)
        if not records or self._complete:
            return
        self._rows.extend(self._rows_of(records))
        self.stats.batches += 1
        if len(self._rows) >= BATCH_ROWS:  # to disk, not to the memory's end
            self._wake.set()

    def flush(self) -> None:
        """Nothing to do: rows go out per committed epoch, or per batch in :meth:`run`."""

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    # -- checkpoints ----------------------------------------------------------------------

    async def seal(self, epoch: int) -> dict[str, Any]:
        """Barrier ``epoch`` passed: its rows wait on disk for the epoch's commit
        (:meth:`committed_epoch`); what a restore from ``epoch`` needs of this sink."""
        rows, self._rows = self._rows, []  # the barrier's moment: later rows are not E's
        async with self._lock:
            if rows and not self._complete:
                await self._put(Batch(epoch, self._columns or (), rows))
            if any(e.open for e in self.spool.entries):
                await asyncio.to_thread(self._disk, self.spool.seal_open, epoch)
        return {"epoch": epoch, "peer": self.instance}

    async def held(self, epoch: int) -> bytes:
        """The sealed epochs up to ``epoch`` not yet delivered, as the checkpoint of
        ``epoch`` keeps them (at most ``buffer_mb``): a sink restored from it on
        another peer sends them (:meth:`seed`)."""
        entries = [e for e in self.spool.entries if e.epoch is not None and e.epoch <= epoch]
        return await asyncio.to_thread(self.spool.dump, entries)

    async def seed(self, blob: bytes, resume: Mapping[str, Any]) -> None:
        """Restored on a peer other than the one that sealed the committed epoch
        (``resume``, its checkpoint): what that checkpoint held (:meth:`held`) becomes
        the spool, so the epochs committed but not delivered go out from here."""
        if resume.get("peer") in (None, self.instance):
            return  # the spool on this peer's disk is the newer
        async with self._lock:
            await asyncio.to_thread(self._disk, self.spool.load_dump, blob, self.committed)
        self._wake.set()

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
                "sink %r: its buffer (%d MiB) is full: %d %s dropped",
                self.id, self.spool.limit // (1024 * 1024), len(batch.rows), self.unit,
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
        """Send what may go out, in order, while the sink is open; a destination that
        is down is tried again with back-off. A refusal fails the app."""
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
            except DestinationDown as e:
                self._down(str(e))
                await self._sleep(delay)
                delay = min(delay * 2, RETRY_S[1])
                continue
            except DestinationRefused as e:
                msg = f"sink {self.id!r}: {self.destination} refused the {self.unit}: {e}"
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
            self._complete = await self._already_complete()
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
            await self._apply([head, *_same_epoch(head, rest)])  # together

    async def _apply(self, entries: list[Entry], *, final: bool = False) -> None:
        written = await self._deliver(entries, final)
        self._up()
        self.stats.records += written
        if final:
            self._complete = True

    def _down(self, error: str) -> None:
        if self._state == "connected" or self._since is None:
            self._since = time.time()
        if self._last_error is None or self._state == "connected":
            log.warning(
                "sink %r: %s unreachable, %s wait on disk: %s",
                self.id, self.destination, self.unit, error,
            )  # fmt: skip
        self._state, self._last_error = "retrying", error

    def _up(self) -> None:
        self._state, self._since, self._last_error = "connected", None, None

    # -- the end and status ---------------------------------------------------------------

    async def drain(self) -> None:
        """The input ended: the rows after the last checkpoint go out with everything
        still waiting; until the destination holds them all (however long it is down)."""
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
        """What waits on disk for the destination, and what the full buffer refused."""
        return {
            "buffered_rows": self.spool.rows,
            "buffered_bytes": self.spool.bytes,
            "buffer_limit_bytes": self.spool.limit,
            "buffer_overflows": self.overflowed,
        }
