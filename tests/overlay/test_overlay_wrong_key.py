"""A CLI or a peer with a key that differs from the cluster's: both sides say so."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.processes import free_port, poll

from agiledart.emulation import LocalCluster
from agiledart.overlay.keys import make_key_text, parse_keys

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


def test_keygen_makes_full_strength_keys_and_walks_a_rotation(tmp_path: Path) -> None:
    key = tmp_path / "cluster.key"

    def keygen(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agiledart.cli", "keygen", "--out", str(key), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert keygen().returncode == 0
    assert key.stat().st_mode & 0o777 == 0o600
    first = parse_keys(key.read_text())
    assert len(first) == 1
    assert "agiledart-key-v1:" in key.read_text()
    assert "--force" in keygen().stderr  # never overwritten by accident
    for step, expect in [("add", 2), ("promote", 2), ("retire", 1)]:
        proc = keygen("--rotate", step)
        assert proc.returncode == 0, proc.stderr
        assert len(parse_keys(key.read_text())) == expect
    assert parse_keys(key.read_text()) != first  # the new key seals, the old one is gone
    key.write_text("my-long-and-memorable-cluster-pass-phrase\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agiledart.cli",
            "ring",
            "--via",
            "127.0.0.1:1",
            "--cluster-key-file",
            str(key),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "agiledart keygen" in proc.stderr
