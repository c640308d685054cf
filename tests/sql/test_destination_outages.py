"""A 30 s outage of every network destination at once loses nothing.

Real peer processes on loopback; one checkpointed app whose keyed window (every result
a sum over its key's records: a record lost or repeated changes it) feeds three
exactly-once sinks at once: ``mqtt`` (a real Mosquitto with persistence), ``sql``
(a real PostgreSQL) and ``http`` (a real aiohttp receiver). Mid-run, while records
flow, the broker and PostgreSQL are stopped and the receiver answers 503, all for
30 s; then all three come back. What each destination ends with is exactly the
plain-Python reference (mqtt: after the consumer drops repeated ``agiledart-id``
values; http: after the receiver drops repeated ``Idempotency-Key`` values).

A fourth sink, ``mqtt`` with ``buffer_mb: 1`` on the raw readings, cannot hold the
outage's records: its full buffer is reported (``buffer_overflows`` and ``dropped``
in ``status``, a warning in its peer's log), never silent.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apps import normalise
from support.mqtt import Broker, Consumer, mosquitto_binary
from support.postgres import PASSWORD, Postgres
from support.processes import cli, free_port, poll
from support.sinksite import GATEWAY_2, finished, five_peers, status, submit, via, windows
from support.webhook import Receiver, running_receiver

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.timeout(300)]

OUTAGE_S = 30.0
RATE = 1_000  #: readings a second: they flow through the whole outage
COUNT = 48_000
COLUMNS = ("key", "window_start", "window_end", "value", "ts")
PG_ENV = "AGILEDART_SECRET_PG"
#: the sinks that must lose nothing, and the one whose buffer overflows
EXACT = ("to_mqtt", "to_sql", "to_http")
SMALL = "raw_mqtt"
#: its topic: each reading takes about 60 bytes on its disk, so 1 MiB holds some 18 s of
#: readings: the outage's overflow it, the epochs waiting for a commit do not (a longer
#: topic overflowed them too on a loaded machine, epochs committing seconds apart)
RAW_TOPIC = "raw/{key}"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    mosquitto_binary()
    workdir = Path(tempfile.mkdtemp(prefix="broker-", dir=tmp_path))
    b = Broker(workdir, free_port(), persistence=True)  # the consumer's session survives
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    monkeypatch.setenv(PG_ENV, PASSWORD)  # the peers inherit it
    with five_peers(tmp_path / "site") as cluster:
        yield cluster


def sinks_of(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for p in s["peers"].values() for k, v in p["sinks"].items()}


def fanned_out(broker: Broker, pg_url: str, url: str) -> dict[str, Any]:
    """generator (``RATE`` a second) -> keyed 500 ms window (sum) on edge-1 -> mqtt,
    sql (PostgreSQL) and http sinks on gateway-1, an epoch a second; and the raw
    readings to an mqtt sink with a 1 MiB buffer."""

    def sink(sid: str, connector: str, params: dict[str, Any], inp: str) -> dict[str, Any]:
        return {"id": sid, "peer": "gateway-1", "connector": connector, "params": params,
                "inputs": [inp]}  # fmt: skip

    mqtt = {"broker": broker.address, "delivery": "exactly-once"}
    sql = {"url": pg_url, "password_env": PG_ENV, "table": "windows"}
    spec = windows("outage", "mqtt", {}, count=COUNT, rate=RATE)
    out = {**mqtt, "topic": "out/{key}", "id_in_payload": True}
    spec["sinks"] = [
        sink("to_mqtt", "mqtt", out, "per_key"),
        sink("to_sql", "sql", sql, "per_key"),
        sink("to_http", "http", {"url": url, "batch_records": 7}, "per_key"),
        sink(SMALL, "mqtt", {**mqtt, "topic": RAW_TOPIC, "buffer_mb": 1}, "readings"),
    ]
    return spec


def test_a_30s_outage_of_every_destination_at_once_loses_nothing(
    site: LocalCluster, broker: Broker, postgres: Postgres, receiver: Receiver
) -> None:
    db = postgres.create_db("outage")
    spec_raw = fanned_out(broker, postgres.url(db), receiver.url)
    want = reference_outputs(parse_spec(spec_raw))
    with Consumer(broker, "out/#") as consumer:
        app_id = submit(site, spec_raw)

        def delivering() -> bool:  # a committed epoch reached every destination
            s = status(site, app_id)
            out = sinks_of(s)
            return s["checkpoint"] is not None and all(out[k]["records"] > 0 for k in EXACT)

        poll(delivering, what="a committed epoch at every destination", timeout=120)
        before = status(site, app_id)
        assert sinks_of(before)[SMALL]["buffer_overflows"] == 0  # it is the outage's doing
        broker.stop()
        postgres.stop()
        receiver.status = 503
        down = time.monotonic()
        try:

            def waiting() -> dict[str, dict[str, Any]] | None:
                out = sinks_of(status(site, app_id))
                ok = all(
                    out[k]["connection"] == "retrying" and out[k]["buffered_rows"] > 0
                    for k in EXACT
                )
                return out if ok else None

            out = poll(waiting, what="every sink waiting for its destination", timeout=OUTAGE_S)
            for k in EXACT:
                assert out[k]["buffer_overflows"] == 0, k
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
            s = status(site, app_id)
            assert s["state"] == "running"  # records flowed through the whole outage
            assert s["totals"]["source_records"] > before["totals"]["source_records"]
            small = sinks_of(s)[SMALL]
            text = cli(site, "status", app_id, "--via", via(site, GATEWAY_2)).stdout
        finally:
            receiver.status = 200
            postgres.start()
            broker.start()

        # the full buffer: reported in status, in the plain status and in the peer's log
        assert small["buffer_overflows"] > 0
        assert small["dropped"] > 0
        assert small["buffered_bytes"] <= small["buffer_limit_bytes"] == 1024 * 1024
        assert "dropped (buffer full)" in text
        assert site.workdir is not None
        log = (site.workdir / "gateway-1.log").read_text(errors="replace")
        assert f"sink '{SMALL}': its buffer (1 MiB) is full" in log

        s = finished(site, app_id)
        assert s["state"] == "finished", s.get("error")
        assert s["recoveries"] == []
        for k in EXACT:
            assert sinks_of(s)[k]["buffered_rows"] == 0, k

        # mqtt: what a consumer that drops repeated ids keeps
        ref = normalise(want["to_mqtt"])
        poll(lambda: len(consumer.deduplicated()[0]) >= len(ref), what="every mqtt result")
        time.sleep(0.5)  # one too many would show now
        got, _ = consumer.deduplicated()
        assert len(got) == len(ref)
        assert canonical(got) == canonical(ref)

    # sql: the table
    rows = postgres.query(f"SELECT {', '.join(COLUMNS)} FROM windows", db=db)
    ref = normalise(want["to_sql"])
    table = [dict(zip(COLUMNS, r, strict=True)) for r in rows]
    assert len(table) == len(ref)
    assert canonical(table) == canonical(ref)

    # http: what a receiver that drops repeated Idempotency-Keys keeps
    ref = normalise(want["to_http"])
    kept = receiver.records()
    assert receiver.answered(503) > 0
    assert len(kept) == len(ref)
    assert canonical(kept) == canonical(ref)
