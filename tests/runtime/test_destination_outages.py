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

import json
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.properties import Properties
from support.apps import normalise
from support.mqtt import Broker, mosquitto_binary
from support.postgres import PASSWORD, Postgres, remove, start_postgres
from support.processes import cli, cli_json, formed_cluster, free_port, poll
from support.webhook import Receiver, running_receiver

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.timeout(300)]

SENSOR_1, SENSOR_2, GATEWAY_1, GATEWAY_2, EDGE_1 = range(5)
OUTAGE_S = 30.0
RATE = 1_000  #: readings a second: they flow through the whole outage
COUNT = 48_000
ID = "agiledart-id"
COLUMNS = ("key", "window_start", "window_end", "value", "ts")
PG_ENV = "AGILEDART_SECRET_PG"
#: the sinks that must lose nothing, and the one whose buffer overflows
EXACT = ("to_mqtt", "to_sql", "to_http")
SMALL = "raw_mqtt"
#: its topic: each reading takes about 60 bytes on its disk, so 1 MiB holds some 18 s of
#: readings: the outage's overflow it, the epochs waiting for a commit do not (a longer
#: topic overflowed them too on a loaded machine, epochs committing seconds apart)
RAW_TOPIC = "raw/{key}"


class Consumer:
    """A paho MQTT 5 client with a session the broker keeps through its restart: every
    message on ``out/#`` with its ``agiledart-id``."""

    def __init__(self, broker: Broker) -> None:
        self.messages: list[tuple[bytes, str | None]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=f"outage-consumer-{broker.port}",
            protocol=paho.MQTTv5,
        )
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.client.on_connect = lambda client, *_: client.subscribe("out/#", qos=1)
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.port = broker.port

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        props: Properties | None = getattr(msg, "properties", None)
        user = dict(getattr(props, "UserProperty", []) or [])
        with self._lock:
            self.messages.append((bytes(msg.payload), user.get(ID)))

    def __enter__(self) -> Consumer:
        props = Properties(paho.PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 3600
        self.client.connect(
            "127.0.0.1", self.port, keepalive=10, clean_start=False, properties=props
        )
        self.client.loop_start()
        assert self._subscribed.wait(20), "the consumer got no SUBACK"
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def deduplicated(self) -> list[dict[str, Any]]:
        """The records of the messages whose id is new, in arrival order."""
        with self._lock:
            messages = list(self.messages)
        seen: set[str] = set()
        kept = []
        for payload, mid in messages:
            assert mid is not None, "a message without its id"
            if mid not in seen:
                seen.add(mid)
                kept.append(json.loads(payload))
        return kept


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    pg = start_postgres()
    try:
        yield pg
    finally:
        remove(pg)


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
    with formed_cluster(tmp_path / "site", 5, ["--workers", "0"]) as cluster:
        yield cluster


def via(cluster: LocalCluster) -> str:
    return "{}:{}".format(*cluster.address(GATEWAY_2))


def status(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    return dict(cli_json(cluster, "status", app_id, "--via", via(cluster)))


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
    return {
        "name": "outage",
        "checkpoint": {"mode": "erasure", "interval_ms": 1_000, "m": 2, "k": 1},
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "counter", "rate": RATE, "count": COUNT, "keys": 16},
            }
        ],
        "operators": [
            {
                "id": "per_key",
                "op": "window",
                "params": {"size_ms": 500, "key": "key", "aggregate": "sum", "field": "seq"},
                "inputs": ["readings"],
                "peer": "edge-1",
            }
        ],
        "sinks": [
            sink("to_mqtt", "mqtt", {**mqtt, "topic": "out/{key}"}, "per_key"),
            sink("to_sql", "sql", sql, "per_key"),
            sink("to_http", "http", {"url": url, "batch_records": 7}, "per_key"),
            sink(SMALL, "mqtt", {**mqtt, "topic": RAW_TOPIC, "buffer_mb": 1}, "readings"),
        ],
    }


def test_a_30s_outage_of_every_destination_at_once_loses_nothing(
    site: LocalCluster, broker: Broker, postgres: Postgres, receiver: Receiver
) -> None:
    db = postgres.create_db("outage")
    spec_raw = fanned_out(broker, postgres.url(db), receiver.url)
    want = reference_outputs(parse_spec(spec_raw))
    with Consumer(broker) as consumer:
        assert site.workdir is not None
        path = site.workdir / "outage.yaml"
        path.write_text(yaml.safe_dump(spec_raw))
        app_id = str(cli_json(site, "submit", str(path), "--via", via(site))["app_id"])

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
            text = cli(site, "status", app_id, "--via", via(site)).stdout
        finally:
            receiver.status = 200
            postgres.start()
            broker.start()

        # the full buffer: reported in status, in the plain status and in the peer's log
        assert small["buffer_overflows"] > 0
        assert small["dropped"] > 0
        assert small["buffered_bytes"] <= small["buffer_limit_bytes"] == 1024 * 1024
        assert "dropped (buffer full)" in text
        log = (site.workdir / "gateway-1.log").read_text(errors="replace")
        assert f"sink '{SMALL}': its buffer (1 MiB) is full" in log

        def done() -> dict[str, Any] | None:
            s = status(site, app_id)
            return s if s["state"] in ("finished", "failed", "stopped") else None

        s = poll(done, what="the app to end", timeout=180)
        assert s["state"] == "finished", s.get("error")
        assert s["recoveries"] == []
        for k in EXACT:
            assert sinks_of(s)[k]["buffered_rows"] == 0, k

        # mqtt: what a consumer that drops repeated ids keeps
        ref = normalise(want["to_mqtt"])
        poll(lambda: len(consumer.deduplicated()) >= len(ref), what="every mqtt result")
        time.sleep(0.5)  # one too many would show now
        got = consumer.deduplicated()
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
