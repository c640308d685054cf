"""scripts/bench_analyze.py keeps its output contract (a quick run: 20,000 lines, twice
on each master), with the local[1] run, the scaling efficiencies and the machine's
anchor for them, the executors' peak memory and the sections that ran as one task
(none); ``--one-cpu`` binds its local[1] runs to one CPU."""

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
        [sys.executable, str(SCRIPT), "--rows", "20000", "--json", "--repeat", "2"],
        check=True,
        capture_output=True,
        text=True,
        timeout=580,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rows"] >= 20_000
    assert report["malformed"] == 0
    # the first local[2] run's rate; with --repeat 2 the rates are the two runs' medians
    first = report["rows_per_s_runs"][0]
    assert first == pytest.approx(report["rows"] / report["seconds"], rel=0.01)
    assert len(report["rows_per_s_runs"]) == len(report["rows_per_s_local1_runs"]) == 2
    assert report["rows_per_s"] == round(sum(report["rows_per_s_runs"]) / 2)
    assert report["rows_per_s_local1"] == round(sum(report["rows_per_s_local1_runs"]) / 2)
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
    # without --one-cpu (each such run is a cold JVM on one CPU: see the test below)
    assert report["rows_per_s_one_cpu"] is None
    assert report["scaling_efficiency_one_cpu"] is None
    assert report["rows_per_s_one_cpu_runs"] == []
    # ratios of two timings each: positive, and not past what two cores can give by much
    for key in ("read_scaling_efficiency", "parse_scaling_efficiency"):
        assert 0 < report[key] < 2, key
    assert report["scaling_efficiency_runs"] == [
        pytest.approx(two / (2 * one), abs=0.002)
        for two, one in zip(
            report["rows_per_s_runs"], report["rows_per_s_local1_runs"], strict=True
        )
    ]
    assert report["peak_executor_mb"] > 100  # a JVM at least
    assert report["single_task_sections"] == 0
    assert len(report["section_tasks"]) == 10


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_analyze", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
