"""A CLI or a peer with a key that differs from the cluster's: both sides say so."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.processes import free_port, poll

from agiledart.emulate import LocalCluster
from agiledart.overlay.keys import make_key_text

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

DIFFERS = (
    "the cluster key differs from this peer's: check --cluster-key-file / AGILEDART_CLUSTER_KEY"
)


def log_of(cluster: LocalCluster, i: int) -> str:
    assert cluster.workdir is not None
    return (cluster.workdir / f"{cluster.name(i)}.log").read_text(errors="replace")


def test_a_cli_with_another_key_is_told_and_so_is_the_peer(
    cluster_factory: Callable[[int], LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(1)
    wrong = tmp_path / "wrong.key"
    wrong.write_text(make_key_text() + "\n")
    via = "{}:{}".format(*cluster.address(0))

    def answered() -> subprocess.CompletedProcess[str] | None:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agiledart.cli",
                "ring",
                "--via",
                via,
                "--cluster-key-file",
                str(wrong),
                "--timeout",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return proc if "refused" not in proc.stderr else None  # None while it starts

    proc = poll(answered, what="the peer to answer the CLI")
    assert proc.returncode == 1
    assert DIFFERS in proc.stderr
    assert proc.stderr.startswith("Error: ")
    poll(lambda: DIFFERS in log_of(cluster, 0), what="the peer to log the differing key")
    assert "client 'cli'" in log_of(cluster, 0)


def test_a_peer_started_with_another_key_says_so_instead_of_retrying_silently(
    cluster_factory: Callable[[int], LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(1)
    wrong = tmp_path / "wrong.key"
    wrong.write_text(make_key_text() + "\n")
    log = tmp_path / "stranger.log"
    with log.open("wb") as out:
        stranger = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agiledart.cli",
                "--log-level",
                "warning",
                "peer",
                "--listen",
                f"127.0.0.60:{free_port()}",
                "--name",
                "stranger",
                "--state-dir",
                str(tmp_path / "stranger"),
                "--bootstrap",
                "{}:{}".format(*cluster.address(0)),
                "--cluster-key-file",
                str(wrong),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        said = poll(
            lambda: DIFFERS in log.read_text(errors="replace"),
            what="the peer with the wrong key to say so",
        )
        assert said
        line = next(ln for ln in log.read_text().splitlines() if DIFFERS in ln)
        assert "no bootstrap peer answered" in line
        assert "{}:{}".format(*cluster.address(0)) in line
        # the cluster's peer names the problem too (its datagrams, its handshake)
        poll(lambda: DIFFERS in log_of(cluster, 0), what="the cluster's peer to say so")
    finally:
        stranger.kill()
        stranger.wait()
