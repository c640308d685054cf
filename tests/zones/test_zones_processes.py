"""Zone schedulers on real peer processes (paper §VI): the first app of a zone elects
its scheduler, the next one finds it by gossip, and when the scheduler is killed
(``kill -9``) its apps keep producing and a peer of its zone adopts them."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.processes import cli_json, free_port, poll

from agiledart.app.errors import SpecError
from agiledart.emulation import LocalCluster

pytestmark = [pytest.mark.processes]

# sensor-1, sensor-2, gateway-1, gateway-2, edge-1, edge-2
ZONES = ("north", "south", "north", "south", "north", "north")
NORTH = {"sensor-1", "gateway-1", "edge-1", "edge-2"}
EDGE_1, EDGE_2, SENSOR_2 = 4, 5, 1


@dataclass
class ZonedCluster(LocalCluster):
    """A local cluster whose peer ``i`` runs in zone ``ZONES[i]``."""

    def start(self, i: int) -> subprocess.Popen[bytes]:
        base = self.extra_args
        self.extra_args = [*base, "--zone", ZONES[i]]
        try:
            return super().start(i)
        finally:
            self.extra_args = base


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ZonedCluster]:
    cluster = ZonedCluster(
        len(ZONES), port=free_port(), workdir=tmp_path, extra_args=["--workers", "0"]
    )
    with cluster:
        asyncio.run(cluster.wait_formed())
        yield cluster
    for proc in cluster.procs:
        assert proc.poll() is not None


def endless(name: str) -> dict[str, Any]:
    """A generator on sensor-1 feeding gateway-1; every operator pinned there too, so
    the scheduler (on an edge peer) hosts nothing of the app."""
    return {
        "name": name,
        "checkpoint": {"mode": "restart"},
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "counter", "rate": 400, "keys": 8},
            }
        ],
        "operators": [
            {
                "id": "scaled",
                "op": "map",
                "fn": "builtin:scale",
                "params": {"field": "seq", "factor": 2},
                "inputs": ["readings"],
                "peer": "sensor-1",
            }
        ],
        "sinks": [{"id": "out", "peer": "gateway-1", "connector": "discard", "inputs": ["scaled"]}],
    }


def via(cluster: LocalCluster, i: int) -> str:
    host, port = cluster.address(i)
    return f"{host}:{port}"


def submit(cluster: LocalCluster, spec: dict[str, Any], through: int) -> str:
    assert cluster.workdir is not None
    path = cluster.workdir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(cli_json(cluster, "submit", str(path), "--via", via(cluster, through))["app_id"])


def request(cluster: LocalCluster, i: int, rpc: str, body: dict[str, Any]) -> Any:
    """The RPC the CLI sends, without a process per call (they add up on 2 cores)."""
    return asyncio.run(cluster.request(i, rpc, body, timeout=30.0))


def status(cluster: LocalCluster, app_id: str, through: int) -> dict[str, Any]:
    return dict(request(cluster, through, "status", {"app_id": app_id}))


def scheduling(cluster: LocalCluster, i: int) -> dict[str, Any]:
    return dict(request(cluster, i, "ring", {})["scheduling"])


def test_a_killed_scheduler_s_apps_keep_producing_and_are_adopted_in_its_zone(
    site: ZonedCluster,
) -> None:
    first = submit(site, endless("first"), through=EDGE_1)
    # elected: the origin (on a tie in capacity, the peer nearest the submitting one)
    assert cli_json(site, "status", first, "--via", via(site, SENSOR_2))["scheduler"] == "edge-1"
    ring = scheduling(site, EDGE_1)
    assert (ring["mode"], ring["zone"], ring["scheduler"], ring["apps"]) == (
        "zones",
        "north",
        True,
        1,
    )
    assert scheduling(site, EDGE_2)["scheduler"] is False

    second = submit(site, endless("second"), through=EDGE_2)  # found, not elected
    assert status(site, second, SENSOR_2)["scheduler"] == "edge-1"
    assert scheduling(site, EDGE_2)["scheduler"] is False
    assert scheduling(site, EDGE_1)["apps"] == 2
    apps = {a["app_id"]: a for a in request(site, SENSOR_2, "apps", {})}
    assert {apps[first]["scheduler"], apps[second]["scheduler"]} == {"edge-1"}
    # an app the scheduler refuses: its SpecError crosses two peers (edge-1, which
    # validates it, to edge-2, which handed it over, to here) with every problem's path
    unregistered = endless("unregistered")
    unregistered["operators"][0]["fn"] = "ab" * 32 + ":f"
    with pytest.raises(SpecError) as refused:
        request(site, EDGE_2, "submit", {"spec": unregistered})
    assert refused.value.paths == ("operators[0].fn",)
    assert refused.value.remote_peer == "edge-2"

    def produced(app_id: str) -> int:
        return int(status(site, app_id, SENSOR_2)["totals"]["sink_records"])

    poll(lambda: produced(first) > 500, what="output to flow")
    site.kill(EDGE_1)

    def adopted() -> dict[str, Any] | None:
        s = [status(site, a, SENSOR_2) for a in (first, second)]
        return s[0] if all(x["scheduler"] != "edge-1" for x in s) else None

    s = poll(adopted, what="a new scheduler to adopt the apps", timeout=60)
    new = s["scheduler"]
    assert new in NORTH - {"edge-1"}  # a peer of the dead scheduler's zone
    # the adopter's records show it before it finishes adopting and calls itself one
    poll(lambda: scheduling(site, NORTH_INDEX[new])["scheduler"], what="the adopter to schedule")
    for app_id in (first, second):
        after = status(site, app_id, SENSOR_2)
        assert after["state"] == "running"
        assert after["scheduler"] == new
        assert after["generation"] == 0  # never restarted: it kept running
        assert after["recoveries"] == []
    before = produced(first)
    poll(lambda: produced(first) > before + 400, what="the adopted app to keep producing")
    # the new scheduler now gets the apps' reports: stopping one works through it
    stopped = request(site, SENSOR_2, "stop", {"app_id": second})
    assert stopped["state"] == "stopped"


NORTH_INDEX = {"sensor-1": 0, "gateway-1": 2, "edge-1": 4, "edge-2": 5}


def test_a_live_scheduler_s_app_is_not_taken_over_by_a_peer_that_believes_it_dead(
    site: ZonedCluster,
) -> None:
    """What a peer cut off from the network asks when it comes back (the docker site's
    partition): its zone adopts the scheduler it saw die, and instances are told to
    report elsewhere. The scheduler still answers, so nothing moves, and the app's end
    still reaches it."""
    spec = endless("kept")
    spec["sources"][0]["params"]["count"] = 4_000  # 10 s at 400/s
    app_id = submit(site, spec, through=EDGE_1)
    assert status(site, app_id, SENSOR_2)["scheduler"] == "edge-1"

    assert request(site, EDGE_2, "zone_adopt", {"dead": "edge-1"}) is True
    elsewhere = list(site.address(EDGE_2))
    body = {"app_id": app_id, "scheduler": elsewhere}
    assert request(site, 0, "app_rebind", body) is False  # sensor-1 hosts the source

    s = status(site, app_id, SENSOR_2)
    assert (s["scheduler"], s["state"], s["generation"]) == ("edge-1", "running", 0)
    assert scheduling(site, EDGE_2)["apps"] == 0

    def ended() -> dict[str, Any] | None:
        s = status(site, app_id, EDGE_1)
        return s if s["state"] != "running" else None

    s = poll(ended, what="the app to end", timeout=60)
    assert (s["state"], s["scheduler"]) == ("finished", "edge-1")
    assert s["totals"]["sink_records"] == 4_000
