"""The mqtt sink of a checkpointed app in real apps: real peer processes on loopback, a
real Mosquitto, and a paho MQTT 5 consumer in the test process that drops every
message whose ``agiledart-id`` user property it has seen. What it keeps is exactly
the plain-Python reference when the window's peer dies mid-run (the replay must not
publish again what was published), and when the broker is down while the sink's peer
restarts on its state directory (committed epochs wait on that peer's disk)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apps import normalise
from support.mqtt import ID, Broker, Consumer
from support.processes import poll
from support.sinksite import EDGE_1, GATEWAY_1, finished, five_peers, status, submit, windows

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs
from agiledart.runtime.mqtt.pool import ID_PROPERTY
from agiledart.runtime.mqtt.sink import message_id
from agiledart.runtime.spool import FINAL_EPOCH

pytestmark = [pytest.mark.processes]


def test_a_message_id_names_its_app_sink_epoch_and_place() -> None:
    assert ID_PROPERTY == ID
    assert message_id("a1", "out", 7, 0) == "a1/out/7/0"
    assert message_id("a1", "out", FINAL_EPOCH, 12) == "a1/out/final/12"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LocalCluster]:
    with five_peers(tmp_path) as cluster:
        yield cluster


@pytest.fixture
def consume() -> Iterator[Callable[[Broker], Consumer]]:
    made: list[Consumer] = []

    def make(broker: Broker) -> Consumer:
        made.append(Consumer(broker, "out/#").__enter__())
        return made[-1]

    yield make
    for c in made:
        c.__exit__(None, None, None)


def mqtt_sink(broker: Broker) -> dict[str, Any]:
    return {
        "broker": broker.address,
        "topic": "out/{key}",
        "id_in_payload": True,
        "delivery": "exactly-once",
    }


def check_consumed(spec_raw: dict[str, Any], consumer: Consumer) -> int:
    """The consumer's records, repeats dropped, are the reference; how many repeats."""
    want = normalise(reference_outputs(parse_spec(spec_raw))["out"])

    def complete() -> tuple[list[dict[str, Any]], int] | None:
        got, repeats = consumer.deduplicated()
        return (got, repeats) if len(got) >= len(want) else None

    poll(complete, what="every result at the consumer", timeout=30)
    time.sleep(0.5)  # a late repeat, or one too many, would show now
    got, repeats = consumer.deduplicated()
    assert len(got) == len(want)
    assert canonical(got) == canonical(want)
    return repeats


def test_the_consumed_results_are_exact_when_the_windows_peer_dies(
    site: LocalCluster, broker: Broker, consume: Callable[[Broker], Consumer]
) -> None:
    consumer = consume(broker)
    spec_raw = windows("mqtt_epochs_kill", "mqtt", mqtt_sink(broker))
    app_id = submit(site, spec_raw)

    def committed() -> bool:
        return status(site, app_id)["checkpoint"] is not None

    poll(committed, what="a committed epoch", timeout=120)
    time.sleep(1.2)  # windows pass the sink after that epoch: the failure cuts them off
    site.kill(EDGE_1)
    s = finished(site, app_id)
    assert s["state"] == "finished", s.get("error")
    (event,) = s["recoveries"]
    assert event["mode"] == "checkpoint"
    check_consumed(spec_raw, consumer)


def test_committed_epochs_wait_on_disk_through_an_outage_and_a_restart_of_the_sinks_peer(
    site: LocalCluster, mosquitto: Callable[..., Broker], consume: Callable[[Broker], Consumer]
) -> None:
    """The broker stops mid-run: committed epochs wait on gateway-1's disk (status shows
    them), survive that peer's ``kill -9`` and restart on its state directory (or,
    declared dead first, the sink's move), and go out, in order and with the same ids,
    once the broker is back."""
    broker = mosquitto(persistence=True)  # the consumer's session outlives the outage
    consumer = consume(broker)
    spec_raw = windows("mqtt_epochs_outage", "mqtt", mqtt_sink(broker))
    app_id = submit(site, spec_raw)

    def committed() -> bool:
        return status(site, app_id)["checkpoint"] is not None

    poll(committed, what="a committed epoch", timeout=120)
    broker.stop()

    def waiting() -> dict[str, Any] | None:
        info = status(site, app_id)["peers"]["gateway-1"]["sinks"]["out"]
        ok = info["connection"] == "retrying" and info["buffered_rows"] > 0
        return info if ok else None

    info = poll(waiting, what="messages waiting for the broker", timeout=60)
    assert info["buffer_overflows"] == 0
    site.restart(GATEWAY_1)  # the outage goes on; the spool outlives the peer
    time.sleep(1)
    broker.start()
    s = finished(site, app_id)
    assert s["state"] == "finished", s.get("error")
    assert [e["dead"] for e in s["recoveries"]] == ["gateway-1"]
    # declared dead before it came back, it lost the sink to another peer (what the
    # sink held went along with the checkpoint): wherever the sink runs now
    assert s["peers"][s["sinks"]["out"]]["sinks"]["out"]["buffered_rows"] == 0
    check_consumed(spec_raw, consumer)
