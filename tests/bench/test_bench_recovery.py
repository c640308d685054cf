"""scripts/bench_recovery.py keeps its output contract (a quick run: 1 MB, no kill)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_recovery.py"


def test_quick_run_reports_both_recoveries_side_by_side() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "1", "--no-kill", "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=180,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    row = report["sizes"]["1"]
    for key in ("ec_recovery_s", "single_source_recovery_s", "ec_save_s", "single_save_s"):
        assert row[key] > 0, key
    assert row["ratio"] == pytest.approx(
        row["ec_recovery_s"] / row["single_source_recovery_s"], abs=0.01
    )
    assert report["encode_mb_s"] > 0
    assert report["decode_mb_s"] > 0
    assert report["kill_to_flowing_s"] is None
    assert report["target"] == {"ratio_at_64_and_256": 0.4}
