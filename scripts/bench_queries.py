"""Many small queries (Pluto): Q MQTT queries on 8 local peers and one Mosquitto.

Each query: one MQTT topic at 1 event/s -> filter (a function from one of 3 registered
bundles, with its own parameter) -> 10 s tumbling window (mean) -> MQTT sink. Queries
are submitted through the 8 peers in turn (8 in flight), sources and sinks spread
over the peers. This process publishes every topic once a second (``{"ts": wall-clock
ms, "value": ...}``, so event time follows the clock) and subscribes to the results.

Figures, per Q:

* ``submit_p50_ms`` / ``submit_p99_ms``: one ``submit`` RPC (validation, records, JOIN
  routing, placement, deployment, start) as the client sees it;
* ``latency_p50_ms`` / ``latency_p99_ms``: a window result received from the broker,
  minus the time the event that closed its window (the first event of the topic with
  ``ts >= window_end``) was published: broker -> source -> filter -> window -> sink ->
  broker -> subscriber;
* ``connections_per_peer``: TCP connections each peer process holds to the broker
  (counted from /proc, not self-reported), the most over the peers;
* ``rss_mb_per_peer`` (mean) and ``kb_per_query``: resident memory of the peers, and
  its growth from the formed ring to the end of the run divided by Q;
* ``checkpoints_per_query`` and ``checkpoint_waited_s``: over the ``status`` of up to
  20 queries at the end, the mean of the epochs each committed and of how long its
  last one waited for its scheduler's checkpoint budget (``--checkpoint-rate``).

Anchors (from the Pluto and eKuiper papers, not re-measured): Pluto keeps p99 latency
under 1 s with ten times the queries Flink can hold; eKuiper runs 8,000 rules on 2
cores / 4 GB at ~500 KB per rule. Last line with ``--json``: the largest Q's figures
(``queries``, ``submit_p99_ms``, ``latency_p99_ms``, ``connections_per_peer``,
``rss_mb_per_peer``, ``kb_per_query``) and every Q's under ``runs``.

A Q whose run fails (a peer too busy to answer a request in time, say) is reported
with its ``error`` and the next Q runs.

    python scripts/bench_queries.py [--queries 100,1000,3000] [--seconds 35]
        [--set checkpoint.mode=restart] [--peer-arg=--checkpoint-rate=2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import free_port

PEERS = 8
WINDOW_MS = 10_000
BUNDLES = {
    "above": "from agiledart.app import factory\n\n\n@factory\ndef keep(*, threshold=0.0):\n"
    "    return lambda r: r['value'] > threshold\n",
    "below": "from agiledart.app import factory\n\n\n@factory\ndef keep(*, threshold=0.0):\n"
    "    return lambda r: r['value'] < threshold + 50\n",
    "band": "from agiledart.app import factory\n\n\n@factory\ndef keep(*, threshold=0.0):\n"
    "    return lambda r: abs(r['value'] - threshold) < 40\n",
}
QUERY = """
name: q{i}
sources:
  - id: readings
    peer: {src}
    connector: mqtt
    params: {{broker: "127.0.0.1:{port}", topic: "bench/q{i}", out_of_order_ms: 0}}
operators:
  - id: keep
    op: filter
    fn: "{code}:keep"
    params: {{threshold: {threshold}}}
    inputs: [readings]
  - id: mean
    op: window
    params: {{size_ms: {window}, aggregate: mean, field: value}}
    inputs: [keep]
sinks:
  - id: out
    peer: {dst}
    connector: mqtt
    params: {{broker: "127.0.0.1:{port}", topic: "results/q{i}"}}
    inputs: [mean]
"""


def log(msg: str) -> None:
    print(f"[bench_queries] {msg}", file=sys.stderr, flush=True)


def start_broker(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(exe).exists():
        msg = "mosquitto is not installed (make setup installs it)"
        raise SystemExit(msg)
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "max_queued_messages 100000\n"
    )
    proc = subprocess.Popen([exe, "-c", str(conf)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.1)
    proc.kill()
    msg = "mosquitto did not start"
    raise SystemExit(msg)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def broker_connections(pids: list[int], port: int) -> list[int]:
    """TCP connections each process holds to 127.0.0.1:port (from /proc)."""
    inodes: dict[str, None] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        remote, state, inode = f[2], f[3], f[9]
        if state == "01" and int(remote.split(":")[1], 16) == port:
            inodes[inode] = None
    out = []
    for pid in pids:
        n = 0
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                n += 1
        out.append(n)
    return out


def quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


async def run_q(
    q: int, seconds: float, overrides: list[str], peer_args: list[str]
) -> dict[str, Any]:
    import aiomqtt

    from agiledart.emulation import LocalCluster

    with tempfile.TemporaryDirectory(prefix="bench-queries-") as tmp:
        broker, port = start_broker(Path(tmp))
        try:
            site = Path(tmp) / "site"
            site.mkdir()
            with LocalCluster(
                PEERS, port=free_port(), workdir=site, extra_args=list(peer_args)
            ) as cluster:
                return await _run(cluster, port, q, seconds, overrides, aiomqtt)
        finally:
            broker.terminate()
            broker.wait(10)


async def _run(
    cluster: Any, port: int, q: int, seconds: float, overrides: list[str], aiomqtt: Any
) -> dict[str, Any]:
    await cluster.wait_formed()
    pids = [p.pid for p in cluster.procs]
    base_rss = [rss_kb(pid) for pid in pids]
    names = [cluster.name(i) for i in range(PEERS)]
    codes = []
    for j, source in enumerate(BUNDLES.values()):
        reply = await cluster.request(j % PEERS, "register", {"source": source.encode()})
        codes.append(reply["code_id"])
    rng = random.Random(q)
    published: dict[int, list[tuple[int, float]]] = {i: [] for i in range(q)}
    latencies: list[float] = []
    stop = asyncio.Event()

    async with aiomqtt.Client("127.0.0.1", port) as pub, aiomqtt.Client("127.0.0.1", port) as sub:
        await sub.subscribe("results/#")

        async def listen() -> None:
            async for message in sub.messages:
                now = time.time() * 1000
                i = int(str(message.topic).rsplit("q", 1)[1])
                end = json.loads(message.payload)["window_end"]
                closing = next((t for ts, t in published[i] if ts >= end), None)
                if closing is not None:
                    latencies.append(now - closing)

        async def publish() -> None:
            while not stop.is_set():
                tick = time.monotonic()
                for i in range(q):
                    ts = int(time.time() * 1000)
                    published[i].append((ts, ts))
                    payload = json.dumps({"ts": ts, "value": rng.uniform(0, 100)})
                    await pub.publish(f"bench/q{i}", payload)
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))

        listener = asyncio.create_task(listen())
        submit_ms: list[float] = []
        app_ids: list[str] = []
        sem = asyncio.Semaphore(8)
        t0 = time.monotonic()

        async def submit(i: int) -> None:
            spec = QUERY.format(
                i=i,
                src=names[i % PEERS],
                dst=names[(i + 3) % PEERS],
                port=port,
                code=codes[i % len(codes)],
                threshold=rng.randint(0, 60),
                window=WINDOW_MS,
            )
            async with sem:
                t = time.monotonic()
                body = {"spec": spec, "set": list(overrides)}
                reply = await cluster.request(i % PEERS, "submit", body, timeout=120)
                app_ids.append(str(reply["app_id"]))
                submit_ms.append((time.monotonic() - t) * 1000)
            if len(submit_ms) % max(1, q // 10) == 0:
                log(f"Q={q}: {len(submit_ms)} submitted")

        await asyncio.gather(*(submit(i) for i in range(q)))
        log(f"Q={q}: all submitted in {time.monotonic() - t0:.1f} s; publishing {seconds:.0f} s")
        publisher = asyncio.create_task(publish())
        await asyncio.sleep(seconds)
        stop.set()
        await publisher
        await asyncio.sleep(2)
        listener.cancel()
    sample = app_ids[:: max(1, len(app_ids) // 20)][:20]
    sampled = [
        await cluster.request(i % PEERS, "status", {"app_id": app}, timeout=60)
        for i, app in enumerate(sample)
    ]
    conns = broker_connections(pids, port)
    rss = [rss_kb(pid) for pid in pids]
    return {
        "queries": q,
        "submit_p50_ms": quantile(submit_ms, 0.5),
        "submit_p99_ms": quantile(submit_ms, 0.99),
        "latency_p50_ms": quantile(latencies, 0.5),
        "latency_p99_ms": quantile(latencies, 0.99),
        "results": len(latencies),
        "connections_per_peer": max(conns),
        "rss_mb_per_peer": round(sum(rss) / len(rss) / 1024, 1),
        "kb_per_query": round((sum(rss) - sum(base_rss)) / q, 1),
        "checkpoints_per_query": round(
            sum(st["checkpoints"] for st in sampled) / max(1, len(sampled)), 2
        ),
        "checkpoint_waited_s": round(
            sum((st["checkpoint"] or {}).get("waited_s", 0.0) for st in sampled)
            / max(1, len(sampled)),
            3,
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", default="100,1000,3000", help="comma-separated Q values")
    parser.add_argument("--seconds", type=float, default=35.0, help="publishing time per Q")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for every query, as `submit --set` takes it "
        "(e.g. checkpoint.mode=restart); repeatable",
    )
    parser.add_argument(
        "--peer-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for every `agiledart peer` (write options with their "
        "value as --peer-arg=--checkpoint-rate=2); repeatable",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    for q in (int(x) for x in args.queries.split(",")):
        log(f"Q={q}: starting {PEERS} peers and mosquitto")
        try:
            result = asyncio.run(run_q(q, args.seconds, args.set, args.peer_arg))
        except Exception as exc:  # a peer too busy to answer, say: report it, go on
            result = {"queries": q, "error": f"{type(exc).__name__}: {exc}"}
        log(json.dumps(result))
        runs.append(result)
    last = runs[-1]
    keys = ("queries", "submit_p99_ms", "latency_p99_ms", "connections_per_peer")
    report: dict[str, Any] = {
        k: last.get(k) for k in (*keys, "rss_mb_per_peer", "kb_per_query", "error")
    }
    report["overrides"] = args.set
    report["peer_args"] = args.peer_arg
    report["runs"] = runs
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
