"""The five-peer site the sink tests share (sql, http and mqtt sinks in real apps):
real peer processes on loopback, an app whose keyed window's every result is a sum
over its key's records (a record lost or repeated changes it), and the CLI calls
that submit it and follow it to its end.

Peers, by index: sensor-1 (the generator), sensor-2, gateway-1 (the sink),
gateway-2 (where apps are submitted, so their scheduler), edge-1 (the window).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from support.processes import cli_json, formed_cluster, poll

from agiledart.emulation import LocalCluster

__all__ = [
    "EDGE_1",
    "GATEWAY_1",
    "GATEWAY_2",
    "SENSOR_1",
    "SENSOR_2",
    "counted",
    "finished",
    "five_peers",
    "status",
    "submit",
    "via",
    "windows",
]

SENSOR_1, SENSOR_2, GATEWAY_1, GATEWAY_2, EDGE_1 = range(5)


@contextlib.contextmanager
def five_peers(root: Path) -> Iterator[LocalCluster]:
    """The site's five peers (no worker processes), its ring formed."""
    with formed_cluster(root, 5, ["--workers", "0"]) as cluster:
        yield cluster


def via(cluster: LocalCluster, i: int) -> str:
    return "{}:{}".format(*cluster.address(i))


def submit(cluster: LocalCluster, spec: dict[str, Any], through: int = GATEWAY_2) -> str:
    assert cluster.workdir is not None
    path = cluster.workdir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(cli_json(cluster, "submit", str(path), "--via", via(cluster, through))["app_id"])


def status(cluster: LocalCluster, app_id: str, through: int = GATEWAY_2) -> dict[str, Any]:
    return dict(cli_json(cluster, "status", app_id, "--via", via(cluster, through)))


def finished(cluster: LocalCluster, app_id: str, through: int = GATEWAY_2) -> dict[str, Any]:
    """The app's status once it finished, failed or was stopped."""

    def done() -> dict[str, Any] | None:
        s = status(cluster, app_id, through)
        return s if s["state"] in ("finished", "failed", "stopped") else None

    return dict(poll(done, what=f"{app_id} to end", timeout=180))


def windows(
    name: str,
    connector: str,
    params: dict[str, Any],
    *,
    count: int = 12_000,
    interval_ms: int = 1_000,
    rate: int = 2_000,
) -> dict[str, Any]:
    """generator (``rate`` records/s, 16 keys) on sensor-1 -> keyed 500 ms window (sum)
    on edge-1 -> sink ``out`` (``connector`` with ``params``) on gateway-1; an epoch
    every ``interval_ms``."""
    return {
        "name": name,
        "checkpoint": {"mode": "erasure", "interval_ms": interval_ms, "m": 2, "k": 1},
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "counter", "rate": rate, "count": count, "keys": 16},
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
                "connector": connector,
                "params": params,
                "inputs": ["per_key"],
            },
        ],
    }


def counted(name: str, connector: str, params: dict[str, Any]) -> dict[str, Any]:
    """source ``readings`` (``connector`` with ``params``) on sensor-1 -> a keyed
    running count on edge-1 -> file sink ``out`` on gateway-1; an epoch every 800 ms."""
    return {
        "name": name,
        "checkpoint": {"mode": "erasure", "interval_ms": 800, "m": 2, "k": 1},
        "sources": [
            {"id": "readings", "peer": "sensor-1", "connector": connector, "params": params}
        ],
        "operators": [
            {
                "id": "counts",
                "op": "aggregate",
                "params": {"key": "key", "aggregate": "count"},
                "inputs": ["readings"],
                "peer": "edge-1",
            }
        ],
        "sinks": [
            {
                "id": "out",
                "peer": "gateway-1",
                "connector": "file",
                "params": {"path": f"{name}.jsonl"},
                "inputs": ["counts"],
            }
        ],
    }
