"""Elastic scaling with real peer processes (issue 8, item 1; paper §IV-C).

* A load step on one operator: its records become costly for a while (the function
  sleeps), so its health falls and the controller of the peer hosting it scales it up
  on that peer's workers; when the step is over it scales back down. Asserted on the
  decisions and instance counts in ``status``, never on timing; every record arrives
  exactly once.
* A stateful keyed operator behind a capped uplink (the link model's
  ``bandwidth_mbit``): its output waits for the link while its worker idles, so its
  controller asks for a migration; the scheduler cuts a checkpoint and moves it, with
  its state, to a leaf-set peer. The output equals the plain-Python reference exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.apps import check_outputs, log_sizes, read_jsonl
from support.processes import ask, cli, cli_json, formed_cluster, poll

from agiledart.app import parse_spec
from agiledart.bandit import Graph, save_graph
from agiledart.emulation import LocalCluster, site_name

pytestmark = [pytest.mark.processes]

COUNT = 7_000
SLOW = """\
import time


def slow(r):
    if 1_000 <= r["seq"] < 3_400:  # the load step: 3 ms a record
        time.sleep(0.003)
    return r
"""


def via(cluster: LocalCluster, i: int = 0) -> list[str]:
    host, port = cluster.address(i)
    return ["--via", f"{host}:{port}"]


def submit(cluster: LocalCluster, spec: dict[str, Any]) -> str:
    assert cluster.workdir is not None
    path = cluster.workdir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(cli_json(cluster, "submit", str(path), *via(cluster))["app_id"])


def status(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    return dict(ask(cluster, 0, "status", {"app_id": app_id}))


def ended(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        s = status(cluster, app_id)
        return s if s["state"] in ("finished", "failed", "stopped") else None

    return dict(poll(done, what=f"{app_id} to end", timeout=180))


def test_a_load_step_scales_an_operator_up_and_back_down(tmp_path: Path) -> None:
    with formed_cluster(tmp_path, 3, ["--workers", "2"]) as site:
        bundle = tmp_path / "slow.py"
        bundle.write_text(SLOW)
        code = cli(site, "register", str(bundle), *via(site)).stdout.strip()
        spec = {
            "name": "step",
            "checkpoint": {"mode": "restart"},
            "scaling": {
                "enabled": True,
                "max_instances": 2,
                "cooldown_ms": 1_500,
                "interval_ms": 500,
            },
            "sources": [
                {
                    "id": "src",
                    "peer": "sensor-1",
                    "connector": "generator",
                    "params": {"dataset": "counter", "rate": 400, "count": COUNT, "keys": 8},
                }
            ],
            "operators": [{"id": "slow", "op": "map", "fn": f"{code}:slow", "inputs": ["src"]}],
            "sinks": [
                {
                    "id": "out",
                    "peer": "gateway-1",
                    "connector": "file",
                    "params": {"path": "out.jsonl"},
                    "inputs": ["slow"],
                }
            ],
        }
        app_id = submit(site, spec)
        s = poll(
            lambda: (
                (st := status(site, app_id))["scaling"].get("slow", {}).get("instances", 1) > 1
                and st
            ),
            what="the slow operator to scale up",
            timeout=120,
        )
        (peer,) = s["placement"]["slow"]
        s = ended(site, app_id)
        assert s["state"] == "finished", s.get("error")
        view = s["scaling"]["slow"]["peers"][peer]
        actions = [c["action"] for c in view["changes"]]
        assert "up" in actions, view
        assert "down" in actions[actions.index("up") :], view  # and back down after
        up = next(c for c in view["changes"] if c["action"] == "up")
        assert up["instances"] == 1
        assert up["target"] == 2
        assert up["health"] < 0.85  # under the dead-band around f* = 0.9
        assert view["instances"] == 1  # scaled back to one by the end
        # every record exactly once, through the replicas and back
        out = read_jsonl(Path(s["peers"]["gateway-1"]["sinks"]["out"]["path"]))
        assert sorted(r["seq"] for r in out) == list(range(COUNT))
        assert s["totals"]["errors"] == 0


def capped_site(path: Path, peers: int, mbit: float) -> None:
    """Every peer's upload capped at ``mbit`` (the link model's ``bandwidth_mbit``), the
    peers fully meshed with lossless links."""
    names = [site_name(i) for i in range(peers)]
    links = [(a, b, 1.0) for a in names for b in names if a != b]
    graph = Graph.build(names, links, source=names[0], sink=names[2], slot_ms=1.0, name="cap")
    save_graph(graph, path)
    raw = json.loads(path.read_text())
    raw["bandwidth_mbit"] = mbit
    path.write_text(json.dumps(raw))


def test_a_stateful_operator_behind_a_capped_link_migrates_with_exact_output(
    tmp_path: Path,
) -> None:
    links = tmp_path / "links.json"
    capped_site(links, 4, mbit=0.25)
    with formed_cluster(tmp_path, 4, ["--workers", "0", "--links", str(links)]) as site:
        raw = {
            "name": "capped",
            "checkpoint": {"mode": "replication", "k": 1, "interval_ms": 60_000},
            "scaling": {"enabled": True, "cooldown_ms": 60_000, "interval_ms": 500},
            "sources": [
                {
                    "id": "readings",
                    "peer": "sensor-1",
                    "connector": "generator",
                    "params": {"dataset": "counter", "rate": 1_500, "count": 9_000, "keys": 16},
                }
            ],
            "operators": [
                {  # next to its source: its output is what crosses the capped uplink
                    "id": "counts",
                    "op": "aggregate",
                    "params": {"key": "key", "aggregate": "count"},
                    "inputs": ["readings"],
                    "peer": "sensor-1",
                }
            ],
            "sinks": [
                {
                    "id": "out",
                    "peer": "gateway-1",
                    "connector": "file",
                    "params": {"path": "counts.jsonl"},
                    "inputs": ["counts"],
                }
            ],
        }
        spec = parse_spec(raw)
        logs = log_sizes(site)
        app_id = submit(site, raw)
        s = ended(site, app_id)
        assert s["state"] == "finished", s.get("error")
        (event,) = [e for e in s["rescales"] if "refused" not in e]
        assert event["action"] == "migrate"
        assert event["from"] == "sensor-1"
        assert event["operators"] == ["counts"]
        assert s["placement"]["counts"] == [event["to"]] != ["sensor-1"]
        assert s["generation"] == 1
        check_outputs(site, spec, s, logs)
