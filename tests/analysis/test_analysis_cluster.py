"""``agiledart analyze --master spark://...`` on a real standalone cluster (a master and
two 1-core workers started from pyspark's ``bin/spark-class`` on loopback) whose
executors are given Spark's smallest memories (512 MB of JVM heap, 512 MB of address
space per Python worker): it completes, with the same tables as ``local[2]``, every
section over more than one partition, and the latency figures of plain Python. One run
of the command serves both tests (each run costs a driver's and two executors' JVMs)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agiledart.analysis import analyze

from .cluster import Cluster, standalone_cluster
from .traces import percentile_fits, read_csv

pytestmark = [pytest.mark.processes, pytest.mark.timeout(900)]

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench_analyze.py"
#: 90,000 tuples over 8 peers' files: every section's scans span several partitions
ROWS = 200_000
SMALL = {"spark.executor.memory": "512m", "spark.executor.pyspark.memory": "512m"}


def _write_traces(directory: Path, rows: int) -> int:
    spec = importlib.util.spec_from_file_location("bench_analyze", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written: int = module.write_traces(directory, rows)
    return written


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


def _analyze_on(cluster: Cluster, traces: Path, out: Path, conf: dict[str, str]) -> None:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    settings = [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "agiledart"),
            "analyze",
            str(traces),
            "--out",
            str(out),
            "--master",
            cluster.master,
            *settings,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=800,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _cell(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _same(a: str, b: str) -> bool:
    x, y = _cell(a), _cell(b)
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(x) and math.isnan(y))
    return x == y


@pytest.fixture(scope="module")
def small_run(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, Path]:
    """One analysis on the cluster with Spark's smallest executors, which both tests
    read (a run of the command costs a driver's and two executors' JVMs and every
    section's queries): the traces, their lines, and the report's folder."""
    work = tmp_path_factory.mktemp("small")
    traces = work / "traces"
    lines = _write_traces(traces, ROWS)
    _analyze_on(cluster, traces, work / "cluster", SMALL)
    return traces, lines, work / "cluster"


def test_a_standalone_cluster_computes_the_tables_of_local_mode(
    small_run: tuple[Path, int, Path], spark: Any, tmp_path: Path
) -> None:
    traces, _, cluster_out = small_run
    local = analyze(traces, tmp_path / "local", spark=spark)
    tables = sorted(p.name for p in (tmp_path / "local" / "tables").glob("*.csv"))
    assert tables == sorted(p.name for p in (cluster_out / "tables").glob("*.csv"))
    assert len(tables) >= 25
    for name in tables:
        mine = read_csv(tmp_path / "local" / "tables" / name)
        theirs = read_csv(cluster_out / "tables" / name)
        assert len(mine) == len(theirs), name
        for row, other in zip(mine, theirs, strict=True):
            assert row.keys() == other.keys(), name
            assert all(_same(row[k], other[k]) for k in row), (name, row, other)
    summary = json.loads((cluster_out / "summary.json").read_text())
    assert set(summary["section_tasks"]) == set(local.tasks)
    assert all(n > 1 for n in summary["section_tasks"].values())
    assert set(local.tasks) == {s.key for s in local.sections if not s.empty} - {
        "overview",
        "malformed",
    }
    assert local.single_task_sections == 0
    assert not (cluster_out / ".records").exists()


def test_small_executors_complete_the_analysis_over_partitions(
    small_run: tuple[Path, int, Path],
) -> None:
    traces, lines, out = small_run
    latencies: dict[str, list[float]] = defaultdict(list)
    for path in traces.rglob("*.ndjson"):
        with path.open() as fh:
            for line in fh:
                if '"type":"tuple"' in line:
                    record = json.loads(line)
                    latencies[record["app"]].append(record["latency_ms"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lines"] == lines
    assert summary["records"]["tuple"] == sum(len(v) for v in latencies.values())
    rows = {r["app"]: r for r in read_csv(out / "tables" / "latency_summary.csv")}
    assert set(rows) == set(latencies)
    for app, values in latencies.items():
        assert int(rows[app]["count"]) == len(values)
        for q in (50, 95, 99):
            assert percentile_fits(rows[app][f"p{q}_ms"], values, q / 100)
    assert all(n > 1 for n in summary["section_tasks"].values())
