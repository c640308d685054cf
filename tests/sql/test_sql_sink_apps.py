"""The sql sink in real apps: real peer processes on loopback, a keyed window whose
every result is a sum over its key's records (a record lost or repeated changes it),
a real PostgreSQL (tests/support/postgres.py) or SQLite file. The table ends equal to
the plain-Python reference when the window's peer dies, when the sink's peer restarts
(``kill -9``, started again with its state directory) and when PostgreSQL is down for
a while mid-run; meanwhile ``status`` shows the rows waiting on the sink's disk."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apps import normalise
from support.postgres import PASSWORD, Postgres
from support.processes import cli, poll
from support.sinksite import EDGE_1, GATEWAY_1, GATEWAY_2, finished, five_peers, status, submit, via
from support.sinksite import windows as site_windows

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes]

COLUMNS = ("key", "window_start", "window_end", "value", "ts")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    monkeypatch.setenv("AGILEDART_SECRET_PG", PASSWORD)  # the peers inherit it
    with five_peers(tmp_path) as cluster:
        yield cluster


def committed(cluster: LocalCluster, app_id: str, through: int) -> None:
    """Once an epoch is committed and its rows are in the table."""

    def ready() -> bool:
        s = status(cluster, app_id, through)
        return s["checkpoint"] is not None and s["totals"]["sink_records"] > 0

    poll(ready, what="a committed epoch's rows", timeout=120)
    time.sleep(1.5)  # windows pass the sink after that epoch: the failure cuts them off


def windows(name: str, sink: dict[str, Any]) -> dict[str, Any]:
    """The site's app (20,000 records) into an sql sink on gateway-1; an epoch every
    2 s, so that a failure a second after a commit finds windows emitted since (a
    sink that wrote them at once would repeat them after the rollback)."""
    return site_windows(name, "sql", sink, count=20_000, interval_ms=2_000)


def check_table(spec_raw: dict[str, Any], got: list[tuple[Any, ...]]) -> None:
    want = normalise(reference_outputs(parse_spec(spec_raw))["out"])
    rows = [dict(zip(COLUMNS, r, strict=True)) for r in got]
    assert len(rows) == len(want)
    assert canonical(rows) == canonical(want)


def pg_sink(postgres: Postgres, db: str) -> dict[str, Any]:
    url = postgres.url(db)
    return {"url": url, "password_env": "AGILEDART_SECRET_PG", "table": "windows"}


def pg_rows(postgres: Postgres, db: str) -> list[tuple[Any, ...]]:
    return postgres.query(f"SELECT {', '.join(COLUMNS)} FROM windows", db=db)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_table_is_exact_when_the_windows_peer_dies(
    site: LocalCluster, postgres: Postgres, database: str
) -> None:
    db = postgres.create_db("kill") if database == "postgresql" else ""
    sink = pg_sink(postgres, db) if db else {"table": "windows"}
    spec_raw = windows(f"{database}_kill", sink)
    app_id = submit(site, spec_raw, through=GATEWAY_2)
    committed(site, app_id, GATEWAY_2)
    site.kill(EDGE_1)
    s = finished(site, app_id, through=GATEWAY_2)
    assert s["state"] == "finished", s.get("error")
    (event,) = s["recoveries"]
    assert event["mode"] == "checkpoint"
    if db:
        got = pg_rows(postgres, db)
    else:
        path = Path(s["peers"]["gateway-1"]["sinks"]["out"]["path"])
        with contextlib.closing(sqlite3.connect(path)) as conn:
            got = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM windows").fetchall()
    check_table(spec_raw, got)


def test_postgres_table_is_exact_when_the_sinks_peer_restarts(
    site: LocalCluster, postgres: Postgres
) -> None:
    db = postgres.create_db("restart")
    spec_raw = windows("pg_restart", pg_sink(postgres, db))
    app_id = submit(site, spec_raw, through=GATEWAY_2)
    committed(site, app_id, GATEWAY_2)
    site.restart(GATEWAY_1)
    s = finished(site, app_id, through=GATEWAY_2)
    assert s["state"] == "finished", s.get("error")
    assert [e["dead"] for e in s["recoveries"]] == ["gateway-1"]
    check_table(spec_raw, pg_rows(postgres, db))


def test_postgres_down_mid_run_loses_nothing_and_status_shows_the_wait(
    site: LocalCluster, postgres: Postgres
) -> None:
    db = postgres.create_db("outage")
    spec_raw = windows("pg_outage", pg_sink(postgres, db))
    app_id = submit(site, spec_raw, through=GATEWAY_2)
    committed(site, app_id, GATEWAY_2)
    postgres.stop()
    try:

        def waiting() -> dict[str, Any] | None:
            info = status(site, app_id, GATEWAY_2)["peers"]["gateway-1"]["sinks"]["out"]
            ok = info["connection"] == "retrying" and info["buffered_rows"] > 0
            return info if ok else None

        info = poll(waiting, what="rows waiting for PostgreSQL", timeout=60)
        assert info["last_error"]
        assert info["retrying_since"] <= time.time()
        assert info["buffer_overflows"] == 0
        text = cli(site, "status", app_id, "--via", via(site, GATEWAY_2))
        assert "rows wait on disk" in text.stdout
        assert "retrying since" in text.stdout
        time.sleep(2)  # the outage goes on while the app runs
    finally:
        postgres.start()
    s = finished(site, app_id, through=GATEWAY_2)
    assert s["state"] == "finished", s.get("error")
    assert s["recoveries"] == []
    out = s["peers"]["gateway-1"]["sinks"]["out"]
    assert out["connection"] == "connected"
    assert out["buffered_rows"] == 0
    check_table(spec_raw, pg_rows(postgres, db))
