"""``agiledart emulate``: a local cluster of real peer processes on 127.0.0.x.

Until applications run end to end, the emulation starts N ``agiledart peer``
processes (each on its own loopback address, all on one port, a fresh cluster key),
waits until every peer knows every other, then keeps routing JOIN-style probes from
every peer toward the sink peer, showing the ring and the routes live. It ends after
``--duration`` seconds, or on Ctrl-C, with a summary, and leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from agiledart.errors import AgiledartError
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.errors import OverlayError
from agiledart.overlay.tcp import FrameClient

__all__ = ["LocalCluster", "add_parser"]

PORT = 4700


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "emulate",
        help="run a local cluster of peers and show it live",
        description="Start N peer processes on 127.0.0.x, show the ring and the routes "
        "JOIN messages take through it, and print a summary.",
    )
    p.add_argument("--peers", type=int, default=8, help="peer processes (default 8)")
    p.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="seconds to run once the ring has formed (default 10)",
    )
    p.add_argument("--app", help="application spec (runs once applications land)")
    p.add_argument("--links", help="link model JSON (delay/loss per pair)")
    p.add_argument("--trace-dir", type=Path, help="keep peer traces here")
    p.add_argument("--port", type=int, default=PORT, help=f"port of every peer (default {PORT})")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_emulate)


def site_name(i: int) -> str:
    """Peer names of an emulated site: the names the bundled apps pin to come first."""
    fixed = ("sensor-1", "sensor-2", "gateway-1", "gateway-2")
    return fixed[i] if i < len(fixed) else f"edge-{i - len(fixed) + 1}"


@dataclass
class LocalCluster:
    """N real peer processes on 127.0.0.2 .. 127.0.0.N+1, torn down on exit."""

    peers: int
    port: int = PORT
    workdir: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.peers <= 250:
            msg = "--peers must be between 1 and 250"
            raise AgiledartError(msg)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.key_material = secrets.token_hex(32)
        self.key = ClusterKey.from_material(self.key_material)

    def address(self, i: int) -> tuple[str, int]:
        return (f"127.0.0.{i + 2}", self.port)

    def name(self, i: int) -> str:
        return site_name(i)

    def __enter__(self) -> LocalCluster:
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="agiledart-emulate-")
            self.workdir = Path(self._tmp.name)
        key_file = self.workdir / "cluster.key"
        key_file.write_text(self.key_material)
        key_file.chmod(0o600)
        try:
            for i in range(self.peers):
                self.procs.append(self.start(i))
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self, i: int) -> subprocess.Popen[bytes]:
        assert self.workdir is not None
        host, port = self.address(i)
        cmd = [
            sys.executable,
            "-m",
            "agiledart.cli",
            "--log-level",
            "warning",
            "peer",
            "--listen",
            f"{host}:{port}",
            "--name",
            self.name(i),
            "--state-dir",
            str(self.workdir / self.name(i)),
            "--cluster-key-file",
            str(self.workdir / "cluster.key"),
            *self.extra_args,
        ]
        if i > 0:
            cmd += ["--bootstrap", "{}:{}".format(*self.address(0))]
        with (self.workdir / f"{self.name(i)}.log").open("ab") as log:
            return subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def kill(self, i: int) -> None:
        """``kill -9`` one peer."""
        self.procs[i].kill()
        self.procs[i].wait()

    async def request(self, i: int, rpc: str, body: dict[str, Any], timeout: float = 5.0) -> Any:
        host, port = self.address(i)
        client = await FrameClient.connect(
            host, port, key=self.key, name="emulate", timeout=timeout
        )
        async with client:
            return await client.request(rpc, body, timeout=timeout)

    async def ring(self, i: int) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = await self.request(i, "ring", {})
        except OverlayError:
            return None
        return info

    async def wait_formed(self, *, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Poll until every peer knows every other peer by name."""
        want = {self.name(i) for i in range(self.peers)}
        deadline = time.monotonic() + timeout
        while True:
            rings = await asyncio.gather(*(self.ring(i) for i in range(self.peers)))
            if all(
                r is not None and {p["name"] for p in r["peers"]} | {r["self"]} >= want
                for r in rings
            ):
                return [r for r in rings if r is not None]
            if time.monotonic() > deadline:
                dead = [self.name(i) for i, p in enumerate(self.procs) if p.poll() is not None]
                msg = f"the ring did not form within {timeout:.0f} s" + (
                    f" (exited: {', '.join(dead)})" if dead else ""
                )
                raise AgiledartError(msg)
            await asyncio.sleep(0.3)


def _cmd_emulate(args: argparse.Namespace) -> int:
    if args.links or args.trace_dir:
        print("note: --links and --trace-dir take effect once applications land", file=sys.stderr)
    if args.app:
        print(
            "note: applications run on the ring once they land; showing the ring and "
            "JOIN routes only",
            file=sys.stderr,
        )
    console = Console(stderr=args.json)
    with LocalCluster(args.peers, port=args.port) as cluster:
        summary = asyncio.run(_emulate(cluster, args.duration, console))
    if args.json:
        import json

        print(json.dumps(summary))
    else:
        console.print(
            f"[bold]summary[/]: {summary['peers']} peers, {summary['routes']} JOIN routes to "
            f"{summary['sink']}, {summary['delivered']} delivered, mean {summary['mean_hops']} "
            f"hops (max {summary['max_hops']}), mean path RTT {summary['mean_path_rtt_ms']} ms"
        )
    return 0


async def _emulate(cluster: LocalCluster, duration: float, console: Console) -> dict[str, Any]:
    with console.status(f"starting {cluster.peers} peers on 127.0.0.x:{cluster.port} ..."):
        await cluster.wait_formed()
    sink = cluster.name(cluster.peers - 1)
    hops: list[int] = []
    rtts: list[float] = []
    routes = delivered = 0
    last: dict[str, dict[str, Any]] = {}
    end = time.monotonic() + duration
    interrupted = asyncio.Event()  # Ctrl-C ends the run early, summary and all
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while time.monotonic() < end and not interrupted.is_set():
            results = await asyncio.gather(
                *(cluster.request(i, "route", {"to": sink}) for i in range(cluster.peers)),
                return_exceptions=True,
            )
            for i, res in enumerate(results):
                routes += 1
                if isinstance(res, dict):
                    delivered += 1
                    hops.append(res["hops"])
                    rtts.append(sum(h["rtt_ms"] or 0.0 for h in res["path"]))
                    last[cluster.name(i)] = res
            rings = await asyncio.gather(*(cluster.ring(i) for i in range(cluster.peers)))
            live.update(_view(cluster, rings, last, sink, end - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await interrupted.wait()
    return {
        "peers": cluster.peers,
        "sink": sink,
        "routes": routes,
        "delivered": delivered,
        "mean_hops": round(statistics.mean(hops), 2) if hops else None,
        "max_hops": max(hops) if hops else None,
        "mean_path_rtt_ms": round(statistics.mean(rtts), 3) if rtts else None,
    }


def _view(
    cluster: LocalCluster,
    rings: list[dict[str, Any] | None],
    last: dict[str, dict[str, Any]],
    sink: str,
    left: float,
) -> Group:
    peers = Table(title=f"ring ({max(0.0, left):.0f} s left)")
    for col in ("peer", "address", "node id", "knows", "leaf set"):
        peers.add_column(col)
    for i, r in enumerate(rings):
        if r is None:
            peers.add_row(cluster.name(i), "{}:{}".format(*cluster.address(i)), "-", "down", "")
            continue
        peers.add_row(
            r["self"],
            r["address"],
            r["node_id"][:8],
            str(len(r["peers"])),
            ", ".join(r["leaf_set"][:4]) + (" ..." if len(r["leaf_set"]) > 4 else ""),
        )
    paths = Table(title=f"JOIN routes toward {sink}")
    paths.add_column("from")
    paths.add_column("hops")
    paths.add_column("path")
    for name, res in sorted(last.items()):
        paths.add_row(name, str(res["hops"]), " -> ".join(h["name"] for h in res["path"]))
    return Group(peers, paths)


if __name__ == "__main__":  # pragma: no cover
    os.execvp(sys.executable, [sys.executable, "-m", "agiledart.cli", "emulate", *sys.argv[1:]])
