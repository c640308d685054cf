"""scripts/bench_analyze.py keeps its output contract (a quick run: 20,000 lines, once
on each master), with the local[1] run, the scaling efficiencies and the machine's
anchor for them, the executors' peak memory and the sections that ran as one task
(none), and with ``--warm`` each master's second analysis in its session; ``--repeat``
reports medians and each pair's efficiency; ``--one-cpu`` binds its local[1] runs to
one CPU. (Each more run is a cold JVM: the medians and the binding
are tested on their own.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the analysis extra is not installed")
pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_analyze.py"


def test_a_quick_run_reports_rows_per_second_beside_its_anchors() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "20000", "--json", "--warm"],
        check=True,
        capture_output=True,
        text=True,
        timeout=580,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rows"] >= 20_000
    assert report["malformed"] == 0
    # one run on each master: the medians are those runs' rates
    assert report["rows_per_s_runs"] == [report["rows_per_s"]]
    assert report["rows_per_s"] == pytest.approx(report["rows"] / report["seconds"], rel=0.01)
    assert report["rows_per_s_local1_runs"] == [report["rows_per_s_local1"]]
    assert report["local1_read_s"] > 0
    assert report["local1_jobs_s"] > 0
    assert report["anchor_rows_per_s"] == 200_000
    assert report["parse_rows_per_s"] > 0
    for key in ("read_s", "jobs_s", "report_s"):
        assert report[key] >= 0, key
    assert report["rows_per_s_local1"] > 0
    assert report["scaling_efficiency"] == pytest.approx(
        report["rows_per_s"] / (2 * report["rows_per_s_local1"]), abs=0.002
    )
    # --warm: a second analysis in each master's session, the first figures unchanged
    assert len(report["rows_per_s_warm_runs"]) == 1
    assert len(report["rows_per_s_local1_warm_runs"]) == 1
    assert report["rows_per_s_warm"] == report["rows_per_s_warm_runs"][0] > 0
    assert report["rows_per_s_local1_warm"] == report["rows_per_s_local1_warm_runs"][0] > 0
    assert report["scaling_efficiency_warm"] == pytest.approx(
        report["rows_per_s_warm"] / (2 * report["rows_per_s_local1_warm"]), abs=0.002
    )
    # without --one-cpu
    assert report["rows_per_s_one_cpu"] is None
    assert report["scaling_efficiency_one_cpu"] is None
    assert report["rows_per_s_one_cpu_runs"] == []
    # ratios of two timings each: positive, and not past what two cores can give by much
    for key in ("read_scaling_efficiency", "parse_scaling_efficiency"):
        assert 0 < report[key] < 2, key
    assert report["scaling_efficiency_runs"] == [report["scaling_efficiency"]]
    assert report["peak_executor_mb"] > 100  # a JVM at least
    assert report["single_task_sections"] == 0
    assert len(report["section_tasks"]) == 10
    # each phase's CPU, on each master: a JVM and Python workers at work in both
    cpus = os.cpu_count() or 1
    for prefix in ("", "local1_"):
        for phase in ("read", "jobs"):
            assert report[f"{prefix}{phase}_cpu_s"] > 0, (prefix, phase)
            cores = report[f"{prefix}{phase}_cores"]
            # sampled every 0.2 s and read in between: a little past the machine's cores
            assert 0 < cores < cpus + 1, (prefix, phase, cores)
    assert report["read_cpu_s"] + report["jobs_cpu_s"] <= report["cpu_s"] + 0.5


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_analyze", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeated_runs_report_the_medians_and_each_pairs_efficiency() -> None:
    bench = _bench()
    out = bench.rates(
        twos=[200_000, 240_000, 180_000],
        ones=[125_000, 150_000, 100_000],
        pinned=[110_000, 90_000, 100_000],
        read_twos=[20.0, 25.0, 22.0],
        read_ones=[33.0, 40.0, 35.2],
        machine=0.8456,
    )
    assert out["rows_per_s"] == 200_000
    assert out["rows_per_s_local1"] == 125_000
    assert out["scaling_efficiency"] == 0.8
    assert out["scaling_efficiency_runs"] == [0.8, 0.8, 0.9]
    assert out["read_scaling_efficiency"] == 0.8  # 35.2 / (2 x 22.0)
    assert out["parse_scaling_efficiency"] == 0.846
    assert out["rows_per_s_one_cpu"] == 100_000
    assert out["scaling_efficiency_one_cpu"] == 1.0
    assert out["rows_per_s_runs"] == [200_000, 240_000, 180_000]
    # without local[1] runs, nothing is divided by them
    alone = bench.rates([200_000], [], [], [20.0], [], None)
    assert alone["rows_per_s"] == 200_000
    assert alone["scaling_efficiency"] is None
    assert alone["read_scaling_efficiency"] is None
    assert alone["scaling_efficiency_runs"] == []
    assert alone["scaling_efficiency_one_cpu"] is None


def test_a_phase_cpu_is_read_between_the_samples_around_it() -> None:
    bench = _bench()
    samples = [(10.0, 1.0), (11.0, 2.0), (12.0, 4.0)]
    assert bench.phase_cpu_s(samples, 10.0, 12.0) == 3.0
    assert bench.phase_cpu_s(samples, 10.5, 11.5) == 1.5  # 3.0 - 1.5
    assert bench.phase_cpu_s(samples, 9.0, 13.0) == 3.0  # outside: the first and last
    assert bench.phase_cpu_s(samples, 11.0, 11.0) == 0.0
    assert bench._cores(3.0, 2.0) == 1.5
    assert bench._cores(None, 2.0) is None
    assert bench._cores(1.0, 0.0) is None


def test_warm_runs_report_their_medians_and_nothing_without_them() -> None:
    bench = _bench()
    out = bench.warm_rates([300_000, 280_000, 320_000], [200_000, 180_000, 190_000])
    assert out["rows_per_s_warm"] == 300_000
    assert out["rows_per_s_local1_warm"] == 190_000
    assert out["scaling_efficiency_warm"] == 0.789  # 300,000 / (2 x 190,000)
    assert out["rows_per_s_warm_runs"] == [300_000, 280_000, 320_000]
    none = bench.warm_rates([], [])
    assert none["rows_per_s_warm"] is None
    assert none["scaling_efficiency_warm"] is None
    assert none["rows_per_s_local1_warm_runs"] == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_one_cpu_binds_a_run_and_what_it_starts_to_a_single_cpu() -> None:
    bench = _bench()
    # what _cold(..., one_cpu=True) starts its analysis with, and a process it starts
    code = "import os, subprocess, sys; print(len(os.sched_getaffinity(0)))"
    child = f"{code}; subprocess.run([sys.executable, '-c', {code!r}], check=True)"
    proc = subprocess.run(
        [sys.executable, "-c", child],
        check=True,
        capture_output=True,
        text=True,
        preexec_fn=bench._one_cpu,
    )
    assert proc.stdout.split() == ["1", "1"]
