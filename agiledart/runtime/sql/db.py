"""The database a ``sql`` sink writes: SQLite (stdlib ``sqlite3``) or PostgreSQL
(``psycopg`` 3), behind one small synchronous interface that the sink calls from its
own thread. The only module that imports ``psycopg``: driver failures become
:class:`DatabaseDown` (cannot reach it now: the sink keeps its rows and tries again)
or :class:`DatabaseRefused` (the statement can never succeed: the app fails).

Every call of :meth:`Database.apply` is one transaction: the rows of the epochs it is
given go into the table, and each epoch is recorded in the bookkeeping table
``agiledart_sink_epochs`` (app, sink, instance, epoch) in the same transaction. An
epoch already recorded there is skipped, so a replayed epoch is never applied twice.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors

from agiledart.app.errors import ExecutionError
from agiledart.runtime.spool import FINAL_EPOCH, Batch
from agiledart.runtime.twophase import DestinationDown, DestinationRefused

__all__ = [
    "EPOCHS_TABLE",
    "FINAL_EPOCH",
    "Batch",
    "Database",
    "DatabaseDown",
    "DatabaseRefused",
    "Target",
    "column_type",
]

#: the bookkeeping table: which epochs of which sink a database holds
EPOCHS_TABLE = "agiledart_sink_epochs"
#: seconds a PostgreSQL connection attempt may take
CONNECT_TIMEOUT_S = 3


class DatabaseDown(DestinationDown):
    """The database cannot be reached now (refused, gone, locked): try again later."""


class DatabaseRefused(DestinationRefused):
    """The database refused a statement that cannot succeed later (a wrong column,
    type or constraint): the sink cannot write its table."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """Where a sink writes: a SQLite file or a PostgreSQL connection string, a table."""

    dialect: str  #: "sqlite" or "postgresql"
    location: str  #: the SQLite file, or the PostgreSQL conninfo URL
    table: str
    upsert_on: tuple[str, ...] = ()
    password: str | None = None


def column_type(value: Any) -> str:
    """The SQL type a column gets from its first record's ``value``."""
    if isinstance(value, bool):
        return "BOOLEAN"
    if isinstance(value, int):
        return "BIGINT"
    if isinstance(value, float):
        return "DOUBLE PRECISION"
    return "TEXT"


def _quote(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):  # checked with the spec too
        msg = f"not an SQL identifier: {name!r}"
        raise DatabaseRefused(msg)
    return f'"{name}"'


class Database:
    """One connection to a sink's database, opened on first use and again after a
    failure. Not thread-safe: one thread calls it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._conn: Any = None
        self._ready: set[str] = set()  #: tables known to exist on this connection
        self._mark = "?" if target.dialect == "sqlite" else "%s"

    # -- connection ------------------------------------------------------------------

    def _connect(self) -> Any:
        t = self.target
        if t.dialect == "sqlite":
            Path(t.location).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(t.location, timeout=5.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            return conn
        return psycopg.connect(t.location, password=t.password, connect_timeout=CONNECT_TIMEOUT_S)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._ready.clear()
        if conn is not None:
            with suppress(sqlite3.Error, psycopg.Error):
                conn.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Driver failures as DatabaseDown or DatabaseRefused; a failed connection is
        dropped (the next call opens a new one)."""
        try:
            yield
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            self.close()
            raise DatabaseDown(_first_line(e)) from e
        except psycopg.Error as e:
            self._rollback()
            raise DatabaseRefused(_first_line(e)) from e
        except sqlite3.OperationalError as e:
            self._rollback()
            text = str(e)
            if any(w in text for w in ("locked", "unable to open", "disk I/O", "busy")):
                self.close()
                raise DatabaseDown(text) from e
            raise DatabaseRefused(text) from e
        except sqlite3.Error as e:
            self._rollback()
            raise DatabaseRefused(str(e)) from e
        except OSError as e:
            self.close()
            raise DatabaseDown(e.strerror or str(e)) from e

    def _rollback(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            if self.target.dialect == "sqlite":
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            else:
                conn.rollback()
        except (sqlite3.Error, psycopg.Error):
            self.close()

    def _cursor(self) -> Any:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn.cursor()

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        with self._errors():
            cur = self._cursor()
            if self.target.dialect == "sqlite":
                cur.execute("BEGIN IMMEDIATE")
            yield cur
            if self.target.dialect == "sqlite":
                cur.execute("COMMIT")
            else:
                self._conn.commit()

    # -- statements ------------------------------------------------------------------

    def applied(self, app: str, sink: str, epoch: int) -> bool:
        """Whether ``epoch`` of ``sink`` (``FINAL_EPOCH``: its whole output) is in."""
        self._bookkeeping()
        with self._transaction() as cur:
            return self._has(cur, app, sink, epoch)

    def apply(
        self, app: str, sink: str, instance: str, batches: Sequence[Batch], *, final: bool = False
    ) -> int:
        """In one transaction: every batch's rows (an epoch's unless it is recorded
        already; an epoch may come in several batches) and its epoch recorded; with
        ``final`` also ``FINAL_EPOCH``. The rows written."""
        written = 0
        self._bookkeeping()
        columns = next((b.columns for b in batches if b.rows), None)
        if columns is not None:
            self._table(columns)
        with self._transaction() as cur:
            fresh: dict[int, bool] = {}  #: epoch -> whether this transaction records it
            if final:  # the whole output: all or (already there) nothing
                fresh[FINAL_EPOCH] = self._record(cur, app, sink, instance, FINAL_EPOCH)
                if not fresh[FINAL_EPOCH]:
                    return 0
            for batch in batches:
                # recorded first: a sink applying the same epoch at the same moment (an
                # old instance still finishing) waits for it, then finds it recorded
                epoch = batch.epoch
                if epoch is not None and epoch not in fresh:
                    fresh[epoch] = self._record(cur, app, sink, instance, epoch)
                if epoch is not None and not fresh[epoch]:
                    continue
                if batch.rows:
                    cur.executemany(self._insert(batch.columns), batch.rows)
                    written += len(batch.rows)
        return written

    def _bookkeeping(self) -> None:
        self._create(
            EPOCHS_TABLE,
            f"CREATE TABLE IF NOT EXISTS {EPOCHS_TABLE} (app TEXT NOT NULL, "
            "sink TEXT NOT NULL, instance TEXT NOT NULL, epoch BIGINT NOT NULL, "
            "applied_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (app, sink, epoch))",
        )

    def _create(self, name: str, sql: str) -> None:
        """``CREATE TABLE IF NOT EXISTS`` in a transaction of its own. Two PostgreSQL
        sessions making one table at once: the second fails on a unique index of the
        catalogue; the table is there then, which is all that is asked."""
        if name in self._ready:
            return
        with self._errors():
            cur = self._cursor()
            if self.target.dialect == "sqlite":
                cur.execute(sql)
            else:
                try:
                    cur.execute(sql)
                    self._conn.commit()
                except (
                    psycopg.errors.UniqueViolation,
                    psycopg.errors.DuplicateTable,
                    psycopg.errors.DuplicateObject,
                ):
                    self._conn.rollback()
        self._ready.add(name)

    def _has(self, cur: Any, app: str, sink: str, epoch: int) -> bool:
        m = self._mark
        cur.execute(
            f"SELECT 1 FROM {EPOCHS_TABLE} WHERE app = {m} AND sink = {m} AND epoch = {m}",
            (app, sink, epoch),
        )
        return cur.fetchone() is not None

    def _record(self, cur: Any, app: str, sink: str, instance: str, epoch: int) -> bool:
        """Record ``epoch``; False if it was recorded already."""
        m = self._mark
        cur.execute(
            f"INSERT INTO {EPOCHS_TABLE} (app, sink, instance, epoch, applied_at) "
            f"VALUES ({m}, {m}, {m}, {m}, {m}) ON CONFLICT (app, sink, epoch) DO NOTHING",
            (app, sink, instance, epoch, time.time()),
        )
        return bool(cur.rowcount == 1)

    def _table(self, columns: tuple[tuple[str, str], ...]) -> None:
        t = self.target
        cols = [f"{_quote(n)} {typ}" for n, typ in columns]
        if t.upsert_on:
            cols.append(f"PRIMARY KEY ({', '.join(_quote(c) for c in t.upsert_on)})")
        self._create(t.table, f"CREATE TABLE IF NOT EXISTS {_quote(t.table)} ({', '.join(cols)})")

    def _insert(self, columns: tuple[tuple[str, str], ...]) -> str:
        t = self.target
        names = [n for n, _ in columns]
        sql = (
            f"INSERT INTO {_quote(t.table)} ({', '.join(_quote(n) for n in names)}) "
            f"VALUES ({', '.join(self._mark for _ in names)})"
        )
        if not t.upsert_on:
            return sql
        keys = ", ".join(_quote(c) for c in t.upsert_on)
        rest = [n for n in names if n not in t.upsert_on]
        if not rest:
            return f"{sql} ON CONFLICT ({keys}) DO NOTHING"
        sets = ", ".join(f"{_quote(n)} = excluded.{_quote(n)}" for n in rest)
        return f"{sql} ON CONFLICT ({keys}) DO UPDATE SET {sets}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def location_of(url: str) -> tuple[str, str]:
    """``(dialect, location)`` of a sink's ``url``: a SQLite path as given after
    ``sqlite:///`` (absolute when it starts with ``/``), or the PostgreSQL URL."""
    if url.startswith("sqlite:///"):
        return "sqlite", url[len("sqlite:///") :]
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql", url
    msg = f"unknown database url {url!r}: use sqlite:///FILE or postgresql://USER@HOST:PORT/DB"
    raise ExecutionError(msg)


def password_of(env: str) -> str:
    """The password in the peer's environment variable ``env``."""
    value = os.environ.get(env)
    if value is None:
        msg = f"password_env names {env!r}, which is not set in this peer's environment"
        raise ExecutionError(msg)
    return value
