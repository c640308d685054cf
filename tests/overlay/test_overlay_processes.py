"""Real `agiledart peer` processes on loopback, driven through the real CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from support.processes import cli, cli_json, poll, try_cli_json

from agiledart.emulation import LocalCluster

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

N = 12


def via(cluster: LocalCluster, i: int) -> list[str]:
    return ["--via", "{}:{}".format(*cluster.address(i))]


def test_ring_routes_and_a_killed_peer(cluster_factory: Callable[[int], LocalCluster]) -> None:
    """Through the CLI from one peer, and the same requests (what ``--json`` prints)
    from every other peer at once."""
    cluster = cluster_factory(N)
    names = {cluster.name(i) for i in range(N)}

    def ring_complete() -> dict[str, object] | None:
        info = try_cli_json(cluster, "ring", *via(cluster, 3))  # None while it starts
        if info is None:
            return None
        return info if {p["name"] for p in info["peers"]} | {info["self"]} == names else None

    info = poll(ring_complete, what="`agiledart ring` to show all 12 peers")
    assert info["self"] == cluster.name(3)
    ids = {p["name"]: p["node_id"] for p in info["peers"]}
    assert len(info["leaf_set"]) == 8
    asyncio.run(cluster.wait_formed())

    def from_each(rpc: str, body: dict[str, Any], peers: list[int]) -> list[Any]:
        """``rpc`` asked of each of ``peers``, the first through the CLI."""
        rest = asyncio.run(_gather(cluster.request(i, rpc, body) for i in peers[1:]))
        args = [rpc, *([body["to"]] if "to" in body else []), *via(cluster, peers[0])]
        return [cli_json(cluster, *args), *rest]

    sink = cluster.name(N - 1)
    for i, route in enumerate(from_each("route", {"to": sink}, list(range(N)))):
        path = [h["name"] for h in route["path"]]
        assert path[0] == cluster.name(i)
        assert path[-1] == sink, f"JOIN from {cluster.name(i)} ended at {path[-1]}"
        assert len(path) == len(set(path)) <= 4  # loop-free and short
        assert route["key"] == ids.get(sink, route["key"])
        assert all(h["rtt_ms"] is not None and h["rtt_ms"] >= 0 for h in route["path"][1:])

    # kill -9 one peer in the middle; its leaf-set neighbours must drop it
    victim = 5
    victim_name = cluster.name(victim)
    others = [i for i in range(N) if i != victim]
    rings = from_each("ring", {}, others)
    neighbours = [i for i, r in zip(others, rings, strict=True) if victim_name in r["leaf_set"]]
    assert neighbours
    cluster.kill(victim)

    def dropped_everywhere() -> bool:
        rings = asyncio.run(_gather(cluster.request(i, "ring", {}) for i in neighbours))
        return all(victim_name not in r["leaf_set"] for r in rings)

    poll(dropped_everywhere, what=f"leaf-set neighbours to drop {victim_name}")
    for route in from_each("route", {"to": sink}, others[::-1]):
        path = [h["name"] for h in route["path"]]
        assert victim_name not in path
        assert path[-1] == sink
    # the dead peer's own id now lands on a live peer
    route = cli_json(cluster, "route", ids[victim_name], *via(cluster, 0))
    assert route["path"][-1]["name"] != victim_name


async def _gather(calls: Iterable[Awaitable[Any]]) -> list[Any]:
    return list(await asyncio.gather(*calls))


def test_cli_errors_are_clear(cluster_factory: Callable[[int], LocalCluster]) -> None:
    cluster = cluster_factory(2)
    asyncio.run(cluster.wait_formed())
    proc = cli(cluster, "route", "no-such-peer", *via(cluster, 0), check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: ")
    assert "no-such-peer" in proc.stderr
    proc = cli(cluster, "ring", "--via", "127.0.0.1:1", "--timeout", "2", check=False)
    assert proc.returncode == 1
    assert "Error: " in proc.stderr
    proc = cli(cluster, "ring", "--via", "nonsense", check=False)
    assert proc.returncode == 1
    assert "HOST:PORT" in proc.stderr
    proc = cli(cluster, "ring", "--bogus-flag", check=False)
    assert proc.returncode == 2


def test_a_peer_without_a_key_refuses_to_start_and_says_how_to_make_one(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGILEDART_CLUSTER_KEY"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agiledart.cli",
            "peer",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 1
    assert "Error: no cluster key" in proc.stderr
    assert "agiledart keygen" in proc.stderr
    assert "--insecure" in proc.stderr


class ByHostName(LocalCluster):
    """Peer ``a`` on 127.0.0.1, peer ``b`` on 127.0.0.3 joining through ``localhost``."""

    def address(self, i: int) -> tuple[str, int]:
        return ("127.0.0.1" if i == 0 else "127.0.0.3", self.port)

    def name(self, i: int) -> str:
        return "ab"[i]

    def bootstrap(self, i: int) -> list[str]:
        return ["--bootstrap", f"localhost:{self.port}"] if i > 0 else []  # a host *name*


def test_bootstrap_by_host_name_and_a_stable_id_across_restarts(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(2, kind=ByHostName)

    def ring_of_b() -> dict[str, Any] | None:
        info = try_cli_json(cluster, "ring", *via(cluster, 1), "--timeout", "2")
        return info if info is not None and "a" in {p["name"] for p in info["peers"]} else None

    first = poll(ring_of_b, what="b to join through localhost")["node_id"]
    cluster.procs[1].terminate()
    cluster.procs[1].wait(timeout=30)
    cluster.procs[1] = cluster.start(1)
    again = poll(ring_of_b, what="b to rejoin after a restart")
    assert again["node_id"] == first
