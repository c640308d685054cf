"""MQTT apps end to end: real peer processes, a real Mosquitto, the sensor simulator.

``agiledart sensors`` publishes generated urban readings; an app reads them with an
mqtt source (with ``count``, so it finishes), aggregates them in event-time windows
and publishes the results with an mqtt sink; a plain paho subscriber in the test
receives them, and they equal the reference computation over the same generated
records. Then the broker is stopped mid-run and started again: the sinks' buffers
carry what they can across the outage, and what one cannot hold is reported as
dropped in ``agiledart status --json``, never silently lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.mqtt import Broker, Subscriber
from support.processes import cli_json, formed_cluster, poll

from agiledart.app import parse_spec
from agiledart.datasets import generate
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes, pytest.mark.slow]

VIA = 1  # sensor-2: hosts none of these apps' sources or sinks


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # sensor-1, sensor-2, gateway-1, gateway-2
    with formed_cluster(tmp_path_factory.mktemp("mqtt-site"), 4) as cluster:
        yield cluster


def via(cluster: LocalCluster) -> list[str]:
    return ["--via", "{}:{}".format(*cluster.address(VIA))]


def submit(cluster: LocalCluster, spec: dict[str, Any], path: Path) -> str:
    path.write_text(json.dumps(spec))  # JSON is YAML
    app_id: str = cli_json(cluster, "submit", str(path), *via(cluster))["app_id"]
    return app_id


def status(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    s: dict[str, Any] = cli_json(cluster, "status", app_id, *via(cluster))
    return s


def finished(cluster: LocalCluster, app_id: str) -> dict[str, Any] | None:
    s = status(cluster, app_id)
    assert s["state"] in ("deploying", "running", "finished"), s.get("error")
    return s if s["state"] == "finished" else None


def sink_stats(s: dict[str, Any], sink: str) -> dict[str, Any]:
    for peer in s["peers"].values():
        if sink in peer["sinks"]:
            stats: dict[str, Any] = peer["sinks"][sink]
            return stats
    raise AssertionError(f"no statistics of sink {sink!r}")


def source_subscribed(cluster: LocalCluster, app_id: str, source: str) -> bool:
    for peer in status(cluster, app_id)["peers"].values():
        if peer["sources"].get(source, {}).get("subscribed"):
            return True
    return False


def sensors(broker: Broker, *args: str) -> dict[str, Any]:
    """Run the simulator to the end; its JSON summary."""
    cmd = [sys.executable, "-m", "agiledart.cli", "--log-level", "warning", "sensors"]
    proc = subprocess.run(
        [*cmd, "--broker", broker.address, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "published" in proc.stderr  # progress went to stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary


COUNT, RATE, SEED = 3000, 1000, 7


def sensing_app(broker: Broker) -> dict[str, Any]:
    params = {"broker": broker.address, "qos": 1}
    return {
        "name": "mqtt-sensing",
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "mqtt",
                "params": {
                    **params,
                    "topic": "sensors/+/+",
                    "count": COUNT,
                    "fields": {"value": "value"},  # the payload's ts comes along
                    "topic_field": "topic",
                },
            }
        ],
        "operators": [
            {
                "id": "per-topic",
                "op": "window",
                "params": {"size_ms": 500, "key": "topic", "aggregate": "mean", "field": "value"},
                "inputs": ["readings"],
            }
        ],
        "sinks": [
            {
                "id": "out",
                "peer": "gateway-1",
                "connector": "mqtt",
                "params": {**params, "topic": "results/{key}"},
                "inputs": ["per-topic"],
            }
        ],
    }


def test_simulated_sensors_through_an_mqtt_app_match_the_reference(
    site: LocalCluster,
    broker: Broker,
    subscribe: Callable[..., Subscriber],
    tmp_path: Path,
) -> None:
    spec = sensing_app(broker)
    results = subscribe(broker, "results/#")
    app_id = submit(site, spec, tmp_path / "sensing.yaml")
    poll(lambda: source_subscribed(site, app_id, "readings"), what="the mqtt source subscribes")

    summary = sensors(
        broker, "--dataset", "urban", "--rate", str(RATE), "--count", str(COUNT),
        "--seed", str(SEED), "--topic", "sensors/{city}/{metric}", "--qos", "1",
    )  # fmt: skip
    assert (summary["published"], summary["dropped"], summary["errors"]) == (COUNT, 0, 0)

    final = poll(lambda: finished(site, app_id), what="the app finishes")
    # what the source saw: the same generated records, mapped as the spec says
    seen = [
        {"ts": r["ts"], "value": r["value"], "topic": f"sensors/{r['city']}/{r['metric']}"}
        for r in generate("urban", seed=SEED, count=COUNT, rate=RATE)
    ]
    expected = reference_outputs(parse_spec(spec), inputs={"readings": seen})["out"]
    assert len(expected) == 6 * 42  # 3 s of 500 ms windows, 7 cities x 6 metrics
    poll(lambda: len(results.received()) >= len(expected), what="every result arrives")
    got = results.records()
    expected = [json.loads(json.dumps(r)) for r in expected]
    assert canonical(got) == canonical(expected)
    assert all(topic == f"results/{json.loads(p)['key']}" for topic, p in results.received())
    t = final["totals"]
    assert (t["source_records"], t["sink_records"]) == (COUNT, len(expected))
    assert (t["late"], t["errors"], t["dropped"], t["shed"]) == (0, 0, 0, 0)
    source = final["peers"]["sensor-1"]["sources"]["readings"]
    assert (source["parse_errors"], source["finished"]) == (0, True)


RESTART_COUNT = 6000


def restart_app(broker: Broker) -> dict[str, Any]:
    params = {"broker": broker.address, "qos": 1}
    return {
        "name": "mqtt-restart",
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "urban", "rate": 1000, "count": RESTART_COUNT, "seed": 3},
            }
        ],
        "sinks": [
            {
                "id": "all",
                "peer": "gateway-1",
                "connector": "mqtt",
                "params": {**params, "topic": "restart/all/{city}", "buffer": 100_000},
                "inputs": ["readings"],
            },
            {
                "id": "tiny",
                "peer": "gateway-2",
                "connector": "mqtt",
                "params": {**params, "topic": "restart/tiny", "buffer": 20},
                "inputs": ["readings"],
            },
        ],
    }


def test_a_broker_restart_mid_run_loses_nothing_silently(
    site: LocalCluster,
    mosquitto: Callable[..., Broker],
    subscribe: Callable[..., Subscriber],
    tmp_path: Path,
) -> None:
    broker = mosquitto(persistence=True)  # the test's subscriber keeps its session
    received = subscribe(broker, "restart/#", persistent=True)

    def delivered(sink: str) -> list[str]:
        return [p.decode() for t, p in received.received() if t.startswith(f"restart/{sink}")]

    app_id = submit(site, restart_app(broker), tmp_path / "restart.yaml")
    poll(lambda: len(delivered("all")) >= 500, what="records flow to the broker")
    broker.stop()
    # the outage lasts while the tiny sink overflows by a second's worth of records
    poll(
        lambda: sink_stats(status(site, app_id), "tiny")["dropped"] >= 1000,
        what="the tiny sink overflows while the broker is away",
    )
    broker.start()  # same port, sessions restored
    final = poll(lambda: finished(site, app_id), what="the app finishes", timeout=120)

    expected = {
        json.dumps(r, sort_keys=True, separators=(",", ":"))
        for r in generate("urban", seed=3, count=RESTART_COUNT, rate=1000)
    }
    poll(lambda: set(delivered("all")) >= expected, what="everything the big buffer held arrives")
    assert set(delivered("all")) == expected  # at least once (QoS 1): duplicates may come
    tiny = sink_stats(final, "tiny")
    everything = sink_stats(final, "all")
    got_tiny = set(delivered("tiny"))
    assert got_tiny <= expected
    assert tiny["dropped"] >= 1000
    assert len(got_tiny) + tiny["dropped"] >= RESTART_COUNT  # every record: sent or counted
    assert everything["dropped"] == 0
    assert everything["records"] >= RESTART_COUNT
    t = final["totals"]
    assert t["dropped"] == tiny["dropped"]  # reported where a user looks
    assert t["errors"] == 0
    ring = cli_json(site, "ring", "--via", "{}:{}".format(*site.address(2)))  # gateway-1
    assert ring["mqtt"]["reconnects"] >= 1
    assert ring["mqtt"]["connections"] == 0  # the finished app's connection is closed
