"""The sql sink in one process, against real SQLite files and a real PostgreSQL
(tests/support/postgres.py): epochs applied once, restores, the buffer on disk while
the database is down, a full buffer counted, and specs checked when they are parsed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.postgres import PASSWORD, Postgres

from agiledart.app import SpecError, parse_spec
from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec
from agiledart.cli.apps import _print_status
from agiledart.runtime.confine import DataPolicy, EnvNotAllowed, PathNotAllowed
from agiledart.runtime.connectors import open_sink
from agiledart.runtime.epochs import Epochs
from agiledart.runtime.recovery import holders_of
from agiledart.runtime.sinks import connection_of as _connection_of
from agiledart.runtime.sql import SqlSink
from agiledart.runtime.sql.db import FINAL_EPOCH, Batch, Database, Target
from agiledart.runtime.twophase import movable

Open = Callable[..., SqlSink]


def spec_of(**params: Any) -> SinkSpec:
    return SinkSpec(
        id="out", peer="p", connector="sql", inputs=("x",), params={"table": "t", **params}
    )


@pytest.fixture
async def sinks(tmp_path: Path) -> AsyncIterator[Open]:
    """Opens sql sinks whose forwarders run until the test ends."""
    tasks: list[tuple[SqlSink, asyncio.Task[None]]] = []

    def open_(resume: dict[str, Any] | None = None, **params: Any) -> SqlSink:
        sink = SqlSink(
            spec_of(**params),
            app_id="app1",
            instance="p",
            out_dir=tmp_path,
            checkpointed=True,
            resume=resume,
        )
        tasks.append((sink, asyncio.create_task(sink.run())))
        return sink

    yield open_
    for sink, task in tasks:
        sink.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def rows(path: Path, table: str = "t") -> list[tuple[Any, ...]]:
    """The table's rows, sorted ([] while it does not exist)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        known = conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        return sorted(conn.execute(f"SELECT * FROM {table}").fetchall()) if known else []


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"not within {timeout} s")


async def test_an_epoch_goes_out_only_once_it_commits(sinks: Open, tmp_path: Path) -> None:
    sink = sinks()
    sink.write([{"k": "a", "n": 1}, {"k": "b", "n": 2}])
    assert await sink.seal(1) == {"epoch": 1, "peer": "p"}
    sink.write([{"k": "c", "n": 3}])
    await sink.seal(2)
    await asyncio.sleep(0.3)
    assert rows(tmp_path / "out.db") == []
    sink.committed_epoch(1)
    await until(lambda: sink.stats.records == 2)
    assert rows(tmp_path / "out.db") == [("a", 1), ("b", 2)]
    assert sink.buffered()["buffered_rows"] == 1  # epoch 2 waits for its commit
    assert sink.connection()["state"] == "connected"


async def test_a_restore_sends_the_committed_epochs_and_forgets_the_rest(
    sinks: Open, tmp_path: Path
) -> None:
    """The peer dies after epochs 1 and 2 were sealed, before it heard that 1
    committed: reopened from epoch 1, the sink sends epoch 1; epoch 2 is replayed."""
    first = sinks()
    first.write([{"k": "a", "n": 1}])
    await first.seal(1)
    first.write([{"k": "b", "n": 2}])
    await first.seal(2)
    first.close()
    again = sinks(resume={"epoch": 1})
    again.write([{"k": "b", "n": 2}, {"k": "c", "n": 3}])  # the replay after epoch 1
    await again.drain()  # the input ended: the rest goes out with the final mark
    assert rows(tmp_path / "out.db") == [("a", 1), ("b", 2), ("c", 3)]


async def test_a_replayed_epoch_is_never_applied_twice(tmp_path: Path) -> None:
    db = Database(Target(dialect="sqlite", location=str(tmp_path / "x.db"), table="t"))
    batch = Batch(7, (("k", "TEXT"), ("n", "BIGINT")), [["a", 1], ["b", 2]])
    assert db.apply("app1", "out", "p", [batch]) == 2
    assert db.apply("app1", "out", "q", [batch]) == 0  # again, from another instance
    assert db.apply("app2", "out", "p", [batch]) == 2  # another app's epoch 7
    db.close()
    assert len(rows(tmp_path / "x.db")) == 4


async def test_after_the_whole_output_is_in_a_later_replay_writes_nothing(
    sinks: Open, tmp_path: Path
) -> None:
    done = sinks()
    done.write([{"k": "a", "n": 1}])
    await done.drain()
    replay = sinks(resume=None)  # a failure elsewhere restarted the app from its start
    replay.write([{"k": "a", "n": 1}])
    await replay.drain()
    assert rows(tmp_path / "out.db") == [("a", 1)]
    assert rows(tmp_path / "out.db", "agiledart_sink_epochs")[0][3] == FINAL_EPOCH


async def test_upsert_keeps_one_row_per_key_with_the_last_values(
    sinks: Open, tmp_path: Path
) -> None:
    sink = sinks(upsert_on=["k"], columns={"k": "TEXT", "n": "BIGINT"})
    sink.write([{"k": "a", "n": 1}, {"k": "b", "n": 2}])
    await sink.seal(1)
    sink.write([{"k": "a", "n": 5, "extra": True}])
    await sink.seal(2)
    sink.committed_epoch(2)
    await sink.drain()
    assert rows(tmp_path / "out.db") == [("a", 5), ("b", 2)]


async def test_a_database_that_is_down_keeps_rows_on_disk_across_a_restart_and_in_order(
    postgres: Postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = postgres.create_db("outage")
    url = postgres.url(db)
    monkeypatch.setenv("AGILEDART_SECRET_PG", PASSWORD)
    params = {"url": url, "password_env": "AGILEDART_SECRET_PG", "table": "t"}

    def open_(resume: dict[str, Any] | None = None) -> SqlSink:
        return SqlSink(
            spec_of(**params),
            app_id="app1",
            instance="p",
            out_dir=tmp_path,
            checkpointed=True,
            resume=resume,
        )

    postgres.stop()
    try:
        sink = open_()
        task = asyncio.create_task(sink.run())
        for e in (1, 2, 3):
            sink.write([{"e": e, "i": i} for i in range(100)])
            await sink.seal(e)
        sink.committed_epoch(3)
        await until(lambda: sink.connection()["state"] == "retrying")
        c = sink.connection()
        assert c["since"] is not None
        assert c["last_error"]
        assert sink.buffered()["buffered_rows"] == 300
        sink.close()  # the peer restarts: the rows wait on its disk
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        postgres.start()
    again = open_(resume={"epoch": 3})
    task = asyncio.create_task(again.run())
    try:
        await until(lambda: again.buffered()["buffered_rows"] == 0)
    finally:
        again.close()
        await asyncio.gather(task, return_exceptions=True)
    got = postgres.query("SELECT e, i FROM t ORDER BY e, i", db=db)
    assert got == [(e, i) for e in (1, 2, 3) for i in range(100)]
    applied = postgres.query("SELECT epoch FROM agiledart_sink_epochs ORDER BY applied_at", db)
    assert applied == [(1,), (2,), (3,)]  # in order


async def test_a_full_buffer_drops_whole_epochs_and_counts_them(
    sinks: Open, tmp_path: Path
) -> None:
    sink = sinks(url="postgresql://nobody@127.0.0.1:1/none", buffer_mb=1)
    big = "x" * 1000
    for e in range(1, 5):
        sink.write([{"e": e, "s": big} for _ in range(400)])  # about 0.4 MB an epoch
        await sink.seal(e)
    b = sink.buffered()
    assert b["buffer_overflows"] == 2
    assert sink.stats.dropped == 800
    assert b["buffered_rows"] == 800
    assert b["buffered_bytes"] <= b["buffer_limit_bytes"] == 1024 * 1024


def test_specs_are_checked_when_parsed() -> None:
    def app(params: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": "q",
            "sources": [
                {
                    "id": "s",
                    "peer": "a",
                    "connector": "generator",
                    "params": {"dataset": "counter", "rate": 10, "count": 10},
                },
            ],
            "operators": [],
            "sinks": [
                {"id": "o", "peer": "b", "connector": "sql", "params": params, "inputs": ["s"]}
            ],
        }

    assert parse_spec(app({"table": "ok"})).sinks[0].params["buffer_mb"] == 64
    bad = [
        ({"table": "no such"}, "table"),
        ({"table": "t", "url": "mysql://x"}, "url"),
        ({"table": "t", "columns": {"a": "TEXT; DROP TABLE t"}}, "columns"),
        ({"table": "t", "columns": {"a": "TEXT"}, "upsert_on": ["b"]}, "upsert_on"),
        ({"table": "t", "url": "sqlite:///x.db", "password_env": "X"}, "password_env"),
    ]
    for params, field in bad:
        with pytest.raises(SpecError, match=field):
            parse_spec(app(params))


def test_a_peer_confines_the_sql_sink(tmp_path: Path) -> None:
    policy = DataPolicy.of(tmp_path)
    out = policy.sink_dir("app1")
    with pytest.raises(PathNotAllowed):
        open_sink(spec_of(url="sqlite:////etc/x.db"), out_dir=out, policy=policy)
    pg = spec_of(url="postgresql://u@127.0.0.1:5432/db", password_env="HOME")
    with pytest.raises(EnvNotAllowed):
        open_sink(pg, out_dir=out, policy=policy)
    sink = open_sink(spec_of(), out_dir=out, policy=policy)
    assert sink.path == out / "out.db"
    sink.close()


def test_two_instances_applying_one_epoch_at_once_apply_it_once(postgres: Postgres) -> None:
    """An old instance still finishing its transaction while the restored one sends the
    same epoch: the second waits for the first, finds the epoch recorded, skips it."""
    db = postgres.create_db("race")
    target = Target(dialect="postgresql", location=postgres.url(db), table="t", password=PASSWORD)
    batch = Batch(3, (("n", "BIGINT"),), [[i] for i in range(1000)])
    first, second = Database(target), Database(target)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda d: d.apply("app1", "out", "p", [batch]), [first, second]))
    first.close()
    second.close()
    assert sorted(done) == [0, 1000]
    assert postgres.query("SELECT count(*) FROM t", db) == [(1000,)]


async def test_a_table_with_other_columns_fails_the_sink_with_the_databases_reason(
    tmp_path: Path,
) -> None:
    with contextlib.closing(sqlite3.connect(tmp_path / "out.db")) as conn:
        conn.execute("CREATE TABLE t (other TEXT)")
    sink = SqlSink(spec_of(), app_id="app1", instance="p", out_dir=tmp_path, checkpointed=True)
    task = asyncio.create_task(sink.run())
    sink.write([{"k": "a", "n": 1}])
    await sink.seal(1)
    sink.committed_epoch(1)
    with pytest.raises(ExecutionError, match=r"sink 'out': the database refused .*column"):
        await asyncio.wait_for(task, 10)
    sink.close()


async def test_a_long_epoch_waits_on_disk_not_in_memory_and_goes_out_whole(
    sinks: Open, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agiledart.runtime.twophase.BATCH_ROWS", 100)
    sink = sinks()
    for i in range(10):
        sink.write([{"k": f"{i}-{j}", "n": i} for j in range(50)])
        await asyncio.sleep(0.05)  # the forwarder moves what passed 100 rows to disk
    assert sink.buffered()["buffered_rows"] >= 400  # on disk before the barrier
    await sink.seal(1)
    sink.write([{"k": "next", "n": 99}])  # epoch 2's
    assert sink.buffered()["buffered_rows"] == 500
    sink.committed_epoch(1)
    await until(lambda: sink.stats.records == 500)
    assert len(rows(tmp_path / "out.db")) == 500
    epochs = rows(tmp_path / "out.db", "agiledart_sink_epochs")
    assert [e[3] for e in epochs] == [1]  # one epoch, applied once


async def test_rows_of_an_unsealed_epoch_on_disk_are_forgotten_by_a_restore(
    sinks: Open, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agiledart.runtime.twophase.BATCH_ROWS", 100)
    first = sinks()
    first.write([{"k": str(j), "n": 1} for j in range(300)])
    await until(lambda: first.buffered()["buffered_rows"] == 300)
    first.close()  # died before the barrier: those rows are replayed
    again = sinks(resume={"epoch": 0})
    assert again.buffered()["buffered_rows"] == 0


async def test_status_shows_what_waits_and_what_a_full_buffer_dropped(
    sinks: Open, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = sinks(url="postgresql://nobody@127.0.0.1:1/none", buffer_mb=1)
    for e in (1, 2, 3):
        sink.write([{"e": e, "s": "x" * 1000} for _ in range(400)])
        await sink.seal(e)
    await until(lambda: sink.connection()["state"] == "retrying")
    info = {"path": None, **_connection_of(sink)}
    _print_status({"app_id": "a", "name": "q", "state": "running", "sinks": {"out": "p"},
                   "peers": {"p": {"sinks": {"out": info}}}})  # fmt: skip
    line = next(x for x in capsys.readouterr().out.splitlines() if "sink out" in x)
    assert "retrying since" in line
    assert "800 rows wait on disk" in line
    assert "1 batches dropped (buffer full)" in line


async def test_what_a_checkpoint_held_goes_out_from_another_peer(tmp_path: Path) -> None:
    """Epochs 1 and 2 sealed on peer p, 1 delivered, 2 committed but not sent when p
    dies: the checkpoint of epoch 2 holds epoch 2 only (and never what came after),
    and a sink restored from it on peer q (an empty disk) sends it. Restored on p
    itself, the sink keeps its own spool."""
    spec = spec_of(url=f"sqlite:///{tmp_path / 'shared.db'}")
    (tmp_path / "p").mkdir()
    (tmp_path / "q").mkdir()

    def open_(peer: str, resume: dict[str, Any] | None = None) -> SqlSink:
        return SqlSink(
            spec, app_id="app1", instance=peer, out_dir=tmp_path / peer,
            checkpointed=True, resume=resume,
        )  # fmt: skip

    first = open_("p")
    run = asyncio.create_task(first.run())
    first.write([{"k": "a", "n": 1}])
    await first.seal(1)
    first.committed_epoch(1)
    await until(lambda: first.stats.records == 1)
    first.write([{"k": "b", "n": 2}])
    resume = await first.seal(2)
    first.write([{"k": "c", "n": 3}])  # after barrier 2: replayed, never in its state
    await first._spill(pending=True)
    held = await first.held(2)
    first.close()
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    assert resume == {"epoch": 2, "peer": "p"}

    moved = open_("q", resume)
    await moved.seed(held, resume)
    assert moved.buffered()["buffered_rows"] == 1
    moved.write([{"k": "c", "n": 3}])  # the replay after epoch 2
    run = asyncio.create_task(moved.run())
    await moved.drain()
    moved.close()
    await asyncio.gather(run, return_exceptions=True)
    assert rows(tmp_path / "shared.db") == [("a", 1), ("b", 2), ("c", 3)]

    same = open_("p", resume)  # p's own spool is the newer: nothing from the blob
    await same.seed(held, resume)
    assert same.buffered()["buffered_rows"] == 1  # epoch 2, from p's disk
    same.close()


def test_network_sinks_move_and_file_writing_ones_stay() -> None:
    def sink(connector: str, **params: Any) -> SinkSpec:
        return SinkSpec(id="k", peer="p", connector=connector, inputs=("x",), params=params)

    assert movable(sink("sql", url="postgresql://u@127.0.0.1:5432/db", table="t"))
    assert movable(sink("http", url="http://127.0.0.1/in"))
    assert movable(sink("mqtt", broker="127.0.0.1:1883", topic="t"))
    assert not movable(sink("sql", table="t"))  # SQLite under the peer's data root
    assert not movable(sink("sql", url="sqlite:///x.db", table="t"))
    assert not movable(sink("file", path="out.jsonl"))


def test_what_a_network_sink_stored_counts_in_the_checkpoint_and_its_holders() -> None:
    """The commit's ``bytes`` add what the sink stored to the states', and its holders
    are among those told to drop older fragments."""
    epochs = Epochs()
    epochs.cut(None, generation=0, now=0.0)
    pending = epochs.pending
    assert pending is not None
    kept = {"instance": "out@p", "holders": [["h", ["10.0.0.7", 7]]], "m": 1, "k": 0}
    commit = {"epoch": 1, "peer": "p", "state": {**kept, "bytes": 12, "seconds": 0.1}}
    pending.note({"kind": "sink", "id": "out", "commit": commit})
    state = {"peer": "q", "ops": ["c"], "instance": "c@q", "holders": [["g", ["10.0.0.8", 8]]]}
    pending.note({"kind": "state", **state, "m": 1, "k": 0, "bytes": 30, "seconds": 0.2})
    committed = epochs.commit(set(), now=1.0, at=1.0)
    assert committed["bytes"] == 42
    assert committed["sinks"] == {"out": commit}
    assert holders_of(committed) == {("10.0.0.7", 7), ("10.0.0.8", 8)}
