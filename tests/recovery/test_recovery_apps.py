"""The bundled urban-sensing and taxi (profitable-areas) apps lose a peer that is
neither a source nor a sink: the output is exactly the plain-Python reference.

A stateful operator of each app is pinned (``--set operators.X.peer=edge-1``) to a peer
that runs no source or sink, so that the peer killed mid-run does host part of the
app; these finite apps restart (checkpoint mode ``auto``); the urban one is also run
with erasure-coded checkpoints."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.apps import check_outputs, log_sizes, quick
from support.processes import ask, cli_json, formed_cluster, poll

from agiledart import apps
from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster

pytestmark = [pytest.mark.processes, pytest.mark.slow]

PEERS = 7
EDGE_1 = 4
VIA = 6  # edge-3 schedules


@pytest.fixture
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path_factory.mktemp("apps"), PEERS, ["--workers", "0"]) as c:
        yield c


def via(cluster: LocalCluster) -> str:
    return "{}:{}".format(*cluster.address(VIA))


@pytest.mark.parametrize(
    ("app", "pinned", "extra"),
    [
        ("urban-sensing", "averages", []),
        (
            "urban-sensing",
            "peaks",
            ["checkpoint.mode=erasure", "checkpoint.interval_ms=700"],
        ),
        ("profitable-areas", "areas", []),
    ],
)
def test_a_bundled_app_survives_a_dead_peer(
    site: LocalCluster, app: str, pinned: str, extra: list[str]
) -> None:
    names = [site.name(i) for i in range(PEERS)]
    overrides = [f"operators.{pinned}.peer=edge-1", *extra]
    spec = parse_spec(apps.text(app), overrides=overrides, known_peers=names)
    overrides += quick(spec, seconds=8.0)
    spec = parse_spec(apps.text(app), overrides=overrides, known_peers=names)
    logs = log_sizes(site)
    sets = [a for o in overrides for a in ("--set", o)]
    app_id = cli_json(site, "submit", app, *sets, "--via", via(site))["app_id"]
    s = cli_json(site, "status", app_id, "--via", via(site))
    assert s["placement"][pinned] == ["edge-1"]

    def flowing() -> bool:
        st = ask(site, VIA, "status", {"app_id": app_id})
        enough = st["totals"]["sink_records"] > 0
        if "checkpoint.mode=erasure" in extra:
            enough = enough and st["checkpoint"] is not None
        return bool(enough)

    poll(flowing, what="results", timeout=120)
    site.kill(EDGE_1)

    def ended() -> dict[str, object] | None:
        st = ask(site, VIA, "status", {"app_id": app_id})
        return st if st["state"] in ("finished", "failed", "stopped") else None

    s = poll(ended, what=f"{app} to end", timeout=240)
    assert s["state"] == "finished", s.get("error")
    assert [e["dead"] for e in s["recoveries"]] == ["edge-1"]
    check_outputs(site, spec, s, logs)
