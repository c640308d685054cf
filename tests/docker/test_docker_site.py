"""A multi-node site in docker compose (docs/docker.md, issue 10): images built from the
local Debian base with no registry, Mosquitto, the sensor simulator and 6 peers in
three zones; apps submitted with the CLI from inside peer containers; a peer hosting a
stateful operator ``docker kill``-ed; a peer cut off with ``docker network disconnect``
and reconnected. The steps are those of ``scripts/docker_emulation.py`` (the README
walk-through), each checking its results exactly against the plain-Python reference.

The tests share one site and run in file order."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.timeout(600)]

ZONES = {"sensor": "field", "gateway": "uplink", "edge": "edge"}


def test_six_peers_in_three_zones_form_one_ring(site: Any, emulation: ModuleType) -> None:
    for peer in emulation.PEERS:
        ring = site.cli(peer, "ring")
        assert ring["self"] == peer
        assert ring["zone"] == ZONES[peer.split("-")[0]]
        assert {p["name"] for p in ring["peers"]} >= set(emulation.PEERS) - {peer}
        assert ring["address"].startswith(site.env["SITE_SUBNET"].rsplit(".", 2)[0])


def test_urban_sensing_from_a_peer_container_is_exact(site: Any, emulation: ModuleType) -> None:
    s = emulation.urban_sensing(site, through="edge-2")
    assert s["scheduler"] == "edge-2"
    assert set(s["placement"]) >= {"averages", "peaks", "readings"}


def test_an_mqtt_app_reads_the_simulated_sensors(site: Any, emulation: ModuleType) -> None:
    emulation.mqtt_sensors(site, through="sensor-1", count=200)


def test_every_peer_container_is_healthy(site: Any, emulation: ModuleType) -> None:
    def healthy() -> bool:
        for peer in emulation.PEERS:
            cid = site.container(peer)
            out = emulation.sh(["docker", "inspect", "--format", "{{json .State.Health}}", cid])
            if json.loads(out.stdout)["Status"] != "healthy":
                return False
        return True

    emulation.poll(healthy, what="every peer's health check to pass", timeout=120)


def test_docker_kill_of_a_stateful_operators_peer_keeps_the_output_exact(
    site: Any, emulation: ModuleType
) -> None:
    emulation.kill_stateful_peer(site, "edge-1", through="gateway-2")
    assert set(site.alive()) == set(emulation.PEERS)  # started again, in the ring


def test_a_peer_cut_off_and_reconnected_rejoins_and_the_apps_go_on(
    site: Any, emulation: ModuleType
) -> None:
    alive = site.alive()
    cut = emulation.partition(site, alive, through="gateway-2", seconds=8.0)
    assert cut in alive
    ring = site.cli(cut, "ring")
    assert {p["name"] for p in ring["peers"] if not p["suspect"]} >= set(alive) - {cut}


def test_every_peer_wrote_traces_to_the_volume(
    site: Any, emulation: ModuleType, tmp_path: Path
) -> None:
    assert site.copy_traces(tmp_path) > 0
    folders = {p.name for p in tmp_path.iterdir() if p.is_dir()}
    assert folders >= set(emulation.PEERS), folders


def test_teardown_leaves_no_container_network_or_volume(site: Any) -> None:
    assert site.leftovers() != []
    site.down()
    assert site.leftovers() == []
