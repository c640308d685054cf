"""`agiledart emulate`, the README's main job, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.processes import free_port

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


def test_emulate_runs_a_ring_and_leaves_nothing_behind() -> None:
    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agiledart.cli",
            "emulate",
            "--peers",
            "5",
            "--duration",
            "2",
            "--port",
            str(port),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["peers"] == 5
    assert summary["routes"] >= 5
    assert summary["delivered"] == summary["routes"]
    assert summary["sink"] == "peer-5"
    leftovers = subprocess.run(
        ["pgrep", "-f", f"agiledart.cli.*--listen 127.0.0.[0-9]+:{port}"],
        capture_output=True,
        text=True,
    )
    assert leftovers.stdout == ""
