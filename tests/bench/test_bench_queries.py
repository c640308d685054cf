"""scripts/bench_queries.py keeps its output contract (a tiny run on real peers and a
real Mosquitto)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_queries.py"


def test_a_small_run_reports_every_figure() -> None:
    assert shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists(), (
        "mosquitto is missing: `make setup` installs it"
    )
    proc = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--queries", "6", "--seconds", "12", "--json"),
            "--peer-arg=--checkpoint-rate=8",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=110,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(report)[:6] == [
        "queries",
        "submit_p99_ms",
        "latency_p99_ms",
        "connections_per_peer",
        "rss_mb_per_peer",
        "kb_per_query",
    ]
    assert report["queries"] == 6
    assert report["connections_per_peer"] == 1  # six queries, one broker connection
    run = report["runs"][0]
    assert run["results"] > 0  # windows closed and their results came back over MQTT
    assert run["latency_p99_ms"] > 0
    assert run["submit_p99_ms"] > 0
    # the queries checkpoint (a window and an endless MQTT source: mode auto), every
    # 10 s; the peers took the budget option (they would not have started otherwise)
    assert report["peer_args"] == ["--checkpoint-rate=8"]
    assert run["checkpoints_per_query"] >= 1
    assert run["checkpoint_waited_s"] >= 0
