"""scripts/bench_connectors.py keeps its output contract (a quick run: a burst of 2,000)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.processes, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_connectors.py"


def test_quick_run_reports_the_engine_beside_mosquitto_sub() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--burst", "2000", "--sinks", "", "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["burst_messages"] == 2000
    assert report["burst_delivered_fraction"] == 1.0  # the whole burst, QoS 1
    assert report["engine_msgs_per_s"] > 0
    assert report["mosquitto_sub_msgs_per_s"] > 0
    assert report["engine_vs_mosquitto_sub"] == pytest.approx(
        report["engine_msgs_per_s"] / report["mosquitto_sub_msgs_per_s"], rel=0.01
    )
    assert report["engine_shed"] == 0


def test_sink_part_alone_fills_every_table_with_the_reference(tmp_path: Path) -> None:
    n = 3000
    proc = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--sinks-only", "--records", str(n)),
            *("--sinks", "sqlite,postgresql", "--keep", str(tmp_path), "--json"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["sinks_measured"] == ["sqlite", "postgresql"]
    assert report["sink_tables_exact"] is True
    ratios = []
    for sink in ("sqlite", "postgresql"):
        for mode in ("exactly_once", "at_most_once"):
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
        f"windows_{s}_{m}"
        for s in ("postgresql", "sqlite")
        for m in ("at_most_once", "exactly_once")
    ]
    for table in tables:
        rows = json.loads(table.read_text())
        got: dict[str, int] = {}
        for key, start, end, value in rows:
            assert end - start == 1000
            got[key] = got.get(key, 0) + value
        assert len({(r[0], r[1]) for r in rows}) == len(rows), table.stem
        assert got == want, table.stem
