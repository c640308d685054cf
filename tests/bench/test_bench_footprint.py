"""scripts/bench_footprint.py keeps its output contract (a quick run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_footprint.py"


def test_quick_run_reports_both_figures_with_their_anchors() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--rate", "5000", "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=110,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("idle_pss_mb", "loaded_pss_mb", "loaded_peak_pss_mb"):
        assert 5 < report[key] < 2000, key
    assert report["idle_target_mb"] == 80
    assert report["loaded_target_mb"] == 120
    assert report["paper_avg_mb"] == 98
    assert report["operators"] == 10
    assert report["records_emitted"] > 0
    # the loaded peer runs its app's workers: the tree is bigger than the idle peer
    assert report["workers"] >= 1
    assert report["loaded_pss_mb"] > report["idle_pss_mb"]
