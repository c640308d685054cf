"""Connector benchmark: MQTT ingest into a running app, against ``mosquitto_sub``.

A Mosquitto with its default limits (``max_inflight_messages 20``,
``max_queued_messages 1000``) on loopback; a burst of ``--burst`` QoS 1 messages
published by one ``mosquitto_pub -l`` call, first to a plain ``mosquitto_sub -q 1``
(the anchor: the same broker, the same run), then to an app on real peer processes
(an ``mqtt`` source, QoS 1, ``count`` the burst -> a file sink). The source stamps
each record with the wall-clock time it decoded it (the payloads carry no ``ts``), so
the engine's rate is the burst over the time from the publish's start to the last
stamp; ``mosquitto_sub``'s is the burst over the time to its exit.

Usage::

    python scripts/bench_connectors.py --json
    python scripts/bench_connectors.py --burst 10000 --rounds 3 --json

The last line (with ``--json``) is one JSON object: ``burst_messages``,
``burst_delivered_fraction`` (what the app's source received of the QoS 1 burst, the
lowest over the rounds), ``engine_msgs_per_s`` and ``mosquitto_sub_msgs_per_s`` (the
medians), ``engine_vs_mosquitto_sub``, and the machine's load average. The sink
pipelines of the connectors issue (sql, mqtt, exactly-once against at-most-once) are
not measured here yet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import free_port

from agiledart.emulate import LocalCluster, site_name

TOPIC = "bench/burst"


class Mosquitto:
    """A broker with its defaults but for the listener (and the log, to read)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "mosquitto.log"
        config = workdir / "mosquitto.conf"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true"]
        lines += [f"log_dest file {self.log}", "log_type all"]
        if os.geteuid() == 0:
            lines.append("user root")
        config.write_text("\n".join(lines) + "\n")
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen([binary, "-c", str(config)], stderr=subprocess.DEVNULL)
        time.sleep(0.5)

    def dropped(self) -> int:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count("Outgoing messages are being dropped")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def burst_lines(n: int) -> bytes:
    return "".join(f'{{"key":"k{i % 7}","v":{i}}}\n' for i in range(n)).encode()


def publish(port: int, topic: str, lines: bytes) -> float:
    """Publish a burst with ``mosquitto_pub -l`` (QoS 1); when it started (wall clock)."""
    start = time.time()
    subprocess.run(
        ["mosquitto_pub", "-p", str(port), "-t", topic, "-q", "1", "-l"],
        input=lines,
        check=True,
        timeout=300,
    )
    return start


def anchor(broker: Mosquitto, n: int, work: Path) -> tuple[float, int]:
    """``mosquitto_sub -q 1``'s rate over the burst, and how many it received."""
    out = work / "anchor.txt"
    with out.open("wb") as f:
        cmd = ["mosquitto_sub", "-p", str(broker.port), "-t", f"{TOPIC}/anchor", "-q", "1"]
        cmd += ["-C", str(n), "-W", "60"]  # exit after the burst, or after 60 s
        sub = subprocess.Popen(cmd, stdout=f)
        time.sleep(0.5)  # subscribed
        start = publish(broker.port, f"{TOPIC}/anchor", burst_lines(n))
        sub.wait(timeout=120)
        end = time.time()
    got = len(out.read_bytes().splitlines())
    return got / max(end - start, 1e-6), got


def engine(
    cluster: LocalCluster, broker: Mosquitto, n: int, work: Path, run: int
) -> dict[str, Any]:
    """The app's rate over the burst, and what its source received and shed."""
    key = str(cluster.workdir / "cluster.key") if cluster.workdir else ""
    via = "{}:{}".format(*cluster.address(1))

    def cli(*args: str) -> Any:
        cmd = [sys.executable, "-m", "agiledart.cli", "--log-level", "warning", *args]
        proc = subprocess.run(
            [*cmd, "--json", "--cluster-key-file", key, "--via", via],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            msg = f"agiledart {' '.join(args)} exited with {proc.returncode}: {proc.stderr}"
            raise RuntimeError(msg)
        return json.loads(proc.stdout)

    topic = f"{TOPIC}/engine{run}"
    spec = {
        "name": f"ingest-{run}",
        "sources": [
            {
                "id": "burst",
                "peer": site_name(0),
                "connector": "mqtt",
                "params": {
                    "broker": f"127.0.0.1:{broker.port}",
                    "topic": topic,
                    "qos": 1,
                    "count": n,
                },
            }
        ],
        "sinks": [
            {
                "id": "out",
                "peer": site_name(1),
                "connector": "file",
                "params": {"path": f"ingest-{run}.jsonl"},
                "inputs": ["burst"],
            }
        ],
    }
    path = work / f"ingest-{run}.json"
    path.write_text(json.dumps(spec))
    app = cli("submit", str(path))["app_id"]

    def source(s: dict[str, Any]) -> dict[str, Any]:
        for peer in s["peers"].values():
            if "burst" in peer["sources"]:
                found: dict[str, Any] = peer["sources"]["burst"]
                return found
        return {}

    deadline = time.monotonic() + 60
    while not source(cli("status", app)).get("subscribed"):
        if time.monotonic() > deadline:
            msg = "the app's source did not subscribe within 60 s"
            raise RuntimeError(msg)
        time.sleep(0.2)
    start = publish(broker.port, topic, burst_lines(n))
    deadline = time.monotonic() + 120
    while (s := cli("status", app))["state"] != "finished":
        if time.monotonic() > deadline:
            break  # lost messages: the app waits for its count
        time.sleep(0.5)
    src = source(s)
    sink = next(p["sinks"]["out"] for p in s["peers"].values() if "out" in p["sinks"])
    stamps = [json.loads(line)["ts"] for line in Path(sink["path"]).read_text().splitlines()]
    if s["state"] != "finished":
        cli("stop", app)
    last = max(stamps) / 1000.0 if stamps else start
    return {
        "msgs_per_s": len(stamps) / max(last - start, 1e-6),
        "received": src.get("received", 0),
        "shed": src.get("shed", 0),
        "finished": s["state"] == "finished",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=10_000, help="messages per burst")
    parser.add_argument("--rounds", type=int, default=1, help="bursts each way")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)
    n = args.burst
    subs: list[float] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-connectors-") as tmp:
        work = Path(tmp)
        broker = Mosquitto(work)
        try:
            (work / "site").mkdir()
            with LocalCluster(2, port=free_port(), workdir=work / "site") as cluster:
                asyncio.run(cluster.wait_formed())
                for run in range(args.rounds):
                    rate, got = anchor(broker, n, work)
                    subs.append(rate)
                    row = engine(cluster, broker, n, work, run)
                    rows.append(row)
                    print(
                        f"round {run}: mosquitto_sub {rate:,.0f}/s ({got}/{n}), engine "
                        f"{row['msgs_per_s']:,.0f}/s ({row['received']}/{n}, shed {row['shed']})",
                        file=sys.stderr,
                    )
            dropped = broker.dropped()
        finally:
            broker.close()
    engine_rate = statistics.median(r["msgs_per_s"] for r in rows)
    sub_rate = statistics.median(subs)
    result = {
        "burst_messages": n,
        "burst_qos": 1,
        "rounds": args.rounds,
        "burst_delivered_fraction": round(min(r["received"] for r in rows) / n, 4),
        "engine_msgs_per_s": round(engine_rate),
        "mosquitto_sub_msgs_per_s": round(sub_rate),
        "engine_vs_mosquitto_sub": round(engine_rate / sub_rate, 3),
        "engine_shed": sum(r["shed"] for r in rows),
        "broker_dropped_warnings": dropped,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
