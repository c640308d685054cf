"""scripts/bench_connectors.py keeps its output contract: one quick run (a burst of
2,000; every sink pipeline at once, 2,000 records each) reports every key, and every
sink's output is the reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.processes, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_connectors.py"
SINKS = ("sqlite", "postgresql", "mqtt")
MODES = ("exactly_once", "at_most_once")


def test_a_quick_run_reports_the_engine_beside_mosquitto_sub_and_every_sink(
    tmp_path: Path,
) -> None:
    n = 2000
    proc = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--burst", "2000", "--records", str(n)),
            *("--sinks", ",".join(SINKS), "--together", "--keep", str(tmp_path), "--json"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # the ingest part
    assert report["burst_messages"] == 2000
    assert report["burst_delivered_fraction"] == 1.0  # the whole burst, QoS 1
    assert report["engine_msgs_per_s"] > 0
    assert report["mosquitto_sub_msgs_per_s"] > 0
    assert report["engine_vs_mosquitto_sub"] == pytest.approx(
        report["engine_msgs_per_s"] / report["mosquitto_sub_msgs_per_s"], rel=0.01
    )
    assert report["engine_shed"] == 0
    # the sink part
    assert report["sinks_measured"] == list(SINKS)
    assert report["sinks_together"] is True
    assert report["sink_tables_exact"] is True
    ratios = []
    for sink in SINKS:
        for mode in MODES:
            assert report[f"{sink}_{mode}_tps"] > 0
        assert report[f"{sink}_p99_ms"] is not None
        assert report[f"{sink}_at_most_once_p99_ms"] is not None
        ratios.append(report[f"{sink}_exactly_once_tps"] / report[f"{sink}_at_most_once_tps"])
    assert report["exactly_once_vs_at_most_once"] == pytest.approx(min(ratios), abs=0.002)
    # the reference: per key k0..k6 the sum of its v (1..n), one row per 1 s window
    want: dict[str, int] = {}
    for i in range(n):
        want[f"k{i % 7}"] = want.get(f"k{i % 7}", 0) + i + 1
    tables = sorted((tmp_path / "tables").glob("*.json"))
    assert [t.stem for t in tables] == [
        f"windows_{s}_{m}" for s in sorted(SINKS) for m in sorted(MODES)
    ]
    for table in tables:
        rows = json.loads(table.read_text())
        got: dict[str, int] = {}
        for key, start, end, value in rows:
            assert end - start == 1000
            got[key] = got.get(key, 0) + value
        assert len({(r[0], r[1]) for r in rows}) == len(rows), table.stem
        assert got == want, table.stem
