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
        [sys.executable, str(SCRIPT), "--burst", "2000", "--json"],
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
