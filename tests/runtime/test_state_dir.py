"""One live peer per state directory, and default directories that do not collide."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.processes import free_port, poll

from agiledart.emulation import LocalCluster
from agiledart.overlay.errors import ConfigError
from agiledart.statedir import StateDirLock, default_state_dir


def test_the_default_state_dir_is_per_name_unless_the_old_layout_is_there(
    tmp_path: Path,
) -> None:
    base = tmp_path / "state"
    assert default_state_dir("gw-1", base) == base / "gw-1"
    assert default_state_dir("pi:4000", base) == base / "pi_4000"
    assert default_state_dir("../x", base) == base / "_x"
    base.mkdir()
    (base / "node_id").write_text("0" * 40)  # a deployment from before: keep its id
    assert default_state_dir("gw-1", base) == base


def test_a_held_state_dir_is_refused_with_the_holder_named(tmp_path: Path) -> None:
    held = StateDirLock.acquire(tmp_path, name="first")
    with pytest.raises(ConfigError, match=rf"in use by peer 'first' \(pid {os.getpid()}\)"):
        StateDirLock.acquire(tmp_path, name="second")
    held.release()
    StateDirLock.acquire(tmp_path, name="second").release()


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[LocalCluster, list[subprocess.Popen[bytes]]]]:
    cluster = LocalCluster(2, port=free_port(), workdir=tmp_path)
    (tmp_path / "cluster.key").write_text(cluster.key_material)
    procs: list[subprocess.Popen[bytes]] = []
    yield cluster, procs
    for proc in procs:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def peer(
    cluster: LocalCluster, i: int, name: str, *args: str, cwd: Path
) -> subprocess.Popen[bytes]:
    host, port = cluster.address(i)
    cmd = [sys.executable, "-m", "agiledart.cli", "--log-level", "warning", "peer"]
    cmd += ["--listen", f"{host}:{port}", "--name", name, "--workers", "0", *args]
    cmd += ["--cluster-key-file", str(cluster.workdir / "cluster.key")]  # type: ignore[operator]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.processes
def test_a_second_peer_on_a_live_peers_state_dir_is_refused(
    two: tuple[LocalCluster, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    cluster, procs = two
    state = ["--state-dir", str(tmp_path / "shared")]
    procs.append(peer(cluster, 0, "x-1", *state, cwd=tmp_path))
    poll(lambda: asyncio.run(cluster.ring(0)), what="the first peer")
    second = peer(cluster, 1, "x-2", *state, cwd=tmp_path)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 1
    assert f"in use by peer 'x-1' (pid {procs[0].pid})" in out.decode()
    procs[0].kill()  # however a peer ends, its hold ends with it
    procs[0].wait()
    procs.append(peer(cluster, 1, "x-2", *state, cwd=tmp_path))
    assert poll(lambda: asyncio.run(cluster.ring(1)), what="the second peer")["self"] == "x-2"


@pytest.mark.processes
def test_peers_started_in_one_directory_get_state_dirs_and_ids_of_their_own(
    two: tuple[LocalCluster, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    cluster, procs = two
    procs.append(peer(cluster, 0, "x-1", cwd=tmp_path))
    procs.append(
        peer(cluster, 1, "x-2", "--bootstrap", "{}:{}".format(*cluster.address(0)), cwd=tmp_path)
    )
    rings = [poll(lambda i=i: asyncio.run(cluster.ring(i)), what=f"peer {i}") for i in (0, 1)]
    assert rings[0]["node_id"] != rings[1]["node_id"]
    for r in rings:
        assert (tmp_path / "state" / r["self"] / "node_id").read_text().strip() == r["node_id"]
