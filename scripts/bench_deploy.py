"""Deployment under many concurrent submits: zone schedulers against one FCFS master.

Two 16-peer local clusters (real processes on loopback, one after the other in the
same run): the decentralized one (``--scheduling zones``, four zones of four peers)
and the centralized baseline (``--scheduling central --master sensor-1``: one queue,
one app at a time, as Storm's Nimbus and EdgeWise do). For each count N (10, 100,
500, 1,000) N tiny apps (a 20-record generator -> a map -> discard, source and sink on
two different peers) are submitted through the 16 peers in turn (after a warm-up of
16 apps, one source on each peer, which is not measured): with ``--rate R`` they
arrive R per second (open loop: a submit does not wait for the one before), with
``--rate 0`` all at once. Every submit's answer says, measured by the peer that
scheduled it:

* ``queue_ms``: from the submit's arrival to its scheduler starting on it: the
  master's FIFO wait; for zones, discovery (the gossip walk) and the hand-over;
* ``deploy_ms``: from arrival to the app running (validated, recorded, JOIN-routed,
  placed, deployed and started): the deployment time of paper Fig. 8b.

Reported: p50/p99 of both per N and mode, and ``growth_ratio_1000_vs_10`` = p99 deploy
time at N = 1,000 over that at N = 10. Anchor (paper Fig. 8): the centralized
baseline's times grow linearly with N; AgileDART's stay flat.

Every peer adds ``--rtt-ms`` (default 20 ms, a WiFi or metro edge network) to each
control request it sends (``--control-rtt-ms``): on loopback a round trip takes a tenth
of a millisecond, and a master deploying one app at a time only queues when its
deployments wait on the network as they would on real devices (with ``--rtt-ms 0`` a
quiet 2-core machine deploys a tiny app in ~30 ms either way and neither grows at 10
submits/s).

    python scripts/bench_deploy.py [--counts 10,100,500,1000] [--rate 10] [--rtt-ms 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import free_port

from agiledart.emulation import LocalCluster
from agiledart.errors import AgiledartError

PEERS = 16
ZONES = 4


class _Cluster(LocalCluster):
    """The local cluster, peer ``i`` in zone ``z<i mod 4>`` (zones mode)."""

    zoned = False

    def start(self, i: int) -> subprocess.Popen[bytes]:
        base = self.extra_args
        if self.zoned:
            self.extra_args = [*base, "--zone", f"z{i % ZONES}"]
        try:
            return super().start(i)
        finally:
            self.extra_args = base


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, int(q * len(xs) + 0.5) - 1))], 1)


def tiny_app(i: int, names: list[str]) -> dict[str, Any]:
    src, dst = names[i % PEERS], names[(i + 5) % PEERS]
    return {
        "name": f"tiny{i}",
        "checkpoint": {"mode": "restart"},
        "sources": [
            {
                "id": "gen",
                "peer": src,
                "connector": "generator",
                "params": {"dataset": "counter", "rate": 2000, "count": 20, "keys": 4},
            }
        ],
        "operators": [
            {
                "id": "double",
                "op": "map",
                "fn": "builtin:scale",
                "params": {"field": "seq", "factor": 2},
                "inputs": ["gen"],
            }
        ],
        "sinks": [{"id": "out", "peer": dst, "connector": "discard", "inputs": ["double"]}],
    }


async def submit_many(cluster: LocalCluster, n: int, rate: float, base: int) -> dict[str, Any]:
    names = [cluster.name(i) for i in range(PEERS)]
    queue: list[float] = []
    deploy: list[float] = []
    errors: list[str] = []

    async def one(i: int) -> None:
        if rate > 0:
            await asyncio.sleep(i / rate)
        body = {"spec": tiny_app(base + i, names), "set": []}
        t = time.monotonic()
        try:
            res = await cluster.request(i % PEERS, "submit", body, timeout=900.0)
        except AgiledartError as exc:
            errors.append(str(exc))
            return
        client_ms = (time.monotonic() - t) * 1000
        q = float(res.get("queue_ms", 0.0))
        queue.append(q)
        deploy.append(q + float(res.get("deploy_ms", client_ms)))

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    return {
        "apps": n,
        "deployed": len(deploy),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "queue_p50_ms": quantile(queue, 0.5),
        "queue_p99_ms": quantile(queue, 0.99),
        "deploy_p50_ms": quantile(deploy, 0.5),
        "deploy_p99_ms": quantile(deploy, 0.99),
        "wall_s": round(time.monotonic() - t0, 2),
    }


async def settle(cluster: LocalCluster, timeout: float = 120.0) -> None:
    """Wait until no app is deploying or running any more (tiny apps end quickly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rings = await asyncio.gather(*(cluster.ring(i) for i in range(PEERS)))
        if all(r is not None and not r["apps"] for r in rings):
            return
        await asyncio.sleep(1.0)
    log("warning: apps still deployed after the settle timeout")


async def run_mode(
    mode: str, counts: list[int], rate: float, rtt_ms: float, workdir: Path
) -> dict[str, Any]:
    extra = ["--workers", "0", "--control-rtt-ms", f"{rtt_ms:g}"]
    if mode == "central":
        extra += ["--scheduling", "central", "--master", "sensor-1"]
    else:
        extra += ["--scheduling", "zones"]
    cluster = _Cluster(PEERS, port=free_port(), workdir=workdir, extra_args=extra)
    cluster.zoned = mode == "zones"
    out: dict[str, Any] = {}
    with cluster:
        await cluster.wait_formed(timeout=120.0)
        await asyncio.sleep(3.0)  # a few gossip rounds: peers learn each other's zones
        # warm-up, not measured: every peer runs a source once (loads the datasets)
        warm = await submit_many(cluster, PEERS, rate, 0)
        log(f"{mode} warm-up: {json.dumps(warm)}")
        await settle(cluster)
        base = PEERS
        for n in counts:
            res = await submit_many(cluster, n, rate, base)
            base += n
            log(f"{mode} N={n}: {json.dumps(res)}")
            out[str(n)] = res
            await settle(cluster)
        if mode == "zones":
            rings = await asyncio.gather(*(cluster.ring(i) for i in range(PEERS)))
            out["schedulers"] = sorted(
                r["self"] for r in rings if r is not None and r["scheduling"].get("scheduler")
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="10,100,500,1000")
    parser.add_argument(
        "--rate", type=float, default=10.0, help="submits per second (0: all at once)"
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=20.0,
        help="round-trip time the peers add to every control request (--control-rtt-ms: "
        "an edge network's, which loopback lacks; 0: loopback's own)",
    )
    parser.add_argument("--modes", default="zones,central")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    result: dict[str, Any] = {
        "peers": PEERS,
        "rate_per_s": args.rate,
        "control_rtt_ms": args.rtt_ms,
        "counts": counts,
    }
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        for mode in args.modes.split(","):
            workdir = Path(tmp) / mode
            workdir.mkdir()
            runs = asyncio.run(run_mode(mode, counts, args.rate, args.rtt_ms, workdir))
            label = "decentralized" if mode == "zones" else "centralized"
            result[label] = runs
            p99 = {str(n): runs[str(n)]["deploy_p99_ms"] for n in counts}
            result[f"p99_deploy_ms_{label}"] = p99
            result[f"p99_queue_ms_{label}"] = {str(n): runs[str(n)]["queue_p99_ms"] for n in counts}
            first, last = p99[str(counts[0])], p99[str(counts[-1])]
            if first and last:
                result[f"growth_ratio_{counts[-1]}_vs_{counts[0]}_{label}"] = round(last / first, 2)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
