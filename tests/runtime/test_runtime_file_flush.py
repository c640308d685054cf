"""A file sink at a low rate shows its output while the app runs: written records reach
the file within ``flush_ms`` (default 1 s). Before, a sink that had counted 28 records
had written 0 bytes after 24 s: everything appeared when the app finished.

A real peer; an endless, slow source; no checkpoints (they would flush too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.processes import cli_json, formed_cluster, poll

pytestmark = [pytest.mark.processes]

SPEC = {
    "name": "slow",
    "checkpoint": {"mode": "restart"},
    "sources": [
        {
            "id": "src",
            "peer": "sensor-1",
            "connector": "generator",
            "params": {"dataset": "counter", "rate": 5, "keys": 2},
        }
    ],
    "sinks": [
        {
            "id": "out",
            "peer": "sensor-1",
            "connector": "file",
            "params": {"path": "slow.jsonl"},
            "inputs": ["src"],
        }
    ],
}


def test_a_low_rate_file_sink_writes_while_the_app_runs(tmp_path: Path) -> None:
    with formed_cluster(tmp_path, 1, ["--workers", "0"]) as alone:
        assert alone.workdir is not None
        path = alone.workdir / "slow.yaml"
        path.write_text(yaml.safe_dump(SPEC))
        via = ["--via", "{}:{}".format(*alone.address(0))]
        app_id = cli_json(alone, "submit", str(path), *via)["app_id"]
        out = alone.workdir / "sensor-1" / "output" / app_id / "slow.jsonl"
        # 40 records are about 1.4 KB: a buffered file (8 KB) would still be empty
        s = poll(
            lambda: (
                (st := cli_json(alone, "status", app_id, *via))["totals"]["sink_records"] >= 40
                and st
            ),
            what="40 records through the sink",
            timeout=60,
        )
        assert s["state"] == "running"
        lines = out.read_text().splitlines()
        assert lines, "the sink counted 40 records and the file is still empty"
        assert json.loads(lines[0])["seq"] == 0
