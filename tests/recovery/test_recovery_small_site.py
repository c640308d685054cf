"""Checkpoints on sites with fewer peers than the default erasure code wants.

The default code stores m + k = 5 fragments of every snapshot on five leaf-set peers
besides the operator's own. A five-peer site has four: the checkpoints use a lower m
(keeping k, the number of holders that may die), the submitter is warned, and the app
checkpoints. A peer alone has no holder at all: every epoch fails, and ``status`` says
so with the reason, not only that peer's log.

Real peer processes on loopback; the counting probe with an endless source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.processes import ask, cli, formed_cluster, poll

from agiledart.apps.probes import counting
from agiledart.emulation import LocalCluster
from agiledart.runtime.recovery import fit_code

pytestmark = [pytest.mark.processes]


def endless(host: str, *, peers: int) -> dict[str, Any]:
    """The counting probe, endless, checkpointed with the default code, on ``host``."""
    spec = counting(host, checkpoint={"mode": "auto", "interval_ms": 500}, rate=500)
    del spec["sources"][0]["params"]["count"]  # no end: auto mode checkpoints it
    spec["sources"][0]["peer"] = "sensor-1"
    spec["operators"][1]["peer"] = host
    spec["sinks"][0]["peer"] = "sensor-1" if peers == 1 else "gateway-1"
    return spec


def via(cluster: LocalCluster) -> str:
    host, port = cluster.address(0)
    return f"{host}:{port}"


def submit(cluster: LocalCluster, spec: dict[str, Any]) -> tuple[str, str]:
    """The app id and what the CLI said on stderr."""
    assert cluster.workdir is not None
    path = cluster.workdir / "endless.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = cli(cluster, "submit", str(path), "--via", via(cluster), "--json")
    return str(yaml.safe_load(proc.stdout)["app_id"]), proc.stderr


def status(cluster: LocalCluster, app_id: str) -> dict[str, Any]:
    return dict(ask(cluster, 0, "status", {"app_id": app_id}))


@pytest.mark.parametrize(
    ("m", "k", "holders", "fitted"),
    [
        (3, 2, 5, (3, 2)),
        (3, 2, 9, (3, 2)),
        (3, 2, 4, (2, 2)),
        (3, 2, 3, (1, 2)),
        (3, 2, 2, (1, 1)),
        (3, 2, 1, (1, 0)),
        (1, 3, 2, (1, 1)),
        (4, 0, 2, (2, 0)),
    ],
)
def test_a_code_wider_than_the_holders_keeps_its_tolerance_and_lowers_m(
    m: int, k: int, holders: int, fitted: tuple[int, int]
) -> None:
    assert fit_code(m, k, holders) == fitted
    assert sum(fitted) <= holders


def test_no_holder_means_no_code() -> None:
    assert fit_code(3, 2, 0) is None


def test_a_five_peer_site_checkpoints_with_the_default_code(tmp_path: Path) -> None:
    with formed_cluster(tmp_path, 5, ["--workers", "0"]) as site:
        app_id, said = submit(site, endless("edge-1", peers=5))
        assert "m=2, k=2" in said, said
        s = poll(
            lambda: (st := status(site, app_id))["checkpoints"] >= 2 and st,
            what="two checkpoints to commit",
        )
        assert s["state"] == "running"
        assert s["checkpoint_failures"] == 0, s["checkpoint_error"]
        text = cli(site, "status", app_id, "--via", via(site)).stdout
        assert "checkpoints: " in text
        assert "committed" in text


def test_a_peer_alone_says_in_status_why_its_checkpoints_fail(tmp_path: Path) -> None:
    with formed_cluster(tmp_path, 1, ["--workers", "0"]) as alone:
        app_id, said = submit(alone, endless("sensor-1", peers=1))
        assert "no other peer" in said, said
        s = poll(
            lambda: (st := status(alone, app_id))["checkpoint_failures"] >= 1 and st,
            what="a failed checkpoint in status",
        )
        assert s["checkpoints"] == 0
        assert "no leaf-set peer" in s["checkpoint_error"]["error"]
        assert s["checkpoint_error"]["instance"].endswith("@sensor-1")
        text = cli(alone, "status", app_id, "--via", via(alone)).stdout
        assert "failed: no leaf-set peer" in text
