"""Placement strategies side by side on one emulated edge + cloud site (issue 8, item 3).

Real ``agiledart peer`` processes on loopback with the engine's link model
(``peer --links``), so every batch between peers travels the emulated links hop by
hop (``slot_ms`` per hop, :mod:`agiledart.runtime.relay`):

* edge: ``sensor-1``/``edge-1`` behind ``gateway-1``, ``sensor-2``/``edge-2`` behind
  ``gateway-2``, the two gateways one hop apart (a metro link), one worker each;
* WAN: each gateway reaches ``cloud-1`` over the relay peers ``wan-1`` and ``wan-2``
  (3 hops of 40 ms from a gateway, 4 from a sensor: the distant cloud; a LAN hop is
  one slot too: the model has one slot length, so distance is counted in hops);
* cloud: ``cloud-1`` in zone ``cloud`` with 4 workers (the high-capacity host the
  strategies see; all processes share this machine's cores, so its extra speed is
  only what the placement model believes, not measured compute).

The same bundled apps (``etl``: a pipeline from sensor-1 to gateway-1, an edge sink;
``urban-sensing``: two sensors' readings merged into windowed aggregates, averages to
gateway-1 (an edge sink) and peaks moved to ``cloud-1`` (an archive): the paper's
mixed edge and cloud sinks) are submitted once per strategy (``--set placement=...``),
each run on a fresh site (a run that has not finished after 150 s is stopped and
reported ``stalled``). End-to-end latency comes from the sinks' sampled tuples (5% of
records, source to sink wall time) in the peers' traces: p50 and p99 pooled over the
apps of a strategy, and per app. ``rtr_vs_cloud_only_p50`` is RTR's p50 over
cloud-only's (anchor: RTR up to 50% lower response time than cloud-only,
placement-rtr.txt §4). Every run's sink record count is checked against the
plain-Python reference.

    python scripts/bench_placement.py --json
    python scripts/bench_placement.py --quick --json      # etl only, fewer records
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import cpu_steal, free_port, steal_pct

from agiledart import apps
from agiledart.emulation import LocalCluster
from agiledart.local.reference import reference_outputs
from agiledart.runtime.metrics import quantile
from agiledart.traces.writer import trace_files

STRATEGIES = ("join-routing", "rtr", "rtr-rp", "cloud-only", "lb")
SLOT_MS = 40.0
EDGE = ("sensor-1", "sensor-2", "gateway-1", "gateway-2", "edge-1", "edge-2")
WAN = ("wan-1", "wan-2")
CLOUD = ("cloud-1",)
NAMES = (*EDGE, *WAN, *CLOUD)
LINKS = (
    ("sensor-1", "gateway-1"),
    ("edge-1", "gateway-1"),
    ("sensor-2", "gateway-2"),
    ("edge-2", "gateway-2"),
    ("gateway-1", "gateway-2"),
    ("gateway-1", "wan-1"),
    ("gateway-2", "wan-1"),
    ("wan-1", "wan-2"),
    ("wan-2", "cloud-1"),
)
RUN_LIMIT_S = 150.0
ANCHOR = "RTR up to 50% lower response time than cloud-only (placement-rtr.txt §4)"


def link_file(path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "format": "agiledart-bandit-graph",
                "version": 1,
                "name": "edge-cloud",
                "slot_ms": SLOT_MS,
                "undirected": True,
                "source": "sensor-1",
                "sink": "cloud-1",
                "nodes": list(NAMES),
                "links": [{"from": a, "to": b, "theta": 1.0} for a, b in LINKS],
            }
        )
    )


@dataclass
class Site(LocalCluster):
    """Peers named :data:`NAMES`; per-peer extra arguments (zone, workers)."""

    per_peer: dict[str, list[str]] = field(default_factory=dict)

    def name(self, i: int) -> str:
        return NAMES[i]

    def start(self, i: int) -> subprocess.Popen[bytes]:
        common = self.extra_args
        self.extra_args = [*common, *self.per_peer.get(NAMES[i], [])]
        try:
            return super().start(i)
        finally:
            self.extra_args = common


def cli(site: Site, *args: str, timeout: float = 300.0) -> Any:
    assert site.workdir is not None
    cmd = [sys.executable, "-m", "agiledart.cli", "--log-level", "warning", *args, "--json"]
    cmd += ["--cluster-key-file", str(site.workdir / "cluster.key")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        msg = f"{' '.join(args[:2])} failed: {proc.stderr.strip()[-500:]}"
        raise RuntimeError(msg)
    return json.loads(proc.stdout)


async def wait_idle(site: Site, timeout: float = 60.0) -> None:
    """Until no peer runs an app instance (the previous run is torn down)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rings = await asyncio.gather(*(site.ring(i) for i in range(site.peers)))
        if all(r is not None and not r["apps"] for r in rings):
            return
        await asyncio.sleep(0.3)
    msg = "the site did not become idle"
    raise RuntimeError(msg)


def overrides_for(name: str, quick: bool) -> list[str]:
    if name == "etl":
        return ["params.count=4000" if quick else "params.count=10000", "params.rate=1000"]
    out = ["params.count=2000" if quick else "params.count=5000", "params.rate=500"]
    if name == "urban-sensing":  # its peaks go to an archive in the cloud: mixed sinks
        out.append("sinks.peaks-out.peer=cloud-1")
    return out


def run_one(site: Site, app: str, strategy: str, quick: bool) -> dict[str, Any]:
    overrides = [*overrides_for(app, quick), f"placement={strategy}"]
    spec = apps.load(app, overrides=overrides)
    expected = {k: len(v) for k, v in reference_outputs(spec).items()}
    asyncio.run(wait_idle(site))
    args = [a for o in overrides for a in ("--set", o)]
    via = ["--via", "{}:{}".format(*site.address(NAMES.index("edge-2")))]
    started = time.monotonic()
    try:
        app_id = cli(site, "submit", app, *args, *via)["app_id"]
    except RuntimeError as exc:  # the strategy cannot place it (reported, not fatal)
        return {"app": app, "strategy": strategy, "app_id": None, "state": "refused"} | {
            "seconds": 0.0,
            "placement": None,
            "paths": None,
            "exact_counts": False,
            "error": str(exc)[-300:],
        }
    while True:  # a run that stalls is stopped and reported as such, not waited on
        status = cli(site, "status", app_id, *via)
        if status["state"] not in ("deploying", "running"):
            break
        if time.monotonic() - started > RUN_LIMIT_S:
            status = {**cli(site, "status", app_id, *via), "state": "stalled"}
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                cli(site, "stop", app_id, *via, timeout=30.0)
            break
        time.sleep(0.5)
    got: dict[str, int] = {}
    for peer in status.get("peers", {}).values():
        for sink, stats in peer.get("sinks", {}).items():
            got[sink] = int(stats.get("records", 0))
    return {
        "app": app,
        "strategy": strategy,
        "app_id": app_id,
        "state": status["state"],
        "seconds": round(time.monotonic() - started, 1),
        "placement": status["placement"],
        "paths": status["paths"],
        "exact_counts": got == expected,
    }


def latencies(trace_dir: Path) -> dict[str, list[float]]:
    """Sampled end-to-end latencies (ms) per app id, from every peer's trace files."""
    out: dict[str, list[float]] = {}
    for path in trace_files(trace_dir):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if '"tuple"' not in line:
                    continue
                rec = json.loads(line)
                if rec.get("type") == "tuple":
                    out.setdefault(rec["app"], []).append(float(rec["latency_ms"]))
    return out


def run_site(root: Path, strategy: str, names: list[str], quick: bool) -> list[dict[str, Any]]:
    """The apps ``names`` one after another on a fresh site, placed by ``strategy``."""
    link_file(root / "links.json")
    site = Site(
        len(NAMES),
        port=free_port(),
        workdir=root,
        extra_args=[
            *("--links", str(root / "links.json")),
            *("--trace-dir", str(root / "traces")),
            *("--workers", "1"),
        ],
        per_peer={"cloud-1": ["--zone", "cloud", "--workers", "4"]}
        | {w: ["--zone", "wan"] for w in WAN},
    )
    runs = []
    with site:
        asyncio.run(site.wait_formed(timeout=120.0))
        for app in names:
            run = run_one(site, app, strategy, quick)
            runs.append(run)
            print(
                f"{app:14} {strategy:12} {run['state']:8} {run['seconds']:5.1f} s "
                f"exact={run['exact_counts']} {run['placement']}",
                file=sys.stderr,
            )
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--quick", action="store_true", help="etl only, fewer records")
    ap.add_argument("--apps", nargs="+", default=None, help="bundled apps to run")
    args = ap.parse_args()
    names = args.apps or (["etl"] if args.quick else ["etl", "urban-sensing"])
    steal0 = cpu_steal()
    load0 = os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-placement-") as tmp:
        for app in names:  # a fresh site per run: none inherits another's backlog
            for strategy in STRATEGIES:
                root = Path(tmp) / f"{app}-{strategy}"
                root.mkdir()
                runs += run_site(root, strategy, [app], args.quick)
                samples |= latencies(root / "traces")  # after the peers stopped: flushed
    report: dict[str, Any] = {
        "mode": "real peers, engine link model (peer --links), loopback",
        "topology": {
            "edge": list(EDGE),
            "wan_relays": list(WAN),
            "cloud": list(CLOUD),
            "slot_ms": SLOT_MS,
            "hops_gateway_to_cloud": 3,
        },
        "apps": names,
        "strategies": {},
        "anchor": ANCHOR,
        "cpu_steal_pct": steal_pct(steal0, cpu_steal()),
        "cores": os.cpu_count(),
        "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],  # start, end
    }
    for strategy in STRATEGIES:
        mine = [r for r in runs if r["strategy"] == strategy]
        pooled = sorted(x for r in mine if r["app_id"] for x in samples.get(r["app_id"], []))
        report["strategies"][strategy] = {
            "p50_ms": _round(quantile(pooled, 0.5)),
            "p99_ms": _round(quantile(pooled, 0.99)),
            "samples": len(pooled),
            "per_app_p50_ms": {r["app"]: _pct(samples, r["app_id"], 0.5) for r in mine},
            "per_app_p99_ms": {r["app"]: _pct(samples, r["app_id"], 0.99) for r in mine},
            "states": {r["app"]: r["state"] for r in mine},
            "errors": {r["app"]: r["error"] for r in mine if "error" in r},
            "all_finished_exact": all(r["state"] == "finished" and r["exact_counts"] for r in mine),
            "placements": {r["app"]: r["placement"] for r in mine},
        }
    s = report["strategies"]
    for q in ("p50", "p99"):
        rtr, cloud = s["rtr"][f"{q}_ms"], s["cloud-only"][f"{q}_ms"]
        report[f"rtr_vs_cloud_only_{q}"] = (
            round(rtr / cloud, 3) if rtr is not None and cloud else None
        )
    report["rtr_vs_cloud_only_p50_per_app"] = {
        app: _ratio(s["rtr"]["per_app_p50_ms"].get(app), s["cloud-only"]["per_app_p50_ms"].get(app))
        for app in names
    }
    ratio = report["rtr_vs_cloud_only_p50"]
    report["rtr_reduction_vs_cloud_only_pct"] = (
        None if ratio is None else round(100 * (1 - ratio), 1)
    )
    if args.json:
        print(json.dumps(report))
    else:
        for name, v in s.items():
            print(f"{name:12} p50 {v['p50_ms']} ms  p99 {v['p99_ms']} ms  ({v['samples']} samples)")
        print(f"rtr / cloud-only p50: {ratio}  (anchor: {ANCHOR})")


def _pct(samples: dict[str, list[float]], app_id: str | None, q: float) -> float | None:
    return _round(quantile(sorted(samples.get(app_id or "", [])), q))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


if __name__ == "__main__":
    main()
