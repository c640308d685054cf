"""Placement strategies on real peers over an emulated edge + cloud link model.

The bundled ETL app is submitted with ``placement: rtr`` and ``placement: lb``; its
output must equal the plain-Python reference exactly, and the placement ``status``
shows must be the one :func:`agiledart.placement.place_with` computes from the same
ring answers and link model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.apps import check_outputs, quick
from support.processes import cli_json, free_port, poll

from agiledart import apps
from agiledart.emulation import LocalCluster
from agiledart.placement import place_with
from agiledart.placement.survey import topology_of
from agiledart.runtime.linkmodel import LinkModel

pytestmark = [pytest.mark.processes, pytest.mark.slow]

NAMES = ("sensor-1", "gateway-1", "edge-1", "wan-1", "cloud-1")
LINKS = {
    "format": "agiledart-bandit-graph",
    "version": 1,
    "name": "edge-cloud-small",
    "slot_ms": 5.0,
    "undirected": True,
    "source": "sensor-1",
    "sink": "cloud-1",
    "nodes": list(NAMES),
    "links": [
        {"from": "sensor-1", "to": "gateway-1", "theta": 1.0},
        {"from": "edge-1", "to": "gateway-1", "theta": 1.0},
        {"from": "gateway-1", "to": "wan-1", "theta": 1.0},
        {"from": "wan-1", "to": "cloud-1", "theta": 1.0},
    ],
}


@dataclass
class Site(LocalCluster):
    """Peers named after :data:`NAMES`, the cloud one in zone ``cloud`` with 2 workers."""

    names: tuple[str, ...] = NAMES
    per_peer: dict[str, list[str]] = field(default_factory=dict)

    def name(self, i: int) -> str:
        return self.names[i]

    def start(self, i: int) -> Any:
        common = self.extra_args
        self.extra_args = [*common, *self.per_peer.get(self.names[i], [])]
        try:
            return super().start(i)
        finally:
            self.extra_args = common


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Site, Path]]:
    root = tmp_path_factory.mktemp("placement")
    links = root / "links.json"
    links.write_text(json.dumps(LINKS))
    cluster = Site(
        len(NAMES),
        port=free_port(),
        workdir=root,
        extra_args=["--links", str(links), "--workers", "1"],
        per_peer={"cloud-1": ["--zone", "cloud", "--workers", "2"]},
    )
    with cluster:
        asyncio.run(cluster.wait_formed())
        yield cluster, links


def rings(cluster: Site) -> dict[str, dict[str, Any]]:
    async def all_rings() -> list[Any]:
        return await asyncio.gather(*(cluster.ring(i) for i in range(cluster.peers)))

    got = asyncio.run(all_rings())
    return {r["self"]: r for r in got if r is not None}


def idle(cluster: Site) -> dict[str, dict[str, Any]] | None:
    got = rings(cluster)
    return None if any(r["apps"] for r in got.values()) else got


@pytest.mark.parametrize("strategy", ["rtr", "lb"])
def test_a_bundled_app_is_exact_and_placed_as_the_pure_function_says(
    site: tuple[Site, Path], strategy: str
) -> None:
    cluster, links = site
    overrides = ["params.count=6000", f"placement={strategy}"]
    overrides += quick(apps.load("etl", overrides=overrides))
    spec = apps.load("etl", overrides=overrides)
    # the survey sees what we see once no peer runs an app any more
    answers = poll(lambda: idle(cluster), what="every peer idle")
    want = place_with(strategy, spec, topology_of(answers, LinkModel.load(links)))
    args = [a for o in overrides for a in ("--set", o)]
    via = ["--via", "{}:{}".format(*cluster.address(NAMES.index("edge-1")))]
    status = cli_json(cluster, "submit", "etl", *args, "--wait", *via)
    check_outputs(cluster, spec, status, {})
    assert status["strategy"] == strategy
    assert status["placement"] == {op: list(ps) for op, ps in want.operators.items()}
    assert status["paths"] == [list(p) for p in want.paths.values()]
    if strategy == "rtr":  # latency-aware: nothing goes over the WAN to the cloud
        assert not {"wan-1", "cloud-1"} & {p for ps in status["placement"].values() for p in ps}
