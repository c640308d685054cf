#!/usr/bin/env python3
"""Throughput of ``agiledart analyze`` (issues 9, 27): trace rows per second on local[2],
on local[1], and how the rate scales from one core to two.

Writes ``--rows`` trace lines (default 10 million) of a realistic mix, straight as
NDJSON text (string formatting over numpy columns, no json.dumps per line): about 45%
``tuple``, 25% ``shuffle``, 15% ``delivery``, 10% ``opstats`` and the rest
``scaling``, ``checkpoint``, ``peer``, ``scheduler``, ``recovery`` and ``placement``,
spread over 8 peer folders and files of at most 1 million lines, each starting with a
``meta`` line. Then it runs the whole analysis (every table, plot and the report) in a
Spark session started beforehand, and reports rows per second next to the anchor, the
issue's target of 200,000 rows/s. ``startup_s`` (the Spark session) and ``write_s``
(making the data) are reported apart and not counted.

Then the same traces are analyzed again on ``local[1]``, in a process of its own (a
cold JVM, as the first run's): ``rows_per_s_local1`` and ``scaling_efficiency`` = rate
on two cores / (2 x rate on one), with that run's ``read_s`` and ``jobs_s`` as
``local1_read_s`` and ``local1_jobs_s`` (reading is one Python task per core; the jobs
are mostly the driver's planning, which on ``local[1]`` has the second core to
itself). While each analysis runs, the resident memory of every executor's process
tree (its JVM and its Python workers; in local mode the executor is the driver's JVM)
is sampled every 0.2 s: ``peak_executor_mb`` is the largest, over both runs.
``single_task_sections`` counts the sections whose every Spark stage ran as one task
in the main run (0 when every section is computed over partitions; on ``local[1]``
Spark packs small inputs into one partition, which is not counted).

A shared machine's speed moves from one minute to the next (the same analysis: 72 to
92 CPU-seconds within an hour here), and the efficiency divides two runs' rates. With
``--repeat N`` each of ``local[2]`` and ``local[1]`` analyzes N times, alternating, each
run in a cold JVM (the first ``local[2]`` run as above): ``rows_per_s`` and
``rows_per_s_local1`` are then the medians, every run's rate is listed in
``rows_per_s_runs`` and ``rows_per_s_local1_runs`` (and each pair's efficiency in
``scaling_efficiency_runs``), and the other figures are the first pair's.

What the machine allows, in the same run: ``parse_scaling_efficiency`` is the
reader's own work without Spark (:func:`~agiledart.analysis.parse.write_piece` over up
to :data:`ANCHOR_PIECES` pieces of the traces) done by one process, then split between
two processes at once: time alone / (2 x time of the slower of the two), the median
of ``--repeat`` measurements. Reading is the part of the analysis that scales, and
the analysis's reading (``read_scaling_efficiency`` = ``local1_read_s`` / (2 x
``read_s``), medians with ``--repeat``) can hardly scale better than the machine lets
the reader's work; while the jobs after it do not scale, ``scaling_efficiency`` stays
below the reading's.
With ``--one-cpu``, ``local[1]`` is also analyzed in a process bound to one CPU (its
driver, JVM and Python workers: what a one-core machine has), as many times as the
other masters: ``rows_per_s_one_cpu`` and ``scaling_efficiency_one_cpu`` = rate on two
cores / (2 x that rate). The issue's ``scaling_efficiency`` keeps ``local[1]`` as Spark
runs it, its driver free to use the second core.

With ``--warm``, every run on ``local[2]`` and ``local[1]`` analyzes the traces a
second time in the same session, after the first (its JVM warm: classes loaded, Spark
SQL's session state made, code compiled): ``rows_per_s_warm``,
``rows_per_s_local1_warm`` (medians; every run's in ``..._runs``) and
``scaling_efficiency_warm``, what a long-lived session (a notebook, a ``spark-submit``
job that analyzes several directories) gets from the second analysis on. The other
figures stay the first, cold, analysis's.

A second anchor, measured in the same session after the analysis (its JIT warm):
``parse_rows_per_s``, Spark's JSON source parsing every line against the explicit
union schema and nothing else (the ``noop`` sink): what reading alone would cost with
Spark's own reader, which the analysis used before it parsed with Arrow
(:mod:`agiledart.analysis.parse`).

    python scripts/bench_analyze.py [--rows N] [--json] [--dir DIR] [--keep] [--no-local1]
        [--repeat N] [--one-cpu] [--warm]

``cpu_s`` is the CPU time the analysis took (the driver, the local JVM and its Python
workers; in local mode only), next to the machine's ``load`` average at the end: on a
shared machine the wall-clock rates move with the load, the CPU time much less. The
same, per phase of the first run on each master: ``read_cpu_s`` and ``jobs_cpu_s``
(``local1_...`` on ``local[1]``), and the cores each phase kept busy on average,
``read_cores`` and ``jobs_cores`` (CPU time / wall-clock time; ``local1_...``). A phase
that keeps as many cores busy on ``local[1]`` as on ``local[2]`` is work a second task
slot does not shorten.

With ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ANCHOR_ROWS_PER_S = 200_000
#: pieces of the traces the machine's scaling anchor parses (the largest first)
ANCHOR_PIECES = 16
PEERS = 8
FILE_LINES = 1_000_000
CHUNK = 500_000
T0 = 1_767_225_600_000.0  # 2026-01-01, ms
SECONDS = 600.0
POLICIES = ("agiledart", "end-to-end", "next-hop")
MIX = (
    ("tuple", 0.45),
    ("shuffle", 0.25),
    ("delivery", 0.15),
    ("opstats", 0.10),
    ("scaling", 0.02),
    ("checkpoint", 0.01),
    ("peer", 0.01),
    ("scheduler", 0.005),
    ("recovery", 0.004),
    ("placement", 0.001),
)


def _head(kind: str, ts: np.ndarray, peer: np.ndarray) -> list[str]:
    return [
        f'{{"v":1,"type":"{kind}","ts":{t:.3f},"peer":"peer-{p}"'
        for t, p in zip(ts.tolist(), peer.tolist(), strict=True)
    ]


def _lines(
    kind: str, ts: np.ndarray, peer: np.ndarray, first: int, rng: np.random.Generator
) -> list[str]:
    """Lines of record type ``kind`` at times ``ts`` by ``peer``; ``first`` numbers them."""
    n = len(ts)
    head = _head(kind, ts, peer)
    i = np.arange(first, first + n).tolist()
    if kind == "tuple":
        lat = rng.gamma(2.0, 8.0, n).round(3).tolist()
        app = rng.integers(0, 3, n).tolist()
        body = [
            f',"app":"app-{a}","sink":"out","trace_id":{k},"source_ts":{t - x:.3f},'
            f'"sink_ts":{t:.3f},"latency_ms":{x}}}'
            for a, k, t, x in zip(app, i, ts.tolist(), lat, strict=True)
        ]
    elif kind == "shuffle":
        hop = rng.integers(0, 6, n).tolist()
        ok = rng.random(n) < 0.7
        pol = rng.integers(0, len(POLICIES), n).tolist()
        body = [
            f',"app":"app-0","packet":"{k // 5}","origin":"n0","dest":"n24","hop":{h},'
            f'"node":"n{h}","next":"n{h + 1}","outcome":"{"ok" if o else "lost"}",'
            f'"delay_ms":10.0,"policy":"{POLICIES[p]}","graph":"road-25","tau":{k // 5 + 1},'
            f'"omega":null,"j":null}}'
            for k, h, o, p in zip(i, hop, ok.tolist(), pol, strict=True)
        ]
    elif kind == "delivery":
        delay = (rng.geometric(0.2, n) * 50.0).tolist()
        route = rng.integers(0, 4, n).tolist()
        body = [
            f',"app":"app-0","packet":"{k}","origin":"n0","dest":"n24",'
            f'"k":{k // 3 + 1},"path":["n0","n{r + 1}","n{r + 7}","n24"],"attempts":{d / 10.0:.0f},'
            f'"delay_ms":{d},"optimal_ms":{150.0 + 30.0 * (k % 3)},'
            f'"policy":"{POLICIES[k % 3]}","graph":"road-25"}}'
            for k, d, r in zip(i, delay, route, strict=True)
        ]
    elif kind == "opstats":
        op = rng.integers(0, 6, n).tolist()
        body = [
            f',"app":"app-{o % 3}","operator":"op-{o}","records_in":{k * 40},'
            f'"records_out":{k * 38},"rate_in":{40.0 + o},"queue":{k % 17},'
            f'"utilization":{(k % 10) / 10.0},"service_us":12.5}}'
            for k, o in zip(i, op, strict=True)
        ]
    elif kind == "scaling":
        body = [
            f',"app":"app-0","operator":"op-{k % 6}","health":{0.5 + (k % 50) / 100.0},'
            f'"instances":{1 + k % 4},"target":{1 + (k + 1) % 4},"decision":"up"}}'
            for k in i
        ]
    elif kind == "checkpoint":
        body = [
            f',"app":"app-{k % 3}","epoch":{k},"bytes":{4096 + k % 1000},'
            f'"duration_ms":{5.0 + k % 7},"m":3,"k":2,"committed":true}}'
            for k in i
        ]
    elif kind == "peer":
        body = [
            f',"event":"{("joined", "suspected", "dead")[k % 3]}","subject":"peer-{k % PEERS}",'
            f'"node_id":"{k:040x}","zone":"z{k % 2}"}}'
            for k in i
        ]
    elif kind == "scheduler":
        body = [
            f',"zone":"z{k % 2}","scheduler":"peer-{k % 4}","event":"elected","apps":{k % 5}}}'
            for k in i
        ]
    elif kind == "recovery":
        body = [
            f',"app":"app-{k % 3}","dead_peer":"peer-{k % PEERS}","epoch":{k},'
            f'"phase":"{("detected", "restored", "resumed")[k % 3]}","duration_ms":{k % 90},'
            f'"operators":["op-1","op-2"]}}'
            for k in i
        ]
    elif kind == "placement":
        body = [
            f',"app":"app-{k % 3}","name":"app","strategy":"agiledart",'
            f'"placement":{{"op-1":["peer-{k % PEERS}"],"op-2":["peer-{(k + 1) % PEERS}"]}},'
            f'"paths":[["peer-0","peer-{k % PEERS}"]]}}'
            for k in i
        ]
    else:
        raise AssertionError(kind)
    return [h + b + "\n" for h, b in zip(head, body, strict=True)]


class _Files:
    """One open trace file per peer folder, rotated every :data:`FILE_LINES` lines."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[int, tuple[Any, int, int]] = {}  # peer -> (file, index, lines)
        self.lines = 0

    def write(self, peer: int, line: str) -> None:
        fh, index, lines = self.files.get(peer, (None, 0, FILE_LINES))
        if lines >= FILE_LINES:
            if fh is not None:
                fh.close()
            index += 1
            folder = self.directory / f"peer-{peer}"
            folder.mkdir(parents=True, exist_ok=True)
            fh = (folder / f"trace-{index:06d}.ndjson").open("w")
            fh.write(
                f'{{"v":1,"type":"meta","ts":{T0},"peer":"peer-{peer}","schema":1,'
                f'"version":"bench","node_id":null,"zone":"z{peer % 2}"}}\n'
            )
            lines = 1
            self.lines += 1
        fh.write(line)
        self.files[peer] = (fh, index, lines + 1)
        self.lines += 1

    def close(self) -> None:
        for fh, _, _ in self.files.values():
            fh.close()


def write_traces(directory: Path, rows: int, seed: int = 0) -> int:
    """Write about ``rows`` lines (meta lines included) under ``directory``; return the count.

    Made a chunk of :data:`CHUNK` lines at a time, each chunk a later slice of the
    trace's time, so memory stays small and every file is in time order.
    """
    rng = np.random.default_rng(seed)
    chunks = max(1, -(-rows // CHUNK))
    span = SECONDS * 1000.0 / chunks
    first = dict.fromkeys((kind for kind, _ in MIX), 0)
    out = _Files(directory)
    try:
        for c in range(chunks):
            size = min(CHUNK, rows - c * CHUNK)
            times, peers, lines = [], [], []
            for kind, share in MIX:
                n = max(1, round(size * share))
                ts = np.sort(T0 + (c + rng.random(n)) * span)
                peer = rng.integers(0, PEERS, n)
                lines += _lines(kind, ts, peer, first[kind], rng)
                first[kind] += n
                times.append(ts)
                peers.append(peer)
            order = np.argsort(np.concatenate(times), kind="stable").tolist()
            peer_of = np.concatenate(peers).tolist()
            for j in order:
                out.write(peer_of[j], lines[j])
    finally:
        out.close()
    return out.lines


def _parse_only(spark: Any, traces: Path) -> float:
    """Seconds Spark's JSON source takes to parse every line of ``traces`` against the
    analysis's explicit schema, writing nothing (the ``noop`` sink)."""
    from agiledart.analysis.reader import json_lines
    from agiledart.traces.writer import trace_files

    started = time.perf_counter()
    json_lines(spark, trace_files(traces)).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def _parse_share(traces: str, share: int, shares: int, target: str, ready: Any, out: Any) -> None:
    """Parse every ``shares``-th of the anchor's pieces of ``traces`` (from the
    ``share``-th) as the reader's tasks do, into ``target``, once every process sharing
    the work is ready (imported, its pieces chosen); put the seconds it took in ``out``."""
    from agiledart.analysis.parse import pieces, write_piece
    from agiledart.analysis.partials import Windows
    from agiledart.traces.writer import trace_files

    chosen = sorted(pieces(trace_files(Path(traces))), key=lambda p: (-_span(p), p.path))
    mine = [(n, p) for n, p in enumerate(chosen[:ANCHOR_PIECES]) if n % shares == share]
    windows = Windows(T0, 1000.0)
    Path(target).mkdir(parents=True)
    ready.wait(timeout=300)
    started = time.perf_counter()
    for n, piece in mine:
        write_piece(n, piece, target, windows)
    out.put(time.perf_counter() - started)


def _span(piece: Any) -> int:
    return int(piece.end - piece.start) if piece.end >= 0 else Path(piece.path).stat().st_size


def parse_scaling(traces: Path) -> float:
    """The machine's anchor for the analysis's scaling: the reader's work done by one
    process, then split between two that start it together; time alone / (2 x the
    slower half)."""
    from multiprocessing import get_context

    spawn = get_context("spawn")

    def slowest(shares: int, scratch: str) -> float:
        ready, out = spawn.Barrier(shares), spawn.Queue()
        procs = [
            spawn.Process(
                target=_parse_share,
                args=(str(traces), k, shares, f"{scratch}/{shares}-{k}", ready, out),
            )
            for k in range(shares)
        ]
        for proc in procs:
            proc.start()
        try:
            # a process that failed never puts: its partner's barrier breaks, and this waits
            # no longer than that
            took = [out.get(timeout=900) for _ in procs]
        finally:
            for proc in procs:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.terminate()
        return max(took)

    with tempfile.TemporaryDirectory(prefix="bench-pieces-") as scratch:
        return slowest(1, scratch) / (2 * slowest(2, scratch))


_EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return out


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of its children it has waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(children: dict[int, list[int]] | None = None) -> float:
    """CPU seconds used so far by this process and every process under it (the local
    JVM, its Python workers): unlike the wall-clock time, it barely moves with what
    else the machine runs. ``children``: a :func:`_children` read already."""
    return sum(_cpu_s(p) for p in _tree(os.getpid(), children or _children()))


def _tree(pid: int, children: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _executors(children: dict[int, list[int]]) -> list[int]:
    """The executors' processes: a cluster's executor JVMs, or (local mode) the JVMs
    this process started."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if _EXECUTOR.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found or children.get(os.getpid(), [])


class PeakMemory:
    """Samples, every 0.2 s on a thread, the resident memory of each executor's process
    tree (:attr:`peak_mb` is the largest sum seen) and the CPU seconds this process's
    tree has used (:attr:`cpu`, with the time of each sample: :func:`phase_cpu_s`)."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self.cpu: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self.cpu.append((time.perf_counter(), tree_cpu_s()))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu.append((time.perf_counter(), tree_cpu_s()))

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            children = _children()
            for pid in _executors(children):
                used = sum(_rss_mb(p) for p in _tree(pid, children))
                self.peak_mb = max(self.peak_mb, used)
            self.cpu.append((time.perf_counter(), tree_cpu_s(children)))


def _cpu_at(samples: list[tuple[float, float]], at: float) -> float:
    """The CPU seconds used by ``at``, read between the two samples around it."""
    before = max((s for s in samples if s[0] <= at), default=samples[0])
    after = min((s for s in samples if s[0] >= at), default=samples[-1])
    if after[0] <= before[0]:
        return before[1]
    share = (at - before[0]) / (after[0] - before[0])
    return before[1] + share * (after[1] - before[1])


def phase_cpu_s(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """CPU seconds used between ``start`` and ``end`` by the sampled process tree."""
    return max(0.0, _cpu_at(samples, end) - _cpu_at(samples, start))


#: the figures of each phase of the first ``local[1]`` run, reported as ``local1_<key>``
LOCAL1_PHASES = ("read_s", "jobs_s", "read_cpu_s", "jobs_cpu_s", "read_cores", "jobs_cores")


def _cores(cpu_s: float | None, seconds: float | None) -> float | None:
    """Cores kept busy on average: CPU seconds over wall-clock seconds."""
    return None if cpu_s is None or not seconds else round(cpu_s / seconds, 2)


def _median(values: list[Any]) -> Any:
    """The median of ``values``, or None for none."""
    return statistics.median(values) if values else None


def _efficiency(two: float | None, one: float | None) -> float | None:
    """``two / (2 x one)``, rounded (None without a positive ``one``)."""
    return None if two is None or one is None or one <= 0 else round(two / (2 * one), 3)


def rates(
    twos: list[int],
    ones: list[int],
    pinned: list[int],
    read_twos: list[float],
    read_ones: list[float],
    machine: float | None,
) -> dict[str, Any]:
    """The rates and efficiencies of the report from every run's figures, in the order
    the runs alternated: rows/s on ``local[2]`` (``twos``), ``local[1]`` (``ones``) and
    ``local[1]`` on one CPU (``pinned``), the reading's seconds on the first two, and
    the machine's anchor."""
    rate = round(statistics.median(twos))
    rate1 = round(statistics.median(ones)) if ones else None
    rate_one_cpu = round(statistics.median(pinned)) if pinned else None
    return {
        "rows_per_s": rate,
        "anchor_rows_per_s": ANCHOR_ROWS_PER_S,
        "rows_per_s_local1": rate1,
        "scaling_efficiency": _efficiency(rate, rate1),
        "rows_per_s_runs": twos,
        "rows_per_s_local1_runs": ones,
        # each pair's own (its two runs one after the other)
        "scaling_efficiency_runs": [
            _efficiency(two, one) for two, one in zip(twos, ones, strict=False)
        ],
        # seconds, not rates: one core's over twice two cores'
        "read_scaling_efficiency": _efficiency(_median(read_ones), _median(read_twos)),
        "parse_scaling_efficiency": None if machine is None else round(machine, 3),
        "rows_per_s_one_cpu": rate_one_cpu,
        "scaling_efficiency_one_cpu": _efficiency(rate, rate_one_cpu),
        "rows_per_s_one_cpu_runs": pinned,
    }


def warm_rates(twos: list[int], ones: list[int]) -> dict[str, Any]:
    """The figures of ``--warm`` from the second analyses' rows/s on ``local[2]``
    (``twos``) and ``local[1]`` (``ones``), None without them."""
    two, one = _median(twos), _median(ones)
    return {
        "rows_per_s_warm": None if two is None else round(two),
        "rows_per_s_local1_warm": None if one is None else round(one),
        "scaling_efficiency_warm": _efficiency(two, one),
        "rows_per_s_warm_runs": twos,
        "rows_per_s_local1_warm_runs": ones,
    }


def _one_cpu() -> None:
    """Bind this process (and what it starts) to the first CPU it may run on."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _cold(
    traces: Path,
    conf: list[str],
    master: str = "local[1]",
    *,
    one_cpu: bool = False,
    warm: bool = False,
) -> dict[str, Any]:
    """The analysis of ``traces`` on ``master``, in a process (and a JVM) of its own;
    with ``one_cpu``, bound to one CPU; with ``warm``, followed by a second one in the
    same session (``rows_per_s_warm``)."""
    settings = [a for kv in conf for a in ("--conf", kv)]
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--traces",
            str(traces),
            "--master",
            master,
            "--json",
            "--no-local1",
            "--no-parse",
            *(["--warm"] if warm else []),
            *settings,
        ],
        check=True,
        capture_output=True,
        text=True,
        preexec_fn=_one_cpu if one_cpu else None,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="trace lines to analyze")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--dir", type=Path, help="write the traces here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the traces and the report")
    parser.add_argument("--master", help="Spark master (default local[2])")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-local1", action="store_true", help="skip the local[1] run")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="analyze N times on local[2] and on local[1], alternating, each in a cold JVM; "
        "the rates are the medians (default 1)",
    )
    parser.add_argument(
        "--one-cpu",
        action="store_true",
        help="also analyze on local[1] bound to one CPU (rows_per_s_one_cpu)",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="also analyze a second time in each run's session, its JVM warm (rows_per_s_warm)",
    )
    parser.add_argument("--no-parse", action="store_true", help="skip the parsing anchor")
    parser.add_argument(
        "--traces", type=Path, help="analyze these traces instead of writing new ones"
    )
    args = parser.parse_args()

    from agiledart.analysis import analyze
    from agiledart.analysis.session import LOCAL_DEFAULTS, spark_session

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-analyze-"))
    traces, out = work / "traces", work / "report"
    try:
        started = time.perf_counter()
        if args.traces is not None:
            traces = args.traces
            rows = sum(1 for f in traces.rglob("trace-*.ndjson") for _ in f.open("rb"))
        else:
            rows = write_traces(traces, args.rows, args.seed)
        write_s = time.perf_counter() - started
        size = sum(f.stat().st_size for f in traces.rglob("*.ndjson"))
        print(f"wrote {rows} lines ({size / 1e6:.0f} MB) in {write_s:.1f} s", file=sys.stderr)
        started = time.perf_counter()
        conf = dict(kv.split("=", 1) for kv in args.conf)
        if args.master is not None and args.master.startswith("local"):
            conf = {**LOCAL_DEFAULTS, **conf}
        with spark_session(args.master, conf) as spark:
            startup_s = time.perf_counter() - started
            started, cpu_started = time.perf_counter(), tree_cpu_s()
            with PeakMemory() as memory:
                result = analyze(traces, out, spark=spark)
            seconds = time.perf_counter() - started
            cpu_s = tree_cpu_s() - cpu_started
            read_at = started + result.timings["read_s"]
            phases = {
                "read_cpu_s": phase_cpu_s(memory.cpu, started, read_at),
                "jobs_cpu_s": phase_cpu_s(memory.cpu, read_at, read_at + result.timings["jobs_s"]),
            }
            warm: dict[str, list[int]] = {"two": [], "one": []}
            if args.warm:
                again_at = time.perf_counter()
                analyze(traces, out, spark=spark)
                warm["two"].append(round(rows / (time.perf_counter() - again_at)))
            parse_s = None if args.no_parse else _parse_only(spark, traces)
        print(f"analyzed {result.lines} lines in {seconds:.1f} s", file=sys.stderr)
        twos, ones, pinned, peaks = [round(rows / seconds)], [], [], [memory.peak_mb]
        reads: dict[str, list[float]] = {"two": [result.timings["read_s"]], "one": []}
        one = None if args.no_local1 else _cold(traces, args.conf, warm=args.warm)
        if one is not None:
            warm["one"] += one["rows_per_s_warm_runs"]
            ones.append(one["rows_per_s"])
            reads["one"].append(one["read_s"])
            peaks.append(one["peak_executor_mb"])
            for n in range(1, args.repeat + 1):
                if n > 1:
                    print(f"run {n} of {args.repeat} on local[2] and local[1]", file=sys.stderr)
                    for runs, key, master in (
                        (twos, "two", args.master or "local[2]"),
                        (ones, "one", "local[1]"),
                    ):
                        again = _cold(traces, args.conf, master, warm=args.warm)
                        runs.append(again["rows_per_s"])
                        warm[key] += again["rows_per_s_warm_runs"]
                        reads[key].append(again["read_s"])
                        peaks.append(again["peak_executor_mb"])
                if args.one_cpu:
                    print(f"run {n} of {args.repeat} on local[1], one CPU", file=sys.stderr)
                    pinned.append(_cold(traces, args.conf, one_cpu=True)["rows_per_s"])
        # the machine's anchor, as many times as the analysis pairs (the median)
        machine = None
        if not args.no_local1:
            print("the reader's work alone and halved, without Spark", file=sys.stderr)
            machine = statistics.median(parse_scaling(traces) for _ in range(args.repeat))
        report: dict[str, Any] = {
            **rates(twos, ones, pinned, reads["two"], reads["one"], machine),
            **warm_rates(warm["two"], warm["one"]),
            "read_cpu_s": round(phases["read_cpu_s"], 2),
            "jobs_cpu_s": round(phases["jobs_cpu_s"], 2),
            "read_cores": _cores(phases["read_cpu_s"], result.timings["read_s"]),
            "jobs_cores": _cores(phases["jobs_cpu_s"], result.timings["jobs_s"]),
            # the first local[1] run's phases, as its own report has them
            **{f"local1_{key}": None if one is None else one[key] for key in LOCAL1_PHASES},
            "peak_executor_mb": round(max(peaks), 1),
            "single_task_sections": result.single_task_sections,
            "section_tasks": result.tasks,
            "parse_rows_per_s": None if parse_s is None else round(rows / parse_s),
            "rows": rows,
            "seconds": round(seconds, 2),
            "cpu_s": round(cpu_s, 2),
            "load": [round(x, 2) for x in os.getloadavg()],
            **result.timings,
            "startup_s": round(startup_s, 2),
            "write_s": round(write_s, 2),
            "megabytes": round(size / 1e6, 1),
            "malformed": result.malformed_total,
            "master": args.master or "local[2]",
            "cpus": os.cpu_count(),
        }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"{report['rows_per_s']} rows/s (target {ANCHOR_ROWS_PER_S}; local[1] "
        f"{report['rows_per_s_local1']}; parsing alone {report['parse_rows_per_s']})"
    )
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
