"""The checkpoint fragments of an app that ended are collected from every holder: an
erasure-checkpointed app that finishes, and one that is stopped, leave nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from support.apps import quick
from support.processes import ask, cli, cli_json, formed_cluster, poll

from agiledart import apps
from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster

pytestmark = [pytest.mark.processes, pytest.mark.slow]

PEERS = 6
VIA = 5
CHECKPOINTED = ["checkpoint.mode=erasure", "checkpoint.interval_ms=500"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path_factory.mktemp("gc"), PEERS, ["--workers", "0"]) as c:
        yield c


def via(cluster: LocalCluster) -> list[str]:
    return ["--via", "{}:{}".format(*cluster.address(VIA))]


def held(cluster: LocalCluster, app_id: str) -> list[dict[str, Any]]:
    async def ask() -> list[dict[str, Any]]:
        return [
            (await cluster.request(i, "frag_held", {"app": app_id}))["held"] for i in range(PEERS)
        ]

    return asyncio.run(ask())


def submit(cluster: LocalCluster, overrides: list[str]) -> str:
    sets = [a for o in overrides for a in ("--set", o)]
    return str(cli_json(cluster, "submit", "urban-sensing", *sets, *via(cluster))["app_id"])


def checkpointed(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    def committed() -> dict[str, Any] | None:
        st = ask(cluster, VIA, "status", {"app_id": app_id})
        return st if st["checkpoint"] is not None and any(held(cluster, app_id)) else None

    status: dict[str, Any] = poll(committed, what=f"a checkpoint of {app_id}", timeout=120)
    return status


def test_an_ended_apps_fragments_are_dropped_by_every_holder(site: LocalCluster) -> None:
    names = [site.name(i) for i in range(PEERS)]
    spec = parse_spec(apps.text("urban-sensing"), overrides=CHECKPOINTED, known_peers=names)
    finite = submit(site, [*CHECKPOINTED, *quick(spec, seconds=6.0)])
    endless = submit(site, [*CHECKPOINTED, "params.rate=50", "params.count=100000000"])
    checkpointed(site, finite)
    checkpointed(site, endless)
    cli(site, "stop", endless, *via(site))

    def finished() -> bool:
        st = ask(site, VIA, "status", {"app_id": finite})
        assert st["state"] in ("running", "finished"), st.get("error")
        return bool(st["state"] == "finished")

    poll(finished, what=f"{finite} to finish", timeout=120)
    for app_id in (finite, endless):
        poll(lambda a=app_id: not any(held(site, a)), what=f"{app_id}'s fragments dropped")
