"""Real `agiledart peer` processes on loopback, driven through the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.processes import cli, cli_json, free_port, poll, try_cli_json

from agiledart.emulation import LocalCluster
from agiledart.overlay.keys import make_key_text

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

N = 12


def via(cluster: LocalCluster, i: int) -> list[str]:
    return ["--via", "{}:{}".format(*cluster.address(i))]


def test_ring_routes_and_a_killed_peer(cluster_factory: Callable[[int], LocalCluster]) -> None:
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

    sink = cluster.name(N - 1)
    for i in range(N):
        route = cli_json(cluster, "route", sink, *via(cluster, i))
        path = [h["name"] for h in route["path"]]
        assert path[0] == cluster.name(i)
        assert path[-1] == sink, f"JOIN from {cluster.name(i)} ended at {path[-1]}"
        assert len(path) == len(set(path)) <= 4  # loop-free and short
        assert route["key"] == ids.get(sink, route["key"])
        assert all(h["rtt_ms"] is not None and h["rtt_ms"] >= 0 for h in route["path"][1:])

    # kill -9 one peer in the middle; its leaf-set neighbours must drop it
    victim = 5
    victim_name = cluster.name(victim)
    neighbours = [
        i
        for i in range(N)
        if i != victim and victim_name in (cli_json(cluster, "ring", *via(cluster, i))["leaf_set"])
    ]
    assert neighbours
    cluster.kill(victim)

    def dropped_everywhere() -> bool:
        return all(
            victim_name not in cli_json(cluster, "ring", *via(cluster, i))["leaf_set"]
            for i in neighbours
        )

    poll(dropped_everywhere, what=f"leaf-set neighbours to drop {victim_name}")
    for i in range(N):
        if i == victim:
            continue
        route = cli_json(cluster, "route", sink, *via(cluster, i))
        path = [h["name"] for h in route["path"]]
        assert victim_name not in path
        assert path[-1] == sink
    # the dead peer's own id now lands on a live peer
    route = cli_json(cluster, "route", ids[victim_name], *via(cluster, 0))
    assert route["path"][-1]["name"] != victim_name


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


def test_bootstrap_by_host_name_and_a_stable_id_across_restarts(tmp_path: Path) -> None:
    port = free_port()
    key = tmp_path / "cluster.key"
    key.write_text(make_key_text() + "\n")

    def peer(name: str, host: str, *extra: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agiledart.cli",
                "--log-level",
                "warning",
                "peer",
                "--listen",
                f"{host}:{port}",
                "--name",
                name,
                "--state-dir",
                str(tmp_path / name),
                "--cluster-key-file",
                str(key),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def ring_of_b() -> dict[str, object] | None:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agiledart.cli",
                "ring",
                "--json",
                "--via",
                f"127.0.0.3:{port}",
                "--cluster-key-file",
                str(key),
                "--timeout",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            return None
        info: dict[str, object] = json.loads(proc.stdout)
        return info if "a" in {p["name"] for p in info["peers"]} else None  # type: ignore[attr-defined]

    a = peer("a", "127.0.0.1")
    b = peer("b", "127.0.0.3", "--bootstrap", f"localhost:{port}")  # a host *name*
    try:
        first = poll(ring_of_b, what="b to join through localhost")["node_id"]
        b.terminate()
        b.wait(timeout=30)
        b = peer("b", "127.0.0.3", "--bootstrap", f"localhost:{port}")
        again = poll(ring_of_b, what="b to rejoin after a restart")
        assert again["node_id"] == first
    finally:
        for proc in (a, b):
            proc.kill()
            proc.wait()
