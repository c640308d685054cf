"""Connector benchmark: MQTT ingest into a running app, against ``mosquitto_sub``; and
the sink pipelines, exactly-once against the same pipeline without checkpoints.

A Mosquitto with its default limits (``max_inflight_messages 20``,
``max_queued_messages 1000``) on loopback; a burst of ``--burst`` QoS 1 messages
published by one ``mosquitto_pub -l`` call, first to a plain ``mosquitto_sub -q 1``
(the anchor: the same broker, the same run), then to an app on real peer processes
(an ``mqtt`` source, QoS 1, ``count`` the burst -> a file sink). The source stamps
each record with the wall-clock time it decoded it (the payloads carry no ``ts``), so
the engine's rate is the burst over the time from the publish's start to the last
stamp; ``mosquitto_sub``'s is the burst over the time to its exit.

*Sinks* (``--sinks``, default ``sqlite,postgresql,mqtt``): on the same two peers, an
``mqtt`` source (QoS 1, a burst of ``--records`` published by one ``mosquitto_pub -l``)
on the first -> a 1 s keyed window (sum of ``v`` over 7 keys) -> a ``sql`` sink on the
second (SQLite: a file on the sink's peer; PostgreSQL: a throwaway cluster on
127.0.0.1 that the bench starts), each sink twice: with checkpoints (``erasure``, an
epoch a second: each epoch's rows go into the table once it commits, exactly once)
and without (``mode: restart``: rows go out in batches within a second, no guarantee
across a failure; the issue calls it at-most-once). The bench polls the table every
100 ms: throughput is the burst over the time from the publish's start to the poll
that finds the values adding up to the burst's; latency, per row, the poll that
first saw it minus its window's close (its end, or for the last window, cut short by
the burst's end, the time ``mosquitto_pub`` had the whole burst acked). Each table
must end exact: one row per (key, window), per key the sum of the burst's values
(the windows follow the decode times, so the rows themselves are not fixed). The
``mqtt`` sink (``--sinks mqtt``) runs the same way, publishing each window's row to
``bench/out/RUN/{key}`` (QoS 1) on the same broker: exactly-once is ``delivery:
exactly-once`` with checkpoints (each committed epoch's messages, each with its
``agiledart-id``), at-most-once the same pipeline without checkpoints (published at
once); its "table" is what a plain MQTT 5 subscriber in the bench received, after it
dropped repeated ids.

Usage::

    python scripts/bench_connectors.py --json
    python scripts/bench_connectors.py --burst 10000 --rounds 3 --json
    python scripts/bench_connectors.py --sinks-only --sinks mqtt --records 20000 --json

The last line (with ``--json``) is one JSON object: ``burst_messages``,
``burst_delivered_fraction`` (what the app's source received of the QoS 1 burst, the
lowest over the rounds), ``engine_msgs_per_s`` and ``mosquitto_sub_msgs_per_s`` (the
medians), ``engine_vs_mosquitto_sub`` (these without ``--sinks-only``), and the
machine's load average; with sinks, ``sinks_measured``, ``sink_records``, per sink
``{sink}_exactly_once_tps``, ``{sink}_at_most_once_tps`` (records of the burst per
second into the table), ``{sink}_p99_ms`` and ``{sink}_at_most_once_p99_ms`` (to the
table), ``{sink}_sink_write_p99_ms`` and ``{sink}_at_most_once_sink_write_p99_ms``
(the sink's own ``latency_p99_ms`` in ``status``: source to the sink's write, before
any commit), ``{sink}_rows``, ``exactly_once_vs_at_most_once`` (the lowest ratio of
the throughputs over the sinks), ``sink_tables_exact`` and ``sinks_together``
(``--together``: the runs went at once, so their figures share the CPU; the tests'
quick check). ``--keep DIR`` works in ``DIR`` and leaves each table's final rows in
``DIR/tables/TABLE.json`` (the mqtt sink's "table": what its subscriber kept) and each
app's last ``status`` in ``DIR/status/``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import glob
import json
import os
import pwd
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import psycopg
from benchlib import free_port
from paho.mqtt.properties import Properties

from agiledart.emulation import LocalCluster, site_name

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

    def subscribed(self, client: str, timeout_s: float = 30.0) -> bool:
        """Wait until the broker's log says it acknowledged ``client``'s subscription
        (True), or ``timeout_s`` (False)."""
        needle = f"Sending SUBACK to {client}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.log.exists() and needle in self.log.read_text(errors="replace"):
                return True
            time.sleep(0.05)
        return False

    def dropped(self, client: str = "") -> int:
        """How many times the broker's log says it dropped messages (for ``client``)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count(f"Outgoing messages are being dropped for client {client}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def burst_lines(n: int) -> bytes:
    return "".join(f'{{"key":"k{i % 7}","v":{i}}}\n' for i in range(n)).encode()


#: lines one ``mosquitto_pub -l`` publishes, at most: past 65,535 its message ids wrap,
#: and it exits (status 0) once the id of its last line is acknowledged, the first time
#: (Mosquitto 2.0.11: of 100,000 lines it published 34,467, the broker's log saying the
#: client "disconnected due to out of memory")
PUB_LINES = 60_000


def publish(port: int, topic: str, lines: bytes) -> float:
    """Publish a burst with ``mosquitto_pub -l`` (QoS 1), ``PUB_LINES`` lines a call,
    one call after another; when it started (wall clock)."""
    start = time.time()
    rows = lines.splitlines(keepends=True)
    for i in range(0, len(rows), PUB_LINES):
        subprocess.run(
            ["mosquitto_pub", "-p", str(port), "-t", topic, "-q", "1", "-l"],
            input=b"".join(rows[i : i + PUB_LINES]),
            check=True,
            timeout=300,
        )
    return start


#: bursts the anchor publishes, at most, until the broker delivers one whole
ANCHOR_TRIES = 5


def anchor(broker: Mosquitto, n: int, work: Path) -> tuple[float, int]:
    """``mosquitto_sub -q 1``'s rate over the burst (MQTT 5, as the engine's source),
    and how many it received. Mosquitto queues at most 1,000 messages for a subscriber
    by default and drops the rest: a subscriber a moment behind the burst loses part of
    it, and that burst measured nothing, so it is published again, up to
    :data:`ANCHOR_TRIES` times."""
    for _ in range(ANCHOR_TRIES):
        rate, got, dropped = _anchor_once(broker, n, work)
        if not dropped:
            break
        print(f"mosquitto_sub: the broker dropped part of the burst ({got}/{n})", file=sys.stderr)
    return rate, got


def _anchor_once(broker: Mosquitto, n: int, work: Path) -> tuple[float, int, bool]:
    """One burst to ``mosquitto_sub``: its rate, what it received, and whether the
    broker dropped some of it."""
    out = work / "anchor.txt"
    client = f"bench-anchor-{uuid.uuid4().hex[:12]}"
    # mosquitto_sub exits after the burst, or after -W seconds (at least 1,000 a second)
    wait_s = max(10, n // 1000)
    with out.open("wb") as f:
        cmd = ["mosquitto_sub", "-p", str(broker.port), "-t", f"{TOPIC}/anchor", "-q", "1"]
        cmd += ["-V", "5", "-i", client, "-C", str(n), "-W", str(wait_s)]
        sub = subprocess.Popen(cmd, stdout=f)
        # published before the broker has the subscription, the burst's first messages
        # would be missed (a loaded machine once took longer than the half second this
        # used to sleep)
        broker.subscribed(client)
        start = publish(broker.port, f"{TOPIC}/anchor", burst_lines(n))
        sub.wait(timeout=wait_s + 60)
        end = time.time()
    got = len(out.read_bytes().splitlines())
    return got / max(end - start, 1e-6), got, broker.dropped(client) > 0


def agiledart(cluster: LocalCluster, *args: str) -> Any:
    """``agiledart ARGS --json`` through the cluster's second peer; its JSON."""
    key = str(cluster.workdir / "cluster.key") if cluster.workdir else ""
    via = "{}:{}".format(*cluster.address(1))
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


def status(cluster: LocalCluster, app: str) -> dict[str, Any]:
    """The app's ``status`` (what ``agiledart status --json`` prints), asked of the
    cluster's second peer in this process: a CLI process costs about half a CPU
    second, and the runs poll it while they wait (``--together``: six at once)."""
    found: dict[str, Any] = asyncio.run(cluster.request(1, "status", {"app_id": app}, timeout=60.0))
    return found


def engine(
    cluster: LocalCluster, broker: Mosquitto, n: int, work: Path, run: int
) -> dict[str, Any]:
    """The app's rate over the burst, and what its source received and shed."""

    def cli(*args: str) -> Any:
        return agiledart(cluster, *args)

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
    while not source(status(cluster, app)).get("subscribed"):
        if time.monotonic() > deadline:
            msg = "the app's source did not subscribe within 60 s"
            raise RuntimeError(msg)
        time.sleep(0.2)
    start = publish(broker.port, topic, burst_lines(n))
    deadline = time.monotonic() + 120
    while (s := status(cluster, app))["state"] != "finished":
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


# -- the sink pipelines: MQTT -> 1 s keyed window -> sql or mqtt sink -----------------

SINKS = ("sqlite", "postgresql", "mqtt")
ID_PROPERTY = "agiledart-id"  #: the mqtt sink's message id (a user property)
PG_PASSWORD = "agiledart-bench-password"
PG_ENV = "AGILEDART_SECRET_BENCH_PG"  #: the peers inherit it (set before they start)
WINDOW_MS = 1_000
KEYS = 7
#: seconds between a sink run's ``status`` calls while it waits for its app to start or
#: end (the figures come from the table's polls, not these)
STATUS_POLL_S = 0.5


class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (as root it runs as ``postgres``)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else None
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            msg = "PostgreSQL is not installed (scripts/setup.sh installs it)"
            raise RuntimeError(msg)
        self.bin = Path(found[-1]).parent
        pwfile = workdir / "pw"
        pwfile.write_text(PG_PASSWORD + "\n")
        if self.user is not None:
            u = pwd.getpwnam(self.user)
            os.chown(workdir, u.pw_uid, u.pw_gid)
            os.chown(pwfile, u.pw_uid, u.pw_gid)
        data = str(workdir / "data")
        self._run(
            "initdb", "-D", data, "-U", "postgres", "--pwfile", str(pwfile),
            "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        opts = f"-k {workdir} -p {self.port} -h 127.0.0.1"
        log = str(workdir / "log")
        self._run("pg_ctl", "-D", data, "-o", opts, "-l", log, "-w", "-t", "60", "start")

    def _run(self, name: str, *argv: str) -> None:
        cmd = [str(self.bin / name), *argv]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, password=PG_PASSWORD, autocommit=True) as conn:
            cur = conn.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    def close(self) -> None:
        data = str(self.workdir / "data")
        with contextlib.suppress(subprocess.SubprocessError):
            self._run("pg_ctl", "-D", data, "-m", "fast", "-w", "stop")


def sink_lines(n: int) -> bytes:
    """The sink runs' burst: ``v`` from 1, so that a record lost changes its key's sum."""
    return "".join(f'{{"key":"k{i % KEYS}","v":{i + 1}}}\n' for i in range(n)).encode()


def reference_sums(n: int) -> dict[str, int]:
    """Per key, the sum of its ``v`` over the burst: what the windows' rows add up to."""
    sums = {f"k{j}": 0 for j in range(min(n, KEYS))}
    for i in range(n):
        sums[f"k{i % KEYS}"] += i + 1
    return sums


def exact(rows: list[tuple[Any, ...]], n: int) -> bool:
    """Whether the table holds the burst's windows once each: one row per (key, 1 s
    window), and per key the values add up to the reference (the window boundaries
    follow the source's decode times, so the rows themselves are not fixed)."""
    cells = {(r[0], r[1]) for r in rows}
    sums: dict[str, int] = {}
    for key, start, end, value in rows:
        if end - start != WINDOW_MS:
            return False
        sums[key] = sums.get(key, 0) + int(value)
    return len(cells) == len(rows) and sums == reference_sums(n)


def sink_spec(name: str, topic: str, broker: Mosquitto, n: int, sink: dict[str, Any],
              exactly_once: bool, connector: str = "sql") -> dict[str, Any]:  # fmt: skip
    """mqtt (QoS 1, ``n`` records) on the first peer -> 1 s keyed window (sum of ``v``)
    and the sink (``connector``: sql or mqtt) on the second; checkpoints (erasure, an
    epoch a second) or none."""
    cp = {"mode": "erasure", "interval_ms": 1_000, "m": 1, "k": 1}
    return {
        "name": name,
        "checkpoint": cp if exactly_once else {"mode": "restart"},
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
        "operators": [
            {
                "id": "per_key",
                "op": "window",
                "params": {"size_ms": WINDOW_MS, "key": "key", "aggregate": "sum", "field": "v"},
                "inputs": ["burst"],
                "peer": site_name(1),
            }
        ],
        "sinks": [
            {
                "id": "out",
                "peer": site_name(1),
                "connector": connector,
                "params": sink,
                "inputs": ["per_key"],
            }
        ],
    }


class Consumer:
    """A plain MQTT 5 subscriber (paho, on its own thread) to the mqtt sink's topics:
    the rows it received, each id once (a message without an id, from a sink without
    checkpoints, is kept as it comes)."""

    def __init__(self, port: int, topic_filter: str) -> None:
        self.messages: list[tuple[bytes, str | None]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.client.on_connect = lambda client, *_: client.subscribe(topic_filter, qos=1)
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        if not self._subscribed.wait(20):
            msg = f"the bench's subscriber to {topic_filter} got no SUBACK"
            raise RuntimeError(msg)

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        props: Properties | None = getattr(msg, "properties", None)
        mid = dict(getattr(props, "UserProperty", []) or []).get(ID_PROPERTY)
        with self._lock:
            self.messages.append((bytes(msg.payload), mid))

    def rows(self) -> list[tuple[Any, ...]]:
        """``(key, window_start, window_end, value)`` of every message, each id once."""
        with self._lock:
            messages = list(self.messages)
        seen: set[str] = set()
        out = []
        for payload, mid in messages:
            if mid is not None:
                if mid in seen:
                    continue
                seen.add(mid)
            r = json.loads(payload)
            out.append((r["key"], r["window_start"], r["window_end"], r["value"]))
        return out

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def sink_run(
    cluster: LocalCluster,
    broker: Mosquitto,
    pg: Postgres | None,
    n: int,
    work: Path,
    database: str,
    exactly_once: bool,
) -> dict[str, Any]:
    """One run: publish the burst, poll the table until its values add up to the
    burst's (throughput: the burst over that time from the publish's start; latency:
    per row, when the poll first saw it minus its window's end), then the app's end."""
    mode = "exactly_once" if exactly_once else "at_most_once"
    name = f"{database}-{mode.replace('_', '-')}"
    table = f"windows_{database}_{mode}"  # not sqlite_*: reserved
    topic = f"{TOPIC}/{name}"
    consumer: Consumer | None = None
    if database == "postgresql":
        assert pg is not None
        sink: dict[str, Any] = {"url": pg.url, "password_env": PG_ENV, "table": table}
    elif database == "mqtt":
        out_topic = f"bench/out/{name}"
        sink = {"broker": f"127.0.0.1:{broker.port}", "topic": out_topic + "/{key}", "qos": 1}
        if exactly_once:
            sink["delivery"] = "exactly-once"
        consumer = Consumer(broker.port, out_topic + "/#")
    else:
        sink = {"table": table}
    connector = "mqtt" if database == "mqtt" else "sql"
    spec = sink_spec(name, topic, broker, n, sink, exactly_once, connector)
    path = work / f"{name}.json"
    path.write_text(json.dumps(spec))
    app = agiledart(cluster, "submit", str(path))["app_id"]

    s: dict[str, Any] = {}

    def ready() -> str | None:
        nonlocal s
        s = status(cluster, app)
        if s["state"] in ("failed", "stopped"):
            msg = f"{name}: the app ended {s['state']}: {s.get('error')}"
            raise RuntimeError(msg)
        subscribed = any(
            p["sources"].get("burst", {}).get("subscribed") for p in s["peers"].values()
        )
        out = [p["sinks"]["out"] for p in s["peers"].values() if "out" in p["sinks"]]
        return str(out[0]["path"] or "") if subscribed and out else None  # PostgreSQL: ""

    deadline = time.monotonic() + 60
    while (db_path := ready()) is None:
        if time.monotonic() > deadline:
            msg = f"{name}: the app's source did not subscribe within 60 s: {json.dumps(s)[:3000]}"
            raise RuntimeError(msg)
        time.sleep(STATUS_POLL_S)

    def rows() -> list[tuple[Any, ...]]:
        if consumer is not None:
            return consumer.rows()
        sql = f"SELECT key, window_start, window_end, value FROM {table}"
        if pg is not None and database == "postgresql":
            try:
                return pg.query(sql)
            except psycopg.errors.UndefinedTable:
                return []
        if not Path(db_path).exists():
            return []
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # no table yet (or locked a moment)
            return []
        finally:
            conn.close()

    total = sum(reference_sums(n).values())
    seen: dict[tuple[Any, Any, Any], float] = {}
    lines = sink_lines(n)
    published: list[float] = []

    def feed() -> None:
        publish(broker.port, topic, lines)
        published.append(time.time())  # mosquitto_pub exits once the broker acked all

    start = time.time()
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    complete: float | None = None
    checked = start
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = rows()
        now = time.time()
        for key, w_start, w_end, _ in got:
            seen.setdefault((key, w_start, w_end), now)
        if sum(int(r[3]) for r in got) >= total:
            complete = now
            break
        if now > checked + 3.0:  # a failed app ends the wait (a status costs a CLI call)
            checked = now
            if status(cluster, app)["state"] in ("failed", "stopped"):
                break
        time.sleep(0.1)
    feeder.join(timeout=60)
    burst_end = published[0] if published else time.time()
    # a window closes at its end, the last one (cut short by the burst's end) when the
    # burst was all published: latency is from then to the row first seen in the table
    latencies = [
        (at - min(w_end / 1000.0, burst_end)) * 1000.0 for (_, _, w_end), at in seen.items()
    ]
    deadline = time.monotonic() + 120
    while (s := status(cluster, app))["state"] not in ("finished", "failed"):
        if time.monotonic() > deadline:
            agiledart(cluster, "stop", app)
            break
        time.sleep(2 * STATUS_POLL_S)
    final = rows()
    if consumer is not None:
        consumer.close()
    if s["state"] != "finished":
        print(f"{name}: the app ended {s['state']}: {s.get('error')}", file=sys.stderr)
    out = next(p["sinks"]["out"] for p in s["peers"].values() if "out" in p["sinks"])
    elapsed = (complete or time.time()) - start
    (work / "tables").mkdir(exist_ok=True)
    (work / "tables" / f"{table}.json").write_text(json.dumps([list(r) for r in final]))
    (work / "status").mkdir(exist_ok=True)
    (work / "status" / f"{name}.json").write_text(json.dumps(s))  # the app's last status
    return {
        "sink": database,
        "mode": mode,
        "tps": n / max(elapsed, 1e-6) if complete else 0.0,
        "complete": complete is not None,
        "exact": exact(final, n),
        "rows": len(final),
        "p99_ms": statistics.quantiles(latencies, n=100, method="inclusive")[98]
        if len(latencies) > 1
        else None,
        "sink_write_p99_ms": out.get("latency_p99_ms"),
        "state": s["state"],
        "checkpoints": s.get("checkpoints"),
        "received": sum(
            p["sources"].get("burst", {}).get("received", 0) for p in s["peers"].values()
        ),
        "sink_records": s["totals"]["sink_records"],
    }


def sink_part(
    cluster: LocalCluster,
    broker: Mosquitto,
    pg: Postgres | None,
    n: int,
    work: Path,
    sinks: list[str],
    together: bool = False,
) -> dict[str, Any]:
    """Every sink each way, exactly-once first (``together``: every run at once, a
    check of the output rather than a measure); the JSON keys of the sink part."""
    result: dict[str, Any] = {"sink_records": n, "sinks_measured": sinks}
    ratios: list[float] = []
    exact_all = True
    cases = [(database, eo) for database in sinks for eo in (True, False)]
    done: dict[tuple[str, bool], dict[str, Any]] = {}
    if together:
        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            futures = {c: pool.submit(sink_run, cluster, broker, pg, n, work, *c) for c in cases}
            done = {c: f.result() for c, f in futures.items()}
    for database in sinks:
        runs = {}
        for exactly_once in (True, False):
            r = done.get((database, exactly_once)) or sink_run(
                cluster, broker, pg, n, work, database, exactly_once
            )
            runs[r["mode"]] = r
            exact_all = exact_all and r["exact"] and r["complete"]
            p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:,.0f} ms"
            print(
                f"{database} {r['mode']}: {r['tps']:,.0f} records/s, p99 {p99} to the table "
                f"({r['rows']} rows, exact {r['exact']}, {r['state']}, source received "
                f"{r['received']}/{n}, sink records {r['sink_records']}, "
                f"checkpoints {r['checkpoints']})",
                file=sys.stderr,
            )
        eo, amo = runs["exactly_once"], runs["at_most_once"]
        result[f"{database}_exactly_once_tps"] = round(eo["tps"])
        result[f"{database}_at_most_once_tps"] = round(amo["tps"])
        result[f"{database}_p99_ms"] = _ms(eo["p99_ms"])
        result[f"{database}_at_most_once_p99_ms"] = _ms(amo["p99_ms"])
        result[f"{database}_sink_write_p99_ms"] = _ms(eo["sink_write_p99_ms"])
        result[f"{database}_at_most_once_sink_write_p99_ms"] = _ms(amo["sink_write_p99_ms"])
        result[f"{database}_rows"] = eo["rows"]
        if amo["tps"] > 0:
            ratios.append(eo["tps"] / amo["tps"])
    result["exactly_once_vs_at_most_once"] = round(min(ratios), 3) if ratios else None
    result["sink_tables_exact"] = exact_all
    return result


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=10_000, help="messages per burst")
    parser.add_argument("--rounds", type=int, default=1, help="bursts each way")
    parser.add_argument(
        "--sinks",
        default=",".join(SINKS),
        help="sink pipelines to measure, comma-separated (sqlite, postgresql, mqtt); '' for none",
    )
    parser.add_argument("--records", type=int, default=20_000, help="records per sink run")
    parser.add_argument("--sinks-only", action="store_true", help="skip the ingest part")
    parser.add_argument(
        "--together",
        action="store_true",
        help="run the sink pipelines all at once (a quick check: they share the CPU)",
    )
    parser.add_argument(
        "--keep", type=Path, help="work in this folder and keep it (tables/ holds each table)"
    )
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)
    sinks = [x.strip() for x in args.sinks.split(",") if x.strip()]
    unknown = sorted(set(sinks) - set(SINKS))
    if unknown:
        parser.error(f"unknown sinks {unknown}: choose among {', '.join(SINKS)}")
    if args.sinks_only and not sinks:
        parser.error("--sinks-only needs at least one sink")
    n = args.burst
    subs: list[float] = []
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            work = args.keep.resolve()
        else:
            work = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-connectors-"))
            )
        pg: Postgres | None = None
        if "postgresql" in sinks:
            # its own folder in /tmp: the ``postgres`` user reaches no folder of root's
            pg_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pg-")))
            pg = Postgres(pg_dir)
            stack.callback(pg.close)
            os.environ[PG_ENV] = PG_PASSWORD  # before the peers start: they inherit it
        broker = Mosquitto(work)
        try:
            (work / "site").mkdir()
            with LocalCluster(2, port=free_port(), workdir=work / "site") as cluster:
                asyncio.run(cluster.wait_formed())
                for run in range(0 if args.sinks_only else args.rounds):
                    rate, got = anchor(broker, n, work)
                    subs.append(rate)
                    row = engine(cluster, broker, n, work, run)
                    rows.append(row)
                    print(
                        f"round {run}: mosquitto_sub {rate:,.0f}/s ({got}/{n}), engine "
                        f"{row['msgs_per_s']:,.0f}/s ({row['received']}/{n}, shed {row['shed']})",
                        file=sys.stderr,
                    )
                if sinks:
                    result.update(
                        sink_part(cluster, broker, pg, args.records, work, sinks, args.together)
                    )
            dropped = broker.dropped()
        finally:
            broker.close()
    if rows:
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
            **result,
        }
    if sinks:
        result["sinks_together"] = args.together
    result["broker_dropped_warnings"] = dropped
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
