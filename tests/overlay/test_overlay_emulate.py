"""`agiledart emulate`, the README's main job, as a user runs it: real peer processes.

Each run's working directory lands in the test's ``tmp_path`` (``TMPDIR``), so every
peer it started has ``tmp_path`` on its command line: "nothing left behind" is that no
process in ``/proc`` mentions it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.processes import free_port, poll

from agiledart import apps
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

QUICK = ["params.count=3000", "params.rate=3000"]  # 1 s of replay per source
PEERS = ["sensor-1", "sensor-2", "gateway-1", "gateway-2", "edge-1"]


def emulate(port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "agiledart.cli", "emulate", "--port", str(port), *args]


def environment(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp_path), "AGILEDART_PEER": ""}


def sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of the live processes that contain ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue  # gone meanwhile, or not ours
        if marker in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def summary_of(stdout: str) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return summary


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_emulate_runs_urban_sensing_to_the_end_and_leaves_nothing_behind(tmp_path: Path) -> None:
    proc = subprocess.run(
        emulate(
            free_port(), "--peers", "5", "--json", "--work-dir", str(tmp_path / "run"), *sets(QUICK)
        ),
        capture_output=True,
        text=True,
        timeout=240,
        env=environment(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stdout)
    spec = apps.load("urban-sensing", overrides=QUICK)
    assert summary["state"] == "finished", summary
    assert summary["app"] == "urban-sensing"
    assert summary["app_id"].startswith("urban-sensing-")
    assert summary["interrupted"] is False
    assert summary["peers"] == 5
    assert summary["records_in"] == 2 * 3000
    assert summary["records_out"] > 0
    assert summary["late"] == summary["errors"] == 0
    # every operator is placed, on peers of the cluster; the paths run source -> sink
    assert set(summary["placement"]) == {o.id for o in spec.operators}
    assert {p for ps in summary["placement"].values() for p in ps} <= set(PEERS)
    assert summary["paths"]
    for path in summary["paths"]:
        assert path[0] in {s.peer for s in spec.sources}
        assert path[-1] in {k.peer for k in spec.sinks}
    # submitted through a peer that neither reads nor writes the app's data
    pinned = set(summary["sources"].values()) | set(summary["sinks"].values())
    assert summary["submitted_via"] in set(PEERS) - pinned
    # the output files the summary names hold exactly what the app computes
    workdir = Path(summary["workdir"])
    assert workdir == tmp_path / "run"
    assert summary["kept"] is True
    expected = reference_outputs(spec)
    written = 0
    for sink in spec.sinks:
        path = Path(summary["outputs"][sink.id])
        assert path.is_relative_to(workdir)
        got = read_jsonl(path)
        written += len(got)
        want = [json.loads(json.dumps(r, sort_keys=True)) for r in expected[sink.id]]
        assert canonical(got) == canonical(want), sink.id
    assert written == summary["records_out"]
    assert f"submitted {summary['app_id']}" in proc.stderr  # the live view went to stderr
    assert processes_mentioning(str(tmp_path)) == []


def test_ctrl_c_stops_the_app_prints_the_summary_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    port = free_port()
    endless = ["params.count=10000000", "params.rate=1000"]  # hours of replay
    proc = subprocess.Popen(
        emulate(port, "--peers", "5", "--json", *sets(endless)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(tmp_path),
    )
    try:
        assert proc.stderr is not None
        seen = []
        while (line := proc.stderr.readline()) and not line.startswith("submitted "):
            seen.append(line)
        submitted = re.match(r"submitted (\S+) through \S+ \((\S+)\)", line)
        assert submitted, "".join(seen)
        app_id, via = submitted.groups()
        (workdir,) = tmp_path.glob("agiledart-emulate-*")

        def flowing() -> bool:
            status = subprocess.run(
                [
                    *[sys.executable, "-m", "agiledart.cli", "--log-level", "warning"],
                    *["status", app_id, "--via", via, "--json"],
                    *["--cluster-key-file", str(workdir / "cluster.key")],
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            return (
                status.returncode == 0 and json.loads(status.stdout)["totals"]["source_records"] > 0
            )

        poll(flowing, what="records to flow")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    summary = summary_of(out)
    assert summary["app_id"] == app_id
    assert summary["interrupted"] is True
    assert summary["state"] == "stopped"
    assert summary["kept"] is False
    assert not workdir.exists()  # a temporary directory, removed (no --keep, no --work-dir)
    assert 0 < summary["records_in"] < 2 * 10_000_000
    assert set(summary["placement"]) == {o.id for o in apps.load("urban-sensing").operators}
    assert processes_mentioning(str(tmp_path)) == []
    assert processes_mentioning(f":{port} ") == []


def test_an_invalid_spec_is_an_error_before_any_peer_starts(tmp_path: Path) -> None:
    for args in (["--set", "params.rate=fast"], ["--peers", "2"], ["--app", "no-such-app"]):
        proc = subprocess.run(
            emulate(free_port(), *args),
            capture_output=True,
            text=True,
            timeout=60,
            env=environment(tmp_path),
        )
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stderr.startswith("Error: "), (args, proc.stderr)
    assert list(tmp_path.iterdir()) == []  # no working directory: nothing was started


def test_a_peer_that_cannot_start_is_an_error_and_the_others_are_torn_down(
    tmp_path: Path,
) -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.3", port))  # sensor-2's overlay address
        proc = subprocess.run(
            emulate(port, "--peers", "3"),
            capture_output=True,
            text=True,
            timeout=120,
            env=environment(tmp_path),
        )
    assert proc.returncode == 1, proc.stderr
    assert "Error: peer sensor-2 exited" in proc.stderr
    assert "cannot listen on 127.0.0.3" in proc.stderr
    assert processes_mentioning(str(tmp_path)) == []
