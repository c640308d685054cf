"""A network sink (sql to PostgreSQL, http, mqtt with ``delivery: exactly-once``)
moves to another peer when its peer dies for good, and what it held goes with it.

Real peer processes on loopback and a real destination: PostgreSQL
(tests/support/postgres.py), an aiohttp receiver (tests/support/webhook.py) or
Mosquitto with a paho MQTT 5 consumer (tests/support/mqtt.py). The destination is
down from the start, so every committed epoch waits in the sink's spool on
gateway-1; gateway-1 is then killed for good and the destination comes back. The
epochs committed before the kill exist only in the spool of the dead peer and in the
checkpoint (their fragments on leaf-set peers): the destination ends with exactly
the plain-Python reference (sql: every row once; http: after dropping repeated
``Idempotency-Key`` values; mqtt: after dropping repeated ``agiledart-id`` values)
only if the sink restored elsewhere sends them again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.apps import normalise
from support.mqtt import Broker, Consumer, mosquitto_binary
from support.postgres import PASSWORD, Postgres
from support.processes import free_port, poll
from support.sinksite import GATEWAY_1, finished, five_peers, status, submit, windows
from support.webhook import running_receiver

from agiledart.app import parse_spec
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes]

TOKEN = "t0ken-for-the-receiver"
COLUMNS = ("key", "window_start", "window_end", "value", "ts")


@dataclass
class Destination:
    """A sink's ``connector`` and ``params``, and how the test takes its destination
    down, brings it back and reads what it kept (repeats dropped)."""

    connector: str
    params: dict[str, Any]
    down: Callable[[], None]
    up: Callable[[], None]
    kept: Callable[[], list[dict[str, Any]]]


@contextlib.contextmanager
def postgresql(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Destination]:
    pg: Postgres = request.getfixturevalue("postgres")
    db = pg.create_db("moves")
    params = {"url": pg.url(db), "password_env": "AGILEDART_SECRET_PG", "table": "windows"}

    def kept() -> list[dict[str, Any]]:
        rows = pg.query(f"SELECT {', '.join(COLUMNS)} FROM windows", db=db)
        return [dict(zip(COLUMNS, r, strict=True)) for r in rows]

    stopped = False

    def down() -> None:
        nonlocal stopped
        pg.stop()
        stopped = True

    def up() -> None:
        nonlocal stopped
        pg.start()
        stopped = False

    try:
        yield Destination("sql", params, down, up, kept)
    finally:
        if stopped:
            up()  # the session's other tests need it


@contextlib.contextmanager
def http(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Destination]:
    with running_receiver() as receiver:

        def status_is(code: int) -> Callable[[], None]:
            return lambda: setattr(receiver, "status", code)

        params = {"url": receiver.url, "token_env": "AGILEDART_SECRET_HOOK", "batch_records": 7}
        yield Destination("http", params, status_is(503), status_is(200), receiver.records)


@contextlib.contextmanager
def mqtt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Destination]:
    mosquitto_binary()  # fails the test, saying how to install it, when it is missing
    workdir = tmp_path / "broker"
    workdir.mkdir()
    broker = Broker(workdir, free_port(), persistence=True)  # the consumer's session lasts
    broker.start()
    try:
        with Consumer(broker, "out/#") as consumer:
            params = {
                "broker": broker.address,
                "topic": "out/{key}",
                "id_in_payload": True,
                "delivery": "exactly-once",
            }
            yield Destination(
                "mqtt", params, broker.stop, broker.start, lambda: consumer.deduplicated()[0]
            )
    finally:
        broker.stop()


DESTINATIONS = {"postgresql": postgresql, "http": http, "mqtt": mqtt}


@pytest.mark.parametrize("destination", sorted(DESTINATIONS))
def test_the_output_is_exact_when_the_sinks_peer_dies_for_good(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    destination: str,
) -> None:
    monkeypatch.setenv("AGILEDART_SECRET_PG", PASSWORD)  # the peers inherit them
    monkeypatch.setenv("AGILEDART_SECRET_HOOK", TOKEN)
    with (
        DESTINATIONS[destination](request, tmp_path) as dest,
        five_peers(tmp_path) as site,
    ):
        spec_raw = windows(f"{destination}_moves", dest.connector, dest.params, count=6_000)
        dest.down()
        app_id = submit(site, spec_raw)

        def waiting() -> bool:
            s = status(site, app_id)
            info = s["peers"]["gateway-1"]["sinks"]["out"]
            return (s["checkpoint"] or {}).get("epoch", 0) >= 2 and info["buffered_rows"] > 0

        poll(waiting, what="committed epochs waiting on gateway-1", timeout=120)
        site.kill(GATEWAY_1)  # for good: what it spooled is gone with it
        dest.up()
        s = finished(site, app_id)
        assert s["state"] == "finished", s.get("error")
        (event,) = s["recoveries"]  # listed even when the app ended inside its install
        assert (event["dead"], event["mode"]) == ("gateway-1", "checkpoint")
        moved_to = s["sinks"]["out"]
        assert moved_to not in ("gateway-1", None)
        assert s["peers"][moved_to]["sinks"]["out"]["buffered_rows"] == 0
        want = normalise(reference_outputs(parse_spec(spec_raw))["out"])
        got = poll(
            lambda: (lambda k: k if len(k) >= len(want) else None)(dest.kept()),
            what="every result at the destination",
            timeout=30,
        )
        assert len(got) == len(want)
        assert canonical(got) == canonical(want)
