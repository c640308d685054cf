"""scripts/bench_bandit.py keeps its output contract (a tiny run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_bandit.py"
TINY = [
    "--runs",
    "2",
    "--packets",
    "30",
    "--sizes",
    "25",
    "--c-grid",
    "0.1",
    "0.5",
    "--workers",
    "1",
]


def test_last_line_is_the_json_report() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", *TINY],
        check=True,
        capture_output=True,
        text=True,
        timeout=100,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    size = report["sizes"]["25"]
    for key in ("regret", "trials_to_optimal", "share_under_ms", "pseudo_regret"):
        for policy in ("agiledart", "e2e", "nexthop", "optimal"):
            assert f"{key}_{policy}" in size
            assert f"{key}_{policy}_std" in size
    assert (size["nodes"], size["links"]) == (25, 64)
    assert size["pseudo_regret_optimal"] == 0
    assert set(report["exploration_study"]) == {"net1", "net2", "net3"}
    assert report["exploration_study"]["net1"]["best_c"] in (0.1, 0.5)
    assert 0 < report["decision_us_144"] < 1000
