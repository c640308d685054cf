"""Helpers for tests that start real peer processes on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from agiledart.emulation import LocalCluster
from agiledart.errors import AgiledartError


def free_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.2 .. (checked on 127.0.0.1)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.bind(("127.0.0.1", port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


def cli(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert cluster.workdir is not None
    cmd = [
        sys.executable,
        "-m",
        "agiledart.cli",
        "--log-level",
        "warning",
        *args,
        "--cluster-key-file",
        str(cluster.workdir / "cluster.key"),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env={**os.environ, "AGILEDART_PEER": ""}
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}: {proc.stderr}")
    return proc


def cli_json(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cli(cluster, *args, "--json").stdout)


def try_cli_json(cluster: LocalCluster, *args: str) -> Any:
    """Like :func:`cli_json`, but None when the command fails (a peer still starting)."""
    proc = cli(cluster, *args, "--json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def ask(cluster: LocalCluster, i: int, rpc: str, body: dict[str, Any] | None = None) -> Any:
    """What ``agiledart RPC ... --via PEER-i --json`` prints (the CLI prints the peer's
    answer as it is), asked without a CLI process: for a test's polls, where a CLI call
    each time costs a Python start-up (about half a second of a CPU) and delays the
    next look. The commands under test still go through :func:`cli`."""
    return asyncio.run(cluster.request(i, rpc, body or {}, timeout=10.0))


def try_ask(cluster: LocalCluster, i: int, rpc: str, body: dict[str, Any] | None = None) -> Any:
    """Like :func:`ask`, but None when the peer does not answer (or answers an error)."""
    try:
        return ask(cluster, i, rpc, body)
    except AgiledartError:
        return None


def poll(condition: Callable[[], Any], *, what: str, timeout: float = 60.0) -> Any:
    """Wait for ``condition()`` to be truthy; fail naming ``what`` (never a timed assert:
    the bound only keeps a broken build from hanging)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(0.3)


@contextlib.contextmanager
def clusters(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Make clusters (of ``kind``, a :class:`LocalCluster` by default) that are all torn
    down, every process reaped, at the end."""
    made: list[LocalCluster] = []

    def make(
        n: int, extra_args: Sequence[str] = (), *, kind: type[LocalCluster] = LocalCluster
    ) -> LocalCluster:
        cluster = kind(
            n, port=free_port(), workdir=tmp_path / f"c{len(made)}", extra_args=list(extra_args)
        )
        cluster.workdir.mkdir(parents=True)  # type: ignore[union-attr]
        made.append(cluster)
        return cluster.__enter__()

    try:
        yield make
    finally:  # a failed test too: its peers must not outlive it (and fail the next one)
        for cluster in made:
            cluster.__exit__()
            for proc in cluster.procs:
                assert proc.poll() is not None


@contextlib.contextmanager
def formed_cluster(
    root: Path, peers: int, extra_args: Sequence[str] = ()
) -> Iterator[LocalCluster]:
    """One cluster of ``peers`` processes (named as :func:`agiledart.cli.emulate.site_name`
    does, started with ``extra_args``), yielded once its ring has formed; torn down after."""
    with clusters(root) as make:
        cluster = make(peers, extra_args)
        asyncio.run(cluster.wait_formed())
        yield cluster
