"""The mqtt sink of a checkpointed app in real apps: real peer processes on loopback, a
real Mosquitto, and a paho MQTT 5 consumer in the test process that drops every
message whose ``agiledart-id`` user property it has seen. What it keeps is exactly
the plain-Python reference when the window's peer dies mid-run (the replay must not
publish again what was published), and when the broker is down while the sink's peer
restarts on its state directory (committed epochs wait on that peer's disk)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.properties import Properties
from support.apps import normalise
from support.mqtt import Broker
from support.processes import cli_json, formed_cluster, poll

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs
from agiledart.runtime.mqtt.pool import ID_PROPERTY
from agiledart.runtime.mqtt.sink import message_id
from agiledart.runtime.spool import FINAL_EPOCH

pytestmark = [pytest.mark.processes]

SENSOR_1, SENSOR_2, GATEWAY_1, GATEWAY_2, EDGE_1 = range(5)
ID = "agiledart-id"


def test_a_message_id_names_its_app_sink_epoch_and_place() -> None:
    assert ID_PROPERTY == ID
    assert message_id("a1", "out", 7, 0) == "a1/out/7/0"
    assert message_id("a1", "out", FINAL_EPOCH, 12) == "a1/out/final/12"


class Consumer:
    """A paho MQTT 5 client on its own thread, with a session the broker keeps (it
    queues what comes while the consumer is away): every message with its user
    properties."""

    def __init__(self, broker: Broker, topic_filter: str) -> None:
        self.topic_filter = topic_filter
        self.messages: list[tuple[str, bytes, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=f"epoch-consumer-{broker.port}",
            protocol=paho.MQTTv5,
        )
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.port = broker.port

    def _on_connect(self, client: paho.Client, *_: Any) -> None:
        client.subscribe(self.topic_filter, qos=1)

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        props: Properties | None = getattr(msg, "properties", None)
        user = dict(getattr(props, "UserProperty", []) or [])
        with self._lock:
            self.messages.append((msg.topic, bytes(msg.payload), user))

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

    def deduplicated(self) -> tuple[list[dict[str, Any]], int]:
        """The records of the messages whose id is new, in arrival order, and how many
        repeats were dropped; every message must carry its id, in both places."""
        with self._lock:
            messages = list(self.messages)
        seen: set[str] = set()
        kept, repeats = [], 0
        for topic, payload, props in messages:
            record = json.loads(payload)
            assert ID in props, f"a message on {topic} without its {ID!r}"
            assert record.pop("agiledart_id") == props[ID]
            assert topic == f"out/{record['key']}"
            if props[ID] in seen:
                repeats += 1
                continue
            seen.add(props[ID])
            kept.append(record)
        return kept, repeats


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path, 5, ["--workers", "0"]) as cluster:
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


def via(cluster: LocalCluster, i: int) -> str:
    return "{}:{}".format(*cluster.address(i))


def submit(cluster: LocalCluster, spec: dict[str, Any]) -> str:
    assert cluster.workdir is not None
    path = cluster.workdir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(cli_json(cluster, "submit", str(path), "--via", via(cluster, GATEWAY_2))["app_id"])


def status(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    return dict(cli_json(cluster, "status", app_id, "--via", via(cluster, GATEWAY_2)))


def finished(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        s = status(cluster, app_id)
        return s if s["state"] in ("finished", "failed", "stopped") else None

    return dict(poll(done, what=f"{app_id} to end", timeout=180))


def windows(name: str, broker: Broker, count: int = 12_000) -> dict[str, Any]:
    """generator -> keyed 500 ms window (sum) on edge-1 -> mqtt sink on gateway-1; an
    epoch every second."""
    return {
        "name": name,
        "checkpoint": {"mode": "erasure", "interval_ms": 1_000, "m": 2, "k": 1},
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "counter", "rate": 2_000, "count": count, "keys": 16},
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
            {
                "id": "out",
                "peer": "gateway-1",
                "connector": "mqtt",
                "params": {
                    "broker": broker.address,
                    "topic": "out/{key}",
                    "id_in_payload": True,
                    "delivery": "exactly-once",
                },
                "inputs": ["per_key"],
            },
        ],
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
    spec_raw = windows("mqtt_epochs_kill", broker)
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
    them), survive that peer's ``kill -9`` and restart on its state directory, and go
    out, in order and with the same ids, once the broker is back."""
    broker = mosquitto(persistence=True)  # the consumer's session outlives the outage
    consumer = consume(broker)
    spec_raw = windows("mqtt_epochs_outage", broker)
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
    assert s["peers"]["gateway-1"]["sinks"]["out"]["buffered_rows"] == 0
    check_consumed(spec_raw, consumer)
