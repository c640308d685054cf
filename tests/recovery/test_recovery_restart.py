"""A peer restarts (``kill -9``, then started again at once with its state directory)
faster than the failure detector declares it dead. Before, its apps' other peers sent
it data it dropped as of an unknown app and waited for credit for ever, and an app
whose source it hosted never ended. Now the restarted peer tells the apps' schedulers,
the senders learn it no longer runs the app, and the app restarts from its last
committed checkpoint with the restarted peer keeping its part: the output is exact.

Real peer processes on loopback; the counting probe, whose output changes if one
record is lost or repeated."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apps import check_outputs, log_sizes
from support.processes import cli, formed_cluster
from test_recovery_kill import ERASURE, committed, finished, submit

from agiledart.app import parse_spec
from agiledart.apps.probes import counting
from agiledart.emulation import LocalCluster

pytestmark = [pytest.mark.processes]

SENSOR_1, SENSOR_2, EDGE_1 = 0, 1, 4


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path, 6, ["--workers", "0"]) as cluster:
        yield cluster


@pytest.mark.timeout(300)  # six peers, a restart and a 20 s grace on a loaded machine
@pytest.mark.parametrize(
    ("restarted", "what"), [(EDGE_1, "the running count"), (SENSOR_1, "the source")]
)
def test_a_peer_that_restarts_keeps_its_part_and_the_output_is_exact(
    site: LocalCluster, restarted: int, what: str
) -> None:
    spec_raw = counting("edge-1", count=24_000, checkpoint=ERASURE)
    spec = parse_spec(spec_raw)
    logs = log_sizes(site)
    app_id = submit(site, spec_raw, through=SENSOR_2)
    committed(site, app_id, SENSOR_2, 3_000)
    site.restart(restarted)
    s = finished(site, app_id, through=SENSOR_2)
    assert s["state"] == "finished", f"{what}: {s.get('error')}"
    name = site.name(restarted)
    events = [e for e in s["recoveries"] if e["dead"] == name]
    assert events, s["recoveries"]
    if restarted == SENSOR_1:  # pinned: only the restarted peer itself can say so
        assert [e["takeover"] for e in events] == [name]
        assert events[0]["restarted"] is True
    # the running count's peer may be noticed first by a sender that found it down for a
    # moment (its part then moves to a neighbour) or by its own word once back (it
    # keeps its part): either way, the output is exact
    check_outputs(site, spec, s, logs)
    text = cli(site, "status", app_id, "--via", "{}:{}".format(*site.address(SENSOR_2))).stdout
    assert f"  recovery: {name} " in text  # plain status says what happened, and where
    hosted_now = {op for op, peers in s["placement"].items() if events[0]["takeover"] in peers}
    assert set(events[0]["operators"]) <= hosted_now  # what moved (or stayed) is there now
    if restarted == EDGE_1:
        assert "counts" in events[0]["operators"]
    sink_path = s["peers"]["gateway-1"]["sinks"]["out"]["path"]
    assert Path(sink_path).is_absolute()
    assert f"  sink out @ gateway-1: {sink_path}" in text
