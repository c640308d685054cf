"""The large-scale mode, small: 1,000 peers on the fake network, 100 apps, the real
overlay routing, zone logic and placement (paper Fig. 10 at a tenth of the size)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agiledart.largescale import ScaleConfig, ScaleError, simulate
from agiledart.overlay.fakenet import run_virtual
from agiledart.zones import APP_CAP, hop_budget

PEERS = 1000


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    config = ScaleConfig(peers=PEERS, zones=9, rounds=(50, 100), seed=5)
    return run_virtual(simulate(config))


def test_schedulers_are_found_within_the_hop_budget(result: dict[str, Any]) -> None:
    assert result["hop_budget"] == hop_budget(PEERS) == 3
    for rnd in result["rounds"]:
        assert rnd["p99_scheduler_hops"] <= 3
        assert max(int(h) for h in rnd["scheduler_hops"]) <= 3
        assert sum(rnd["scheduler_hops"].values()) == rnd["apps"]


def test_one_scheduler_per_50_apps_of_each_zone(result: dict[str, Any]) -> None:
    for rnd in result["rounds"]:
        assert rnd["false_elections"] == 0  # never elected while one had room
        for zone, apps in rnd["apps_per_zone"].items():
            assert rnd["schedulers_per_zone"][zone] == math.ceil(apps / APP_CAP)
    last = result["rounds"][-1]
    assert last["elections"] == last["schedulers"] >= len(last["apps_per_zone"])


def test_operators_are_spread_more_evenly_than_at_random(result: dict[str, Any]) -> None:
    last = result["rounds"][-1]
    assert last["unplaced"] == 0
    per_peer = {int(k): v for k, v in last["ops_per_peer"].items()}
    assert sum(per_peer.values()) == PEERS
    assert sum(k * v for k, v in per_peer.items()) == last["operators"]
    mean = last["operators"] / PEERS
    assert 0.8 < mean < 1.2  # 100 apps of 10 operators on average
    # a peer hosting 4 or more: rarer than if every operator picked a peer at random
    poisson_ge4 = 1 - sum(math.exp(-mean) * mean**k / math.factorial(k) for k in range(4))
    assert 1 - last["frac_peers_lt4_ops"] < poisson_ge4 / 1.5
    assert last["frac_peers_lt4_ops"] >= 0.998  # the 10,000-peer target (paper: 99.84%)


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ScaleError):
        ScaleConfig(peers=1)
    with pytest.raises(ScaleError):
        ScaleConfig(peers=10, zones=20)
    with pytest.raises(ScaleError):
        ScaleConfig(rounds=(500, 250))
