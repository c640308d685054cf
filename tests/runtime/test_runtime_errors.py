"""A user function that raises on some records: the records it raised on are dropped
and counted, and ``status`` shows the exception's type and message, a record that
raised it and the peer, in ``--json`` and in plain text; with ``on_error: fail`` the
app fails at the first one, its error naming the exception and the record; with
``on_error: dead_letter`` each of them is written to the operator's dead-letter sink
(a file holding exactly those records, or an mqtt broker that, down, is shown as a
problem while the app finishes).

Real peer processes on loopback, a registered bundle, the counter dataset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.mqtt import Broker, Subscriber, mosquitto_binary
from support.processes import ask, cli, cli_json, formed_cluster, free_port, poll

from agiledart.datasets import generate
from agiledart.emulation import LocalCluster

pytestmark = [pytest.mark.processes]

COUNT = 700
BUNDLE = """import math


def log_seq(r):
    return {**r, "log": math.log(r["seq"] % 7)}
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path_factory.mktemp("pair"), 2, ["--workers", "0"]) as cluster:
        yield cluster


def via(cluster: LocalCluster) -> list[str]:
    return ["--via", "{}:{}".format(*cluster.address(0))]


def spec(code_id: str, on_error: str) -> dict[str, Any]:
    params = {"dataset": "counter", "rate": 2_000, "count": COUNT, "keys": 5}
    return {
        "name": f"logs-{on_error}",
        "sources": [{"id": "src", "peer": "sensor-1", "connector": "generator", "params": params}],
        "operators": [
            {
                "id": "logs",
                "op": "map",
                "fn": f"{code_id}:log_seq",
                "inputs": ["src"],
                "on_error": on_error,
            }
        ],
        "sinks": [{"id": "out", "peer": "sensor-2", "connector": "discard", "inputs": ["logs"]}],
    }


def run(cluster: LocalCluster, on_error: str, *sets: str) -> dict[str, Any]:
    assert cluster.workdir is not None
    bundle = cluster.workdir / "logs.py"
    bundle.write_text(BUNDLE)
    code_id = cli_json(cluster, "register", str(bundle), *via(cluster))["code_id"]
    path = cluster.workdir / f"{on_error}.yaml"
    path.write_text(yaml.safe_dump(spec(code_id, on_error)))
    overrides = [a for s in sets for a in ("--set", s)]
    app_id = cli_json(cluster, "submit", str(path), *overrides, *via(cluster))["app_id"]

    def ended() -> dict[str, Any] | None:
        s = ask(cluster, 0, "status", {"app_id": app_id})
        return s if s["state"] in ("finished", "failed", "stopped") else None

    return dict(poll(ended, what=f"{app_id} to end", timeout=120))


def test_status_shows_each_error_with_a_record_that_raised_it(pair: LocalCluster) -> None:
    s = run(pair, "count")
    raising = [r for r in generate("counter", count=COUNT, keys=5, rate=2_000) if r["seq"] % 7 == 0]
    assert s["state"] == "finished"
    assert s["totals"]["errors"] == len(raising)
    problem = s["problems"]["logs"]
    assert problem["errors"] == len(raising)
    (error,) = problem["recent"]
    assert error["type"] == "ValueError"
    assert error["message"] == "math domain error"
    assert error["count"] == len(raising)
    assert error["peer"] in ("sensor-1", "sensor-2")
    assert "'seq': " in error["record"]
    text = cli(pair, "status", s["app_id"], *via(pair)).stdout
    assert f"{len(raising)} x ValueError: math domain error on {error['peer']}" in text


def test_on_error_fail_fails_the_app_naming_the_error_and_the_record(pair: LocalCluster) -> None:
    s = run(pair, "fail")
    assert s["state"] == "failed"
    assert "ValueError: math domain error on record {" in s["error"]
    assert "on_error: fail" in s["error"]


def raising_records() -> list[dict[str, Any]]:
    records = generate("counter", count=COUNT, keys=5, rate=2_000)
    return [r for r in records if r["seq"] % 7 == 0]


def lines(path: Path, n: int) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` once it holds ``n`` (it is flushed within a second)."""

    def read() -> list[dict[str, Any]] | None:
        text = path.read_text() if path.exists() else ""
        found = [json.loads(line) for line in text.splitlines()]
        return found if len(found) >= n else None

    return list(poll(read, what=f"{n} lines in {path}", timeout=30))


def test_on_error_dead_letter_writes_exactly_the_failing_records_to_a_file(
    pair: LocalCluster,
) -> None:
    s = run(
        pair,
        "dead_letter",
        "operators.logs.dead_letter={type: file, path: 'bad/{op}-{peer}.jsonl'}",
        "sinks.out.connector=file",
        "sinks.out.params={path: good.jsonl}",
    )
    raising = raising_records()
    assert s["state"] == "finished"
    problem = s["problems"]["logs"]
    assert problem["errors"] == s["totals"]["errors"] == len(raising)
    assert problem["dead_letters"] == len(raising)
    ((peer, sink),) = problem["dead_letter_sinks"].items()
    assert sink["written"] == len(raising)
    assert not sink["problem"]
    path = Path(sink["path"])
    assert path.name == f"logs-{peer}.jsonl"
    letters = lines(path, len(raising))
    assert [letter["record"] for letter in letters] == raising  # in order, each once
    for letter in letters:
        assert letter["app"] == s["app_id"]
        assert (letter["op"], letter["peer"]) == ("logs", peer)
        assert (letter["error_type"], letter["message"]) == ("ValueError", "math domain error")
        assert isinstance(letter["ts"], int)
    good = lines(Path(s["peers"]["sensor-2"]["sinks"]["out"]["path"]), COUNT - len(raising))
    assert [r["seq"] for r in good] == [
        r["seq"] for r in generate("counter", count=COUNT, keys=5, rate=2_000) if r["seq"] % 7
    ]
    text = cli(pair, "status", s["app_id"], *via(pair)).stdout
    assert f"{len(raising)} sent to its dead-letter sink" in text
    assert f"dead letters @ {peer}: {path}" in text


def test_a_dead_letter_broker_that_is_down_is_a_problem_not_a_failure(
    pair: LocalCluster,
) -> None:
    closed = free_port()  # nothing listens there
    letters = f"{{type: mqtt, topic: 'bad/{{op}}', broker: '127.0.0.1:{closed}'}}"
    s = run(pair, "dead_letter", f"operators.logs.dead_letter={letters}")
    assert s["state"] == "finished"
    problem = s["problems"]["logs"]
    assert problem["errors"] == len(raising_records())
    ((peer, sink),) = problem["dead_letter_sinks"].items()
    assert sink["problem"]
    assert sink["connection"] == "retrying"
    assert sink["last_error"]
    assert (sink["published"], sink["queued"]) == (0, problem["dead_letters"])
    text = cli(pair, "status", s["app_id"], *via(pair)).stdout
    assert f"dead letters @ {peer}: retrying since" in text
    assert f", 0 published, {problem['dead_letters']} queued" in text
    ring = cli_json(pair, "ring", "--via", "{}:{}".format(*pair.address(1)))
    assert "sensor-1" in json.dumps(ring)  # the peers live on


def test_on_error_dead_letter_publishes_each_failing_record_to_mqtt(
    pair: LocalCluster, tmp_path: Path
) -> None:
    mosquitto_binary()
    broker = Broker(tmp_path, free_port())
    broker.start()
    try:
        with Subscriber(broker, "bad/#") as sub:
            topic = "bad/{op}/{error_type}"
            letters = f"{{type: mqtt, topic: '{topic}', broker: '{broker.address}', qos: 1}}"
            s = run(pair, "dead_letter", f"operators.logs.dead_letter={letters}")
            raising = raising_records()
            assert s["state"] == "finished"
            assert s["problems"]["logs"]["dead_letters"] == len(raising)
            got = poll(
                lambda: sub.received() if len(sub.received()) >= len(raising) else None,
                what=f"{len(raising)} dead letters at the broker",
                timeout=30,
            )
    finally:
        broker.stop()
    assert {topic for topic, _ in got} == {"bad/logs/ValueError"}
    received = [json.loads(payload) for _, payload in got]
    assert sorted(r["record"]["seq"] for r in received) == [r["seq"] for r in raising]
    assert {(r["app"], r["op"], r["message"]) for r in received} == {
        (s["app_id"], "logs", "math domain error")
    }
