"""The ``sql`` sink: a peer's driver of :class:`~agiledart.runtime.sql.db.Database`
through the shared two-phase machinery (:mod:`agiledart.runtime.twophase`) and its
:class:`~agiledart.runtime.spool.Spool` (see the package's theory of operation)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from agiledart.app.spec import SinkSpec
from agiledart.operators import Record
from agiledart.runtime.spool import FINAL_EPOCH, Entry
from agiledart.runtime.sql.db import Database, Target, column_type, location_of, password_of
from agiledart.runtime.twophase import BATCH_ROWS, DEFAULT_BUFFER_MB, RETRY_S, SpooledSink

if TYPE_CHECKING:
    from agiledart.runtime.confine import DataPolicy

__all__ = ["BATCH_ROWS", "DEFAULT_BUFFER_MB", "RETRY_S", "SqlSink"]

T = TypeVar("T")

#: the store-and-forward buffer of a sink that sets no ``buffer_mb``


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


class SqlSink(SpooledSink):
    """Rows of an app's records into a table: per epoch, after its checkpoint commits
    (``checkpointed``), else in batches; through a spool on disk while the database
    is down."""

    destination: ClassVar[str] = "the database"
    path: Path | None = None

    def _configure(
        self, spec: SinkSpec, owner: str, out_dir: Path, policy: DataPolicy | None
    ) -> None:
        p = spec.params
        dialect, location = location_of(str(p.get("url", f"sqlite:///{spec.id}.db")))
        if dialect == "sqlite":
            if policy is None:
                location = str(out_dir / location)
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
        if declared:
            self._columns = tuple((str(k), str(v)) for k, v in declared.items())
        self._db = Database(self.target)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, f"sql-{spec.id}")

    def _rows_of(self, records: list[Record]) -> list[Any]:
        if self._columns is None:
            first = records[0]
            self._columns = tuple((str(k), column_type(first[k])) for k in sorted(first, key=str))
        names = [n for n, _ in self._columns]
        return [[_value(r.get(n)) for n in names] for r in records]

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        self._thread.submit(self._db.close)
        self._thread.shutdown(wait=False)

    async def _already_complete(self) -> bool:
        return await self._call(self._db.applied, self.app_id, self.id, FINAL_EPOCH)

    async def _deliver(self, entries: list[Entry], final: bool) -> int:
        return await self._call(self._send, entries, final)  # one transaction

    def _send(self, entries: list[Entry], final: bool) -> int:
        """In the database's thread: ``entries`` into the database, then off the disk."""
        batches = [self.spool.load(e) for e in entries]
        written = self._db.apply(self.app_id, self.id, self.instance, batches, final=final)
        self.spool.remove(entries)
        return written

    async def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, lambda: fn(*args, **kw))
