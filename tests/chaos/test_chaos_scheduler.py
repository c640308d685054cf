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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.apps import check_outputs, log_sizes
from support.processes import ask, cli_json, formed_cluster, poll, try_ask

from agiledart.app import parse_spec
from agiledart.apps.probes import counting
from agiledart.emulation import LocalCluster, site_name

pytestmark = [pytest.mark.processes]

PEERS = 6
EDGE_1 = 4  # schedules the app and hosts none of it
EDGE_2 = 5  # hosts its map and running count
ASK = 3  # gateway-2 answers status


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LocalCluster]:
    # a report to a frozen scheduler is sent again after 3 s, not 30 (then to the adopter)
    with formed_cluster(tmp_path, PEERS, ["--workers", "0", "--report-timeout-s", "3"]) as cluster:
        yield cluster


def via(cluster: LocalCluster, i: int) -> str:
    return "{}:{}".format(*cluster.address(i))


def status(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    return dict(ask(cluster, ASK, "status", {"app_id": app_id}))


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
        s = try_ask(cluster, ASK, "status", {"app_id": app_id})
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
    # the count and the map run on edge-2; its death restarts the app from the start, so
    # the count only lengthens the rerun (6 s at 1000/s)
    raw, app_id = start_app(site, count=6_000)
    site.procs[EDGE_1].send_signal(signal.SIGSTOP)  # frozen for good: killed below
    site.kill(EDGE_2)
    s = ended(site, app_id)
    site.kill(EDGE_1)
    assert s["state"] == "finished", s.get("error")
    assert [e["dead"] for e in s["recoveries"]] == ["edge-2"]
    check_outputs(site, parse_spec(raw), s, logs)


def node_ids(cluster: LocalCluster) -> dict[str, int]:
    ring = cli_json(cluster, "ring", "--via", via(cluster, 0))
    ids = {p["name"]: int(p["node_id"], 16) for p in ring["peers"]}
    ids[ring["self"]] = int(ring["node_id"], 16)
    return ids


def test_a_scheduler_and_its_closest_neighbour_killed_together_still_end_the_app(
    site: LocalCluster,
) -> None:
    """Chaos seed 64: the scheduler and its closest neighbour (its adopter) killed
    together. The next closest peer saw the scheduler's death while the neighbour still
    counted as live and deferred to it; once the neighbour was declared dead too,
    nobody revisited the scheduler's death, and its app never ended. The app runs on two
    other peers, so only its end needs a scheduler."""
    ids = node_ids(site)
    names = [site_name(i) for i in range(PEERS)]
    scheduler = names[EDGE_1]
    neighbour = min((n for n in names if n != scheduler), key=lambda n: ids[n] ^ ids[scheduler])
    source_peer, sink_peer = [n for n in names if n not in (scheduler, neighbour)][:2]
    raw = counting(sink_peer, count=6_000, rate=1_000)
    raw["sources"][0]["peer"] = source_peer
    raw["operators"][0]["peer"] = source_peer
    raw["operators"][1]["peer"] = source_peer
    raw["sinks"][0]["peer"] = sink_peer
    logs = log_sizes(site)
    assert site.workdir is not None
    path = site.workdir / "counting.yaml"
    path.write_text(yaml.safe_dump(raw))
    app_id = cli_json(site, "submit", str(path), "--via", via(site, EDGE_1))["app_id"]
    at = names.index(sink_peer)
    poll(
        lambda: ask(site, at, "status", {"app_id": app_id})["totals"]["sink_records"] > 0,
        what="output to flow",
    )
    site.kill(EDGE_1)
    time.sleep(1.0)  # the next closest peer hears of the scheduler's death first
    site.kill(names.index(neighbour))

    def done() -> dict[str, Any] | None:
        s = try_ask(site, at, "status", {"app_id": app_id})
        return s if s is not None and s["state"] in ("finished", "failed", "stopped") else None

    s = dict(poll(done, what=f"{app_id} to end", timeout=90))
    assert s["state"] == "finished", s.get("error")
    assert s["scheduler"] not in (scheduler, neighbour)
    check_outputs(site, parse_spec(raw), s, logs)


FAILS_LATE = """def fail_late(r):
    if r["seq"] >= 9_000:
        raise ValueError(f"seq {r['seq']} is too late")
    return r
"""


def test_an_instance_failing_while_its_scheduler_is_dead_still_fails_the_app(
    site: LocalCluster,
) -> None:
    """An instance's failure was reported to the app's scheduler 3 times, always to the
    scheduler it knew when it failed: with that scheduler frozen (its adopter takes the
    app seconds later), the report was lost and the app, its sink waiting for the failed
    instance, never ended. Now a failure is reported until a scheduler takes it, to the
    adopter once it rebinds the app, like a sink's end."""
    assert site.workdir is not None
    bundle = site.workdir / "late.py"
    bundle.write_text(FAILS_LATE)
    code_id = cli_json(site, "register", str(bundle), "--via", via(site, ASK))["code_id"]
    raw = counting("edge-2", count=12_000, rate=1_000)
    raw["operators"][0]["peer"] = "sensor-1"  # nothing of the app on edge-1
    scaled = raw["operators"][1]
    scaled.pop("params")
    scaled.update(fn=f"{code_id}:fail_late", on_error="fail")
    path = site.workdir / "late.yaml"
    path.write_text(yaml.safe_dump(raw))
    app_id = cli_json(site, "submit", str(path), "--via", via(site, EDGE_1))["app_id"]
    poll(lambda: status(site, app_id)["totals"]["sink_records"] > 0, what="output to flow")
    site.procs[EDGE_1].send_signal(signal.SIGSTOP)  # the map fails 9 s in, meanwhile
    s = ended(site, app_id)
    site.kill(EDGE_1)
    assert s["state"] == "failed"
    assert "ValueError: seq 9000 is too late" in s["error"]
    assert s["scheduler"] != "edge-1"
