"""Memory footprint of one peer: idle in a small ring, then hosting 10 operators under load.

The figure is the proportional set size (PSS: private pages plus a fair share of the
shared ones, from ``/proc/PID/smaps_rollup`` via psutil) of the peer's whole process
tree, its execution workers included, so what a Raspberry Pi gives one peer. Real
``agiledart peer`` processes (LocalCluster on loopback) with the default options: as
many workers as cores, the ``edgewise`` pool, ``--offload-us 10``.

1. **idle**: three peers form a ring; once every peer knows the others and the peers
   have settled, the PSS of ``sensor-1``'s tree (no app: no workers yet; they start
   with the first app).
2. **loaded**: an app of 10 operators (filters, maps, key_by, a running aggregate,
   windows, dedupe, top_k; below) deployed with the peer-facing ``deploy``/``start``
   RPCs so that all ten run on ``sensor-1``, fed by a ``counter`` source on
   ``sensor-2`` at ``--rate`` records/s, its sink on ``gateway-1``. PSS of
   ``sensor-1``'s tree sampled every half second for ``--seconds`` after a warm-up;
   ``loaded_pss_mb`` is the median, ``loaded_peak_pss_mb`` the largest.

PSS divides the pages a process shares (libpython, shared libraries) among all that
map them; here that includes the two other peers, so the report also gives the tree's
RSS (shared pages counted in full, per process: an upper bound) and USS (private pages
only: a lower bound). On a device running one peer, its footprint lies between the two.

Anchors: targets idle <= 80 MB and loaded <= 120 MB (this project's, for a 1 GB
Raspberry Pi running a peer beside other work); the AgileDART paper's peers averaged
98 MB. As every benchmark: one JSON object on the last line with ``--json``, progress
on stderr, runnable on 2 cores.

    python scripts/bench_footprint.py [--json] [--quick] [--seconds S] [--rate R]
                                      [--peer-args ARGS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shlex
import statistics
import sys
import time
from typing import Any

import psutil
from benchlib import free_port

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.runtime.instance import Deployment

IDLE_TARGET_MB, LOADED_TARGET_MB, PAPER_MB = 80, 120, 98
MEASURED, SOURCE, SINK = 0, 1, 2  # sensor-1, sensor-2, gateway-1

APP = {
    "name": "footprint",
    "sources": [
        {
            "id": "counter",
            "peer": "sensor-2",
            "connector": "generator",
            "params": {"dataset": "counter", "rate": 0, "count": 0, "seed": 1, "keys": 64},
        }
    ],
    "operators": [
        {"id": "sampled", "op": "filter", "fn": "builtin:skip_every",
         "params": {"field": "seq", "n": 10}, "inputs": ["counter"]},
        {"id": "halved", "op": "map", "fn": "builtin:scale",
         "params": {"field": "seq", "factor": 0.5}, "inputs": ["sampled"]},
        {"id": "copied", "op": "map", "fn": "builtin:identity", "inputs": ["halved"]},
        {"id": "keyed", "op": "key_by", "params": {"key": "key"}, "inputs": ["copied"]},
        {"id": "running", "op": "aggregate",
         "params": {"key": "key", "aggregate": "sum", "field": "seq"}, "inputs": ["keyed"]},
        {"id": "per-second", "op": "window",
         "params": {"size_ms": 1000, "key": "key", "aggregate": "count"}, "inputs": ["keyed"]},
        {"id": "sliding", "op": "window",
         "params": {"size_ms": 5000, "slide_ms": 1000, "key": "key", "aggregate": "max",
                    "field": "seq"}, "inputs": ["keyed"]},
        {"id": "fresh", "op": "dedupe", "params": {"key": "key", "ttl_ms": 500},
         "inputs": ["running"]},
        {"id": "top", "op": "top_k", "params": {"k": 5, "by": "value", "window_ms": 1000},
         "inputs": ["per-second"]},
        {"id": "merged", "op": "union", "inputs": ["fresh", "top", "sliding"]},
    ],
    "sinks": [{"id": "out", "peer": "gateway-1", "connector": "discard", "inputs": ["merged"]}],
}  # fmt: skip


def log(msg: str) -> None:
    print(f"[bench_footprint] {msg}", file=sys.stderr, flush=True)


def tree_pss(pid: int) -> dict[str, float]:
    """PSS in MB of ``pid`` and of its descendants, and how many there are."""
    root = psutil.Process(pid)
    info = root.memory_full_info()
    own, rss, uss = info.pss, info.rss, info.uss
    children = 0
    count = 0
    for child in root.children(recursive=True):
        try:
            info = child.memory_full_info()
        except psutil.Error:
            continue
        children += info.pss
        rss += info.rss
        uss += info.uss
        count += 1
    return {
        "peer_mb": own / 2**20,
        "workers_mb": children / 2**20,
        "workers": count,
        "rss_mb": rss / 2**20,
        "uss_mb": uss / 2**20,
    }


def total(sample: dict[str, float]) -> float:
    return sample["peer_mb"] + sample["workers_mb"]


async def measure(
    cluster: LocalCluster, settle: float, seconds: float, rate: int
) -> dict[str, Any]:
    await cluster.wait_formed()
    await asyncio.sleep(settle)
    pid = cluster.procs[MEASURED].pid
    idle = tree_pss(pid)
    log(f"idle: {total(idle):.1f} MB (peer {idle['peer_mb']:.1f}, {idle['workers']} workers)")

    count = int(rate * (settle + seconds + 30))
    raw = json.loads(json.dumps(APP))
    raw["sources"][0]["params"] |= {"rate": rate, "count": count}
    spec = parse_spec(raw)
    names = {i: cluster.name(i) for i in range(cluster.peers)}
    hosts = {o.id: (names[MEASURED],) for o in spec.operators}
    hosts |= {"counter": (names[SOURCE],), "out": (names[SINK],)}
    deployment = Deployment(
        app_id="footprint",
        spec=spec,
        hosts=hosts,
        addresses={names[i]: cluster.address(i) for i in names},
        scheduler=cluster.address(SINK),
    )
    for i in (SINK, MEASURED, SOURCE):
        await cluster.request(i, "deploy", deployment.to_wire(), timeout=60)
    await cluster.request(SOURCE, "start", {"app_id": "footprint"})
    started = time.monotonic()
    await asyncio.sleep(settle)  # warm-up: operators measured, moved, workers busy
    samples = []
    while time.monotonic() - started < settle + seconds:
        samples.append(tree_pss(pid))
        await asyncio.sleep(0.5)
    stats = await cluster.request(MEASURED, "app_stats", {"app_id": "footprint"})
    source = await cluster.request(SOURCE, "app_stats", {"app_id": "footprint"})
    ring = await cluster.request(MEASURED, "ring", {})
    emitted = source["sources"]["counter"]["emitted"]
    fed = sum(o.get("records_in", 0) for o in stats["operators"].values())
    if emitted == 0 or fed == 0:
        msg = f"the app did not run: {emitted} records emitted, {fed} fed to operators"
        raise RuntimeError(msg)
    loaded = [total(s) for s in samples]
    median = statistics.median(loaded)
    log(
        f"loaded: median {median:.1f} MB, peak {max(loaded):.1f} MB over {len(samples)} samples"
        f" ({samples[-1]['workers']} workers, {emitted / (time.monotonic() - started):,.0f}"
        " records/s emitted)"
    )
    execution = ring["execution"]
    return {
        "idle_pss_mb": round(total(idle), 1),
        "idle_target_mb": IDLE_TARGET_MB,
        "loaded_pss_mb": round(median, 1),
        "loaded_peak_pss_mb": round(max(loaded), 1),
        "loaded_target_mb": LOADED_TARGET_MB,
        "paper_avg_mb": PAPER_MB,
        "idle_rss_mb": round(idle["rss_mb"], 1),
        "idle_uss_mb": round(idle["uss_mb"], 1),
        "loaded_rss_mb": round(statistics.median(s["rss_mb"] for s in samples), 1),
        "loaded_uss_mb": round(statistics.median(s["uss_mb"] for s in samples), 1),
        "idle_peer_mb": round(idle["peer_mb"], 1),
        "loaded_peer_mb": round(statistics.median(s["peer_mb"] for s in samples), 1),
        "loaded_workers_mb": round(statistics.median(s["workers_mb"] for s in samples), 1),
        "workers": samples[-1]["workers"],
        "operators": len(spec.operators),
        "operators_in_workers": len(execution.get("in_workers", [])),
        "rate": rate,
        "records_emitted": emitted,
        "cores": psutil.cpu_count(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--quick", action="store_true", help="short settle and sampling (tests)")
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling under load")
    parser.add_argument("--rate", type=int, default=20_000, help="source records/s")
    parser.add_argument(
        "--peer-args",
        default="",
        metavar="ARGS",
        help="extra `agiledart peer` options, e.g. '--metrics-port 9100' or '--workers 1'",
    )
    args = parser.parse_args(argv)
    settle, seconds = (1.0, 2.0) if args.quick else (5.0, args.seconds)
    peer_args = shlex.split(args.peer_args)
    with LocalCluster(3, port=free_port(), extra_args=peer_args) as cluster:
        report = asyncio.run(measure(cluster, settle, seconds, args.rate))
    report["peer_args"] = peer_args
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
