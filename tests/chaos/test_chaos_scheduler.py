"""Found by the chaos soak (seed 3): an app whose scheduler is down when its sink ends.

A sink reports its end to the app's scheduler. When that scheduler was killed (its
neighbour adopts the app once the failure detector declares it dead, seconds later),
or killed and restarted with the same state dir before anyone declared it dead (the
new process knew nothing of its apps), the report was lost and the app stayed
"running" forever. Now a sink reports until a scheduler takes the report, and a
restarted peer takes back the apps the records store says it schedules.

Real peer processes; the counting probe with every operator pinned away from the
scheduler (``edge-1``), so the app runs on without a restart and only its end needs
the scheduler."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.apps import check_outputs, log_sizes
from support.processes import cli_json, formed_cluster, poll, try_cli_json

from agiledart.app import parse_spec
from agiledart.apps.probes import counting
from agiledart.emulate import LocalCluster

pytestmark = [pytest.mark.processes]

PEERS = 6
EDGE_1 = 4  # schedules the app and hosts none of it
EDGE_2 = 5  # hosts its map and running count
ASK = 3  # gateway-2 answers status


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path, PEERS, ["--workers", "0"]) as cluster:
        yield cluster


def via(cluster: LocalCluster, i: int) -> str:
    return "{}:{}".format(*cluster.address(i))


def status(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    return dict(cli_json(cluster, "status", app_id, "--via", via(cluster, ASK)))


def start_app(cluster: LocalCluster, count: int = 4_000) -> tuple[dict[str, Any], str]:
    raw = counting("edge-2", count=count, rate=1_000)
    raw["operators"][0]["peer"] = "sensor-1"  # nothing of the app on edge-1
    assert cluster.workdir is not None
    path = cluster.workdir / "counting.yaml"
    path.write_text(yaml.safe_dump(raw))
    app_id = cli_json(cluster, "submit", str(path), "--via", via(cluster, EDGE_1))["app_id"]
    s = status(cluster, app_id)
    assert s["scheduler"] == "edge-1"
    assert "edge-1" not in {p for peers in s["placement"].values() for p in peers}
    poll(lambda: status(cluster, app_id)["totals"]["sink_records"] > 0, what="output to flow")
    return raw, str(app_id)


def ended(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        s = try_cli_json(cluster, "status", app_id, "--via", via(cluster, ASK))
        return s if s is not None and s["state"] in ("finished", "failed", "stopped") else None

    return dict(poll(done, what=f"{app_id} to end", timeout=90))


def test_a_sink_ending_while_its_scheduler_is_dead_still_ends_the_app(
    site: LocalCluster,
) -> None:
    logs = log_sizes(site)
    raw, app_id = start_app(site)
    site.kill(EDGE_1)  # the sink ends (about 4 s in) before edge-1 is declared dead
    s = ended(site, app_id)
    assert s["state"] == "finished", s.get("error")
    check_outputs(site, parse_spec(raw), s, logs)


def test_a_scheduler_restarted_before_it_is_declared_dead_takes_its_apps_back(
    site: LocalCluster,
) -> None:
    logs = log_sizes(site)
    raw, app_id = start_app(site)
    site.kill(EDGE_1)
    site.procs[EDGE_1] = site.start(EDGE_1)  # same state dir: same name and node id
    s = ended(site, app_id)
    assert s["state"] == "finished", s.get("error")
    check_outputs(site, parse_spec(raw), s, logs)


def test_a_host_dies_while_its_scheduler_is_frozen_and_the_adopter_recovers_it(
    site: LocalCluster,
) -> None:
    """Chaos seed 18: a host's death is news while nobody schedules the app (the
    scheduler is gone, its adopter has not taken the app yet): the instances and the
    host's neighbour tell the old scheduler, which never answers. The adopter finds
    the silent host itself and restarts the app without it."""
    logs = log_sizes(site)
    raw, app_id = start_app(site, count=12_000)  # the count and the map run on edge-2
    site.procs[EDGE_1].send_signal(signal.SIGSTOP)  # frozen for good: killed below
    site.kill(EDGE_2)
    s = ended(site, app_id)
    site.kill(EDGE_1)
    assert s["state"] == "finished", s.get("error")
    assert [e["dead"] for e in s["recoveries"]] == ["edge-2"]
    check_outputs(site, parse_spec(raw), s, logs)
