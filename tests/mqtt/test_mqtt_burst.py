"""Bursts into an app's mqtt source, from a real ``mosquitto_pub -l``, through a real
Mosquitto with its default limits (20 messages in flight to a subscriber, 1000
queued, then dropped), into real peer processes.

The burst arrives whole: the app's output is exactly the reference computed over
every message published. Where the engine gives messages up itself (a source whose
log holds one message), every one is counted in ``status --json``: handed on plus
shed is all that was published.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apps import read_jsonl
from support.mqtt import Broker
from support.processes import cli_json, formed_cluster, poll

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes, pytest.mark.slow]

BURST = 10_000
KEYS = 7


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path_factory.mktemp("burst-site"), 2) as cluster:  # sensor-1, -2
        yield cluster


def readings(n: int) -> list[dict[str, Any]]:
    """``n`` readings over ``n`` ms of event time, keys round-robin."""
    return [{"key": f"k{i % KEYS}", "v": i % 100, "ts": i} for i in range(n)]


def publish_burst(broker: Broker, topic: str, records: list[dict[str, Any]], qos: int) -> None:
    """One ``mosquitto_pub -l`` call: a message per line, as fast as the broker takes them."""
    pub = shutil.which("mosquitto_pub")
    if pub is None:
        pytest.fail(
            "the burst tests need mosquitto_pub: `make setup` or "
            "`sudo apt-get install mosquitto-clients`",
            pytrace=False,
        )
    lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    proc = subprocess.run(
        [pub, "-h", "127.0.0.1", "-p", str(broker.port), "-t", topic, "-q", str(qos), "-l"],
        input=lines.encode(),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def via(cluster: LocalCluster) -> list[str]:
    return ["--via", "{}:{}".format(*cluster.address(1))]


def submit(cluster: LocalCluster, spec: dict[str, Any], path: Path) -> str:
    path.write_text(json.dumps(spec))
    app_id: str = cli_json(cluster, "submit", str(path), *via(cluster))["app_id"]
    return app_id


def status(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    s: dict[str, Any] = cli_json(cluster, "status", app_id, *via(cluster))
    assert s["state"] in ("deploying", "running", "finished"), s.get("error")
    return s


def source_of(s: dict[str, Any], source: str) -> dict[str, Any]:
    for peer in s["peers"].values():
        if source in peer["sources"]:
            stats: dict[str, Any] = peer["sources"][source]
            return stats
    return {}


def sink_path(s: dict[str, Any], sink: str) -> Path:
    for peer in s["peers"].values():
        if sink in peer["sinks"]:
            return Path(peer["sinks"][sink]["path"])
    raise AssertionError(f"no statistics of sink {sink!r}")


def burst_app(broker: Broker, topic: str, qos: int, **source: Any) -> dict[str, Any]:
    return {
        "name": f"burst-{topic.replace('/', '-')}",
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "mqtt",
                "params": {"broker": broker.address, "topic": topic, "qos": qos, **source},
            }
        ],
        "operators": [
            {
                "id": "per-key",
                "op": "window",
                "params": {"size_ms": 1000, "key": "key", "aggregate": "sum", "field": "v"},
                "inputs": ["readings"],
            }
        ],
        "sinks": [
            {"id": "out", "peer": "sensor-2", "connector": "file", "params": {"path": "out.jsonl"}}
        ],
    }


def run_burst(
    site: LocalCluster, broker: Broker, tmp_path: Path, spec: dict[str, Any], qos: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Submit, wait for the subscription, publish the burst, wait for the end."""
    spec["sinks"][0]["inputs"] = ["per-key"] if spec["operators"] else ["readings"]
    app_id = submit(site, spec, tmp_path / "app.yaml")
    poll(
        lambda: source_of(status(site, app_id), "readings").get("subscribed"),
        what="the mqtt source subscribes",
    )
    sent = readings(BURST)
    publish_burst(broker, spec["sources"][0]["params"]["topic"], sent, qos)
    final: dict[str, Any] = poll(
        lambda: (s := status(site, app_id))["state"] == "finished" and s,
        what=f"the app takes all {BURST} messages and finishes",
        timeout=120,
    )
    return final, sent


@pytest.mark.parametrize("qos", [1, 0])
def test_a_burst_reaches_the_app_whole_with_mosquittos_default_limits(
    site: LocalCluster, broker: Broker, tmp_path: Path, qos: int
) -> None:
    spec = burst_app(broker, f"burst/q{qos}", qos, count=BURST)
    final, sent = run_burst(site, broker, tmp_path, spec, qos)

    expected = reference_outputs(parse_spec(spec), inputs={"readings": sent})["out"]
    assert len(expected) == KEYS * (BURST // 1000)
    got = read_jsonl(sink_path(final, "out"))
    assert canonical(got) == canonical(json.loads(json.dumps(expected)))
    source = source_of(final, "readings")
    assert (source["received"], source["emitted"], source["shed"]) == (BURST, BURST, 0)
    assert source["parse_errors"] == 0
    assert source["backlog"] == 0
    t = final["totals"]
    assert (t["source_records"], t["shed"], t["late"], t["errors"]) == (BURST, 0, 0, 0)
    assert not [line for line in broker.log() if "dropped" in line]


def test_what_the_engine_sheds_is_counted_in_status(
    site: LocalCluster, broker: Broker, tmp_path: Path
) -> None:
    # a log that holds one message: every read of the socket brings more than that
    spec = burst_app(broker, "burst/shed", 1, count=BURST, buffer=1, overload="shed-newest")
    spec["operators"] = []
    final, sent = run_burst(site, broker, tmp_path, spec, 1)

    source = source_of(final, "readings")
    assert source["received"] == BURST
    assert source["shed"] > 0
    assert source["emitted"] + source["shed"] == BURST  # every message: handed on or counted
    t = final["totals"]
    assert (t["shed"], t["source_records"]) == (source["shed"], source["emitted"])
    got = read_jsonl(sink_path(final, "out"))
    assert len(got) == source["emitted"]
    published = {json.dumps(r, sort_keys=True) for r in sent}
    assert {json.dumps(r, sort_keys=True) for r in got} <= published
    assert not [line for line in broker.log() if "dropped" in line]  # shed by us, not lost
