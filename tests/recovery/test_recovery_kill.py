"""A peer dies mid-run (``kill -9``): the app's scheduler notices (an instance cannot
reach it, or the failure detector declares it dead), moves what it hosted to the live
peer closest to its id and restarts the app; the sink's final output equals a run
without the failure, exactly: no key missing, none counted twice.

Real peer processes on loopback; the ``counter`` dataset with a keyed running count,
whose every output record names the count so far, so a lost or a repeated input
changes the output."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.apps import check_outputs, log_sizes
from support.processes import ask, cli_json, formed_cluster, poll

from agiledart.app import parse_spec
from agiledart.apps.probes import counting
from agiledart.cli.entry import build_parser
from agiledart.emulation import LocalCluster
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.keys import key_file_text, make_key_text
from agiledart.peer import Peer, PeerConfig
from agiledart.runtime.failover import PINNED_GRACE_S

pytestmark = [pytest.mark.processes]

PEERS = 6
SENSOR_1, GATEWAY_1, EDGE_1, EDGE_2 = 0, 2, 4, 5


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path, PEERS, ["--workers", "0"]) as cluster:
        yield cluster


def via(cluster: LocalCluster, i: int) -> str:
    host, port = cluster.address(i)
    return f"{host}:{port}"


def submit(cluster: LocalCluster, spec: dict[str, Any], through: int) -> str:
    assert cluster.workdir is not None
    path = cluster.workdir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(cli_json(cluster, "submit", str(path), "--via", via(cluster, through))["app_id"])


def status(cluster: LocalCluster, app_id: str, through: int) -> dict[str, Any]:
    return dict(ask(cluster, through, "status", {"app_id": app_id}))


def finished(cluster: LocalCluster, app_id: str, through: int) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        s = status(cluster, app_id, through)
        return s if s["state"] in ("finished", "failed", "stopped") else None

    return dict(poll(done, what=f"{app_id} to end", timeout=180))


def test_the_peer_of_a_stateful_operator_dies_and_the_output_is_exact(
    site: LocalCluster,
) -> None:
    spec_raw = counting("edge-1")
    spec = parse_spec(spec_raw)
    logs = log_sizes(site)
    app_id = submit(site, spec_raw, through=3)  # gateway-2 schedules it
    s = status(site, app_id, through=3)
    assert s["placement"]["counts"] == ["edge-1"]

    poll(
        lambda: status(site, app_id, through=3)["totals"]["sink_records"] > 3_000,
        what="output to flow",
    )
    site.kill(EDGE_1)
    s = finished(site, app_id, through=3)
    assert s["state"] == "finished", s.get("error")
    (event,) = s["recoveries"]
    assert event["dead"] == "edge-1"
    assert event["takeover"] != "edge-1"
    assert s["placement"]["counts"] == [event["takeover"]]
    assert s["generation"] == 1
    check_outputs(site, spec, s, logs)


def test_a_dead_peer_that_hosts_nothing_of_the_app_changes_nothing(
    site: LocalCluster,
) -> None:
    """Only what a dead peer *hosted* matters: the app simply finishes."""
    spec_raw = counting("edge-2", count=6_000)
    app_id = submit(site, spec_raw, through=3)
    site.kill(EDGE_1)
    s = finished(site, app_id, through=3)
    assert s["state"] == "finished"
    assert s["recoveries"] == []


def test_a_dead_source_peer_fails_the_app_with_a_clear_error(tmp_path: Path) -> None:
    # the scheduler (gateway-2) waits 2 s, not 20, for the source's peer to come back
    with formed_cluster(tmp_path, PEERS, ["--workers", "0", "--pinned-grace-s", "2"]) as site:
        spec_raw = counting("edge-1", count=60_000)
        app_id = submit(site, spec_raw, through=3)
        poll(
            lambda: status(site, app_id, through=3)["totals"]["sink_records"] > 1_000,
            what="output to flow",
        )
        site.kill(SENSOR_1)
        s = finished(site, app_id, through=3)
        assert s["state"] == "failed"
        assert "sensor-1" in s["error"]
        assert "source or sink" in s["error"]
        assert "not back within 2 s" in s["error"]  # the peer option took


def test_the_source_peer_grace_and_the_report_timeout_are_peer_options(tmp_path: Path) -> None:
    parse = build_parser().parse_args
    args = parse(["peer", "--listen", "127.0.0.1:0", "--pinned-grace-s", "2.5"])
    assert args.pinned_grace_s == 2.5
    with pytest.raises(SystemExit):
        parse(["peer", "--listen", "127.0.0.1:0", "--pinned-grace-s", "-1"])
    key = ClusterKey.from_material(key_file_text([make_key_text()]))
    config = PeerConfig(listen=("127.0.0.1", 0), state_dir=tmp_path, pinned_grace_s=2.5)
    assert Peer(config, key).runtime.scheduler.pinned_grace_s == 2.5
    default = PeerConfig(listen=("127.0.0.1", 0), state_dir=tmp_path / "d")
    assert Peer(default, key).runtime.scheduler.pinned_grace_s == PINNED_GRACE_S == 20
    # and how long a sink's end or a failure waits for the scheduler's answer
    args = parse(["peer", "--listen", "127.0.0.1:0", "--report-timeout-s", "3"])
    assert args.report_timeout_s == 3.0
    with pytest.raises(SystemExit):
        parse(["peer", "--listen", "127.0.0.1:0", "--report-timeout-s", "0"])
    config = PeerConfig(listen=("127.0.0.1", 0), state_dir=tmp_path / "r", report_timeout_s=3)
    assert Peer(config, key).runtime.hosting.report_timeout_s == 3
    assert Peer(default, key).runtime.hosting.report_timeout_s == 30


def test_the_scheduler_dies_with_the_stateful_operator_and_a_neighbour_adopts_the_app(
    site: LocalCluster,
) -> None:
    """The peer the app was submitted through (its scheduler) also hosts its running
    count: the dead peer's closest neighbour adopts the app from the DHT and restarts
    it; the output is still exact."""
    spec_raw = counting("edge-1")
    spec = parse_spec(spec_raw)
    logs = log_sizes(site)
    app_id = submit(site, spec_raw, through=EDGE_1)
    assert status(site, app_id, through=3)["scheduler"] == "edge-1"
    poll(
        lambda: status(site, app_id, through=3)["totals"]["sink_records"] > 3_000,
        what="output to flow",
    )
    site.kill(EDGE_1)
    s = finished(site, app_id, through=3)
    assert s["state"] == "finished", s.get("error")
    assert s["scheduler"] != "edge-1"
    (event,) = s["recoveries"]
    assert event["dead"] == "edge-1"
    assert event["by"] == s["scheduler"]
    check_outputs(site, spec, s, logs)


ERASURE = {"mode": "erasure", "interval_ms": 800, "m": 3, "k": 2}


def committed(cluster: LocalCluster, app_id: str, through: int, records: int) -> dict[str, Any]:
    """Status once an epoch is committed and ``records`` have reached the sink."""

    def ready() -> dict[str, Any] | None:
        s = status(cluster, app_id, through)
        ok = s["checkpoint"] is not None and s["totals"]["sink_records"] > records
        return s if ok else None

    return dict(poll(ready, what="a committed checkpoint", timeout=120))


def test_checkpointed_state_is_restored_elsewhere_and_the_output_is_exact(
    site: LocalCluster,
) -> None:
    spec_raw = counting("edge-1", count=30_000, checkpoint=ERASURE)
    spec = parse_spec(spec_raw)
    logs = log_sizes(site)
    app_id = submit(site, spec_raw, through=3)
    before = committed(site, app_id, 3, 4_000)
    assert before["checkpoint"]["bytes"] > 0
    site.kill(EDGE_1)
    s = finished(site, app_id, through=3)
    assert s["state"] == "finished", s.get("error")
    (event,) = s["recoveries"]
    assert event["mode"] == "checkpoint"
    assert event["epoch"] >= before["checkpoint"]["epoch"]
    check_outputs(site, spec, s, logs)


def test_the_host_and_k_fragment_holders_die_at_once(site: LocalCluster) -> None:
    """m = 3, k = 2 on 6 peers: the running count's host (edge-1) and two of its
    fragment holders (edge-2, which also runs an operator, and gateway-2) are killed
    together; the three holders left rebuild the state."""
    spec_raw = counting("edge-1", count=30_000, checkpoint=ERASURE)
    spec = parse_spec(spec_raw)
    logs = log_sizes(site)
    app_id = submit(site, spec_raw, through=1)  # sensor-2 schedules it and lives
    committed(site, app_id, 1, 4_000)
    for i in (EDGE_1, EDGE_2, 3):  # all three signalled before any is reaped: together
        site.procs[i].kill()
    for i in (EDGE_1, EDGE_2, 3):
        site.procs[i].wait()
    s = finished(site, app_id, through=1)
    assert s["state"] == "finished", s.get("error")
    # gateway-2 only held fragments: nothing of the app ran there
    assert {e["dead"] for e in s["recoveries"]} == {"edge-1", "edge-2"}
    assert {e["mode"] for e in s["recoveries"]} == {"checkpoint"}
    check_outputs(site, spec, s, logs)
