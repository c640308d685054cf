"""Data-plane throughput: agiledart peers beside Bytewax and raw TCP, in the same run.

The pipeline is the bundled ``throughput`` app (``agiledart/apps/throughput.yaml``):
``counter`` records ``{ts, key, seq}`` (16 keys, seed 1, rate 100,000/s) -> filter
``seq % 10 != 0`` -> map ``seq * 0.5`` -> running sum of ``seq`` per key, one output
per record that passes the filter. Figures, all measured here, side by side:

* ``single_peer_tps`` / ``three_peer_tps`` (+ ``p50_ms``, ``p99_ms`` end-to-end
  latency): input records/s through real agiledart peers (the engine half).
* ``bytewax_tps``: the same pipeline as a Bytewax 0.21.1 dataflow (``run_main``, one
  worker) in a child process, over records materialised before the clock starts; the
  anchor for one peer (``ratio_vs_bytewax``). Needs the ``bench`` extra; null without.
* ``raw_tcp_tps``: the transport ceiling. Two processes on 127.0.0.1, asyncio streams
  (uvloop where available, as peers use), msgpack batches of such records in 4-byte
  big-endian length-prefixed frames, every frame unpacked by the receiver; records/s
  at the receiver from first byte to last record.

Each figure is the best of ``--repeat`` runs (default 3; every run is logged to
stderr), as ``timeit`` advises on a shared machine: slower runs measure the
neighbours. ``cpu_steal_pct`` is the share of CPU time the hypervisor took during the
whole benchmark. As every benchmark (BENCHMARKS.md): runnable on 2 cores, one
JSON object on the last line with ``--json``; progress goes to stderr.

    python scripts/bench_pipeline.py [--records N] [--repeat R] [--json] [--skip-engine]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgpack
from benchlib import cpu_steal, free_port, steal_pct

from agiledart.datasets import CHUNK, generate_batches

#: The generator source of agiledart/apps/throughput.yaml.
DATASET: dict[str, Any] = {"dataset": "counter", "seed": 1, "rate": 100_000, "keys": 16}
EVERY, FACTOR = 10, 0.5  # builtin:skip_every, builtin:scale


def log(msg: str) -> None:
    print(f"[bench_pipeline] {msg}", file=sys.stderr, flush=True)


def records(n: int, batch: int = CHUNK) -> list[list[dict[str, Any]]]:
    """The throughput app's first ``n`` input records, in batches of ``batch``."""
    return list(generate_batches(**DATASET, count=n, batch_size=batch))


def _child(*args: str) -> dict[str, Any]:
    """Run this script's hidden ``--child`` mode; its last stdout line is JSON."""
    cmd = [sys.executable, __file__, "--child", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        msg = f"{' '.join(args)} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        raise RuntimeError(msg)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# -- engine -----------------------------------------------------------------------------
#
# Real `agiledart peer` processes (LocalCluster, loopback). The app is deployed with the
# peer-facing `deploy` and `start` RPCs, which is what a scheduler sends after JOIN
# routing, so that the split over peers is fixed: one peer runs everything; three peers
# run source + filter | map | aggregate + sink. The sink is `discard` (counts, like the
# Bytewax anchor's sink). Throughput: input records / (last sink write - sources
# started); latency: the sink's 5% traces, source wall clock to sink wall clock.


def _engine_run(hosts: list[str], n: int, speedup: float) -> dict[str, Any]:
    from agiledart import apps
    from agiledart.emulation import LocalCluster
    from agiledart.runtime.instance import Deployment

    spec = apps.load(
        "throughput",
        overrides=[
            f"params.count={n}",
            f"sources.readings.peer={hosts[0]}",
            f"sources.readings.params.speedup={speedup}",
            f"sinks.totals.peer={hosts[-1]}",
            "sinks.totals.connector=discard",
        ],
    )
    peers = sorted(set(hosts), key=hosts.index)
    ops = [o.id for o in spec.operators]  # sampled, halved, per-key
    where = {"readings": hosts[0], ops[0]: hosts[0], ops[1]: hosts[len(hosts) // 2]}
    where |= {ops[2]: hosts[-1], "totals": hosts[-1]}

    async def go(cluster: LocalCluster) -> dict[str, Any]:
        await cluster.wait_formed()
        index = {cluster.name(i): i for i in range(cluster.peers)}
        deployment = Deployment(
            app_id="bench",
            spec=spec,
            hosts={node: (peer,) for node, peer in where.items()},
            addresses={p: cluster.address(index[p]) for p in peers},
            scheduler=cluster.address(index[hosts[-1]]),
        )
        for peer in reversed(peers):
            await cluster.request(index[peer], "deploy", deployment.to_wire())
        for peer in peers:
            await cluster.request(index[peer], "start", {"app_id": "bench"})
        sink_peer = index[hosts[-1]]
        while True:
            stats = await cluster.request(sink_peer, "app_stats", {"app_id": "bench"})
            sink = stats["sinks"]["totals"]
            if sink["done"]:
                break
            await asyncio.sleep(0.2)
        source = await cluster.request(index[hosts[0]], "app_stats", {"app_id": "bench"})
        return {"source": source, "sink": sink}

    with LocalCluster(len(peers), port=free_port(), extra_args=PEER_ARGS) as cluster:
        got: dict[str, Any] = asyncio.run(go(cluster))
    seconds = got["sink"]["last_at"] - got["source"]["started_at"]
    emitted = got["source"]["sources"]["readings"]["emitted"]
    if emitted != n:
        msg = f"source emitted {emitted} of {n} records"
        raise RuntimeError(msg)
    return {
        "tps": n / seconds,
        "p50_ms": got["sink"]["latency_p50_ms"],
        "p99_ms": got["sink"]["latency_p99_ms"],
        "sink_records": got["sink"]["records"],
    }


UNPACED = 1e6  # speedup: sources go as fast as the pipeline takes them
#: extra ``agiledart peer`` options (``--peer-args``), e.g. ``--workers 0``
PEER_ARGS: list[str] = []


def bench_engine_single(n: int, repeat: int = 1) -> float:
    """Input records/s of the throughput app on one agiledart peer (best of ``repeat``)."""
    runs = [float(_engine_run(["sensor-1"], n, UNPACED)["tps"]) for _ in range(repeat)]
    log(f"one peer: {', '.join(f'{x:,.0f}' for x in runs)} records/s")
    return max(runs)


def bench_engine_three(n: int, repeat: int = 1) -> dict[str, float]:
    """``{"tps", "p50_ms", "p99_ms"}`` across three peers: saturation, then latency with
    the source paced at half of it; each the best of ``repeat`` runs."""
    hosts = ["sensor-1", "sensor-2", "gateway-1"]
    runs = [_engine_run(hosts, n, UNPACED)["tps"] for _ in range(repeat)]
    tps = max(runs)
    log(f"three peers: {', '.join(f'{x:,.0f}' for x in runs)} records/s; latency at half")
    half = [_engine_run(hosts, n, tps / 2 / DATASET["rate"]) for _ in range(repeat)]
    log("at half: " + ", ".join(f"p50 {h['p50_ms']} / p99 {h['p99_ms']} ms" for h in half))
    best = min(half, key=lambda h: h["p99_ms"])
    return {"tps": tps, "p50_ms": best["p50_ms"], "p99_ms": best["p99_ms"]}


# -- Bytewax anchor ---------------------------------------------------------------------


def bench_bytewax(n: int) -> float:
    """Input records/s of the pipeline in Bytewax (a child process, one worker)."""
    if importlib.util.find_spec("bytewax") is None:
        msg = "bytewax is not installed (pip install -e '.[bench]')"
        raise ModuleNotFoundError(msg)
    out = _child("bytewax", str(n))
    if not 0 < out["outputs"] == out["expected"]:
        msg = f"bytewax emitted {out['outputs']} records, expected {out['expected']}"
        raise RuntimeError(msg)
    return float(n / out["seconds"])


def _bytewax_child(n: int) -> dict[str, Any]:
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.testing import TestingSource
    from bytewax.testing import run_main as untyped_run_main

    data = [r for batch in records(n) for r in batch]
    expected = sum(r["seq"] % EVERY != 0 for r in data)
    seen = [0]

    class Count(StatelessSinkPartition[Any]):
        def write_batch(self, items: list[Any]) -> None:
            seen[0] += len(items)

    class CountSink(DynamicSink[Any]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Count:
            return Count()

    def scale(r: dict[str, Any]) -> dict[str, Any]:
        out = r.copy()
        out["seq"] = r["seq"] * FACTOR
        return out

    def running_sum(acc: float | None, r: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        s = (acc or 0) + r["seq"]
        return s, {"key": r["key"], "value": s, "ts": r["ts"]}

    flow = Dataflow("throughput")
    s = op.input("readings", flow, TestingSource(data, batch_size=CHUNK))
    s = op.filter("sampled", s, lambda r: r["seq"] % EVERY != 0)
    s = op.map("halved", s, scale)
    keyed = op.key_on("key", s, lambda r: r["key"])
    op.output("totals", op.stateful_map("per-key", keyed, running_sum), CountSink())
    run_main: Callable[[Dataflow], None] = untyped_run_main  # untyped upstream
    start = time.perf_counter()
    run_main(flow)
    return {"seconds": time.perf_counter() - start, "outputs": seen[0], "expected": expected}


# -- raw TCP anchor ---------------------------------------------------------------------


def bench_raw_tcp(n: int, batch: int = 1000) -> float:
    """Records/s of msgpack batches over loopback TCP, unpacked by a receiver process."""
    frames = []
    for recs in records(n, batch):
        payload = msgpack.packb(recs)
        frames.append(len(payload).to_bytes(4, "big") + payload)
    cmd = [sys.executable, __file__, "--child", "raw-tcp", str(n)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        try:
            _run(_send(int(proc.stdout.readline()), frames))
            out, _ = proc.communicate(timeout=600)
        except BaseException:
            proc.kill()  # it would wait for a connection forever
            raise
    if proc.returncode != 0:
        msg = f"raw-tcp receiver failed ({proc.returncode})"
        raise RuntimeError(msg)
    result = json.loads(out.strip().splitlines()[-1])
    if result["records"] != n:
        msg = f"receiver counted {result['records']} records, sent {n}"
        raise RuntimeError(msg)
    return float(n / result["seconds"])


async def _send(port: int, frames: list[bytes]) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    for frame in frames:
        writer.write(frame)
        if writer.transport.get_write_buffer_size() > 4 << 20:
            await writer.drain()
    await writer.drain()
    writer.close()
    await writer.wait_closed()


class _Receiver(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done, self.buf, self.records = done, bytearray(), 0
        self.first = self.last = 0.0

    def data_received(self, data: bytes) -> None:
        if not self.first:
            self.first = time.perf_counter()
        buf = self.buf
        buf += data
        pos, end, unpackb = 0, len(buf), msgpack.unpackb
        with memoryview(buf) as view:
            while end - pos >= 4:
                size = int.from_bytes(view[pos : pos + 4], "big")
                if end - pos - 4 < size:
                    break
                self.records += len(unpackb(view[pos + 4 : pos + 4 + size]))
                pos += 4 + size
        del buf[:pos]
        self.last = time.perf_counter()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _receive() -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    proto = _Receiver(done)
    server = await loop.create_server(lambda: proto, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await done
    server.close()
    return {"records": proto.records, "seconds": proto.last - proto.first}


# -- harness ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="input records")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--skip-engine", action="store_true", help="only the anchors")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each measurement; the best is reported (default 3)",
    )
    parser.add_argument(
        "--peer-args",
        default="",
        metavar="ARGS",
        help="extra agiledart peer options, e.g. '--workers 0' (default: none, the "
        "peer's own defaults: the EdgeWise worker pool)",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    PEER_ARGS[:] = shlex.split(args.peer_args)
    if args.child:
        kind, n = args.child[0], int(args.child[1])
        print(json.dumps(_bytewax_child(n) if kind == "bytewax" else _run(_receive())))
        return 0

    n = args.records
    steal_before = cpu_steal()
    single = three_tps = p50 = p99 = bytewax = None
    if not args.skip_engine:
        try:
            log(f"engine, one peer: {n:,} records")
            single = bench_engine_single(n, args.repeat)
            log(f"engine, three peers: {n:,} records")
            three = bench_engine_three(n, args.repeat)
            three_tps, p50, p99 = three["tps"], three["p50_ms"], three["p99_ms"]
        except NotImplementedError as e:
            log(f"engine skipped: {e}")
    log(f"bytewax: {n:,} records")
    try:
        bytewax = max(bench_bytewax(n) for _ in range(args.repeat))
    except ModuleNotFoundError as e:
        log(f"bytewax skipped: {e}")
    log(f"raw tcp: {n:,} records")
    raw = max(bench_raw_tcp(n) for _ in range(args.repeat))

    def tps(x: float | None) -> int | None:
        return None if x is None else round(x)

    def ms(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    report = {
        "single_peer_tps": tps(single),
        "bytewax_tps": tps(bytewax),
        "ratio_vs_bytewax": None if single is None or not bytewax else round(single / bytewax, 2),
        "three_peer_tps": tps(three_tps),
        "p50_ms": ms(p50),
        "p99_ms": ms(p99),
        "raw_tcp_tps": tps(raw),
        "records": n,
        "repeat": args.repeat,
        "peer_args": args.peer_args,
        "cpu_steal_pct": steal_pct(steal_before, cpu_steal()),
        "python": platform.python_version(),
    }
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>16}: {value:,}" if isinstance(value, int) else f"{key:>16}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
