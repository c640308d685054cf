"""A user function that raises on some records: the records it raised on are dropped
and counted, and ``status`` shows the exception's type and message, a record that
raised it and the peer, in ``--json`` and in plain text; with ``on_error: fail`` the
app fails at the first one, its error naming the exception and the record.

Real peer processes on loopback, a registered bundle, the counter dataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from support.processes import cli, cli_json, formed_cluster, poll

from agiledart.datasets import generate
from agiledart.emulate import LocalCluster

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


def run(cluster: LocalCluster, on_error: str) -> dict[str, Any]:
    assert cluster.workdir is not None
    bundle = cluster.workdir / "logs.py"
    bundle.write_text(BUNDLE)
    code_id = cli_json(cluster, "register", str(bundle), *via(cluster))["code_id"]
    path = cluster.workdir / f"{on_error}.yaml"
    path.write_text(yaml.safe_dump(spec(code_id, on_error)))
    app_id = cli_json(cluster, "submit", str(path), *via(cluster))["app_id"]

    def ended() -> dict[str, Any] | None:
        s = cli_json(cluster, "status", app_id, *via(cluster))
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
