"""What ``agiledart emulate`` shows: the live view and the summary over ``status`` and
``ring`` answers, without processes (the real runs are in tests/overlay)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from agiledart import apps
from agiledart.cli.emulate import (
    Progress,
    hosted,
    progress_view,
    sink_outputs,
    submit_peer,
    summarize,
    summary_text,
    unique_paths,
)
from agiledart.emulation import LocalCluster

NAMES = ("sensor-1", "sensor-2", "gateway-1", "gateway-2", "edge-1")
OUT = "/w/gateway-1/output/urban-sensing-abc123"


def status(state: str = "running", source_records: int = 4000) -> dict[str, Any]:
    """A ``status`` answer of the shape the peers give (trimmed)."""
    return {
        "app_id": "urban-sensing-abc123",
        "name": "urban-sensing",
        "state": state,
        "error": None,
        "placement": {"readings": ["gateway-1"], "valid": ["sensor-1"], "peaks": ["sensor-1"]},
        "sources": {"readings-a": "sensor-1", "readings-b": "sensor-2"},
        "sinks": {"averages-out": "gateway-1", "peaks-out": "gateway-1"},
        "paths": [
            ["sensor-1", "gateway-1"],
            ["sensor-1", "gateway-1"],
            ["sensor-2", "gateway-1"],
        ],
        "totals": {
            "source_records": source_records,
            "sink_records": 84,
            "delayed": 1,
            "shed": 2,
            "late": 0,
            "errors": 0,
            "source_rate": 3990.5,
            "latency_p50_ms": 6.75,
            "latency_p99_ms": 8.274,
        },
        "peers": {
            "gateway-1": {
                "sinks": {
                    "averages-out": {"records": 42, "path": f"{OUT}/urban-averages.jsonl"},
                    "peaks-out": {"records": 42, "path": f"{OUT}/urban-peaks.jsonl"},
                }
            },
            "sensor-1": {"sinks": {}},
        },
    }


def ring(name: str, apps_here: list[str]) -> dict[str, Any]:
    i = NAMES.index(name)
    others = [{"name": n} for n in NAMES if n != name]
    return {"self": name, "address": f"127.0.0.{i + 2}:4700", "peers": others, "apps": apps_here}


def progress() -> Progress:
    return Progress(app="urban-sensing", names=NAMES, via="edge-1", duration=60.0, started=100.0)


def render(p: Progress, now: float, *, wide: bool = True) -> str:
    out = io.StringIO()
    Console(file=out, width=140 if wide else 80).print(progress_view(p, now, wide=wide))
    return out.getvalue()


def test_the_rate_is_over_the_last_poll_interval() -> None:
    p = progress()
    assert p.state == "not submitted"
    p.app_id = "urban-sensing-abc123"
    assert p.state == "submitted"
    p.observe(status(source_records=1000), now=101.0)
    assert p.rate is None  # one poll: no interval yet
    p.observe(status(source_records=3000), now=101.5)
    assert p.rate == 4000.0
    p.observe(status(state="finished", source_records=3000), now=102.5)
    assert p.rate == 0.0
    assert p.state == "finished"


def test_paths_hosts_and_outputs() -> None:
    s = status()
    assert unique_paths(s) == [["sensor-1", "gateway-1"], ["sensor-2", "gateway-1"]]
    assert hosted(s) == {
        "sensor-1": ["readings-a", "valid", "peaks"],
        "sensor-2": ["readings-b"],
        "gateway-1": ["readings", "averages-out", "peaks-out"],
    }
    assert sink_outputs(s) == {
        "averages-out": f"{OUT}/urban-averages.jsonl",
        "peaks-out": f"{OUT}/urban-peaks.jsonl",
    }
    assert sink_outputs({"sinks": {"out": "gateway-1"}, "peers": {}}) == {"out": None}


def test_the_live_view_shows_progress_placement_paths_and_the_ring() -> None:
    p = progress()
    p.app_id = "urban-sensing-abc123"
    p.observe(status(source_records=1000), now=101.0)
    p.observe(status(source_records=3000), now=101.5)
    p.rings = [ring(n, ["urban-sensing-abc123"] if n != "edge-1" else []) for n in NAMES]
    p.rings[3] = None  # gateway-2 did not answer
    for wide in (True, False):
        shown = render(p, now=112.0, wide=wide)
        assert "urban-sensing-abc123" in shown
        assert "running" in shown
        assert "12.0 s" in shown
        assert "stops in 48 s" in shown
        assert "4,000/s now" in shown
        assert "3,990/s mean" in shown
        assert "p50 6.8 ms, p99 8.3 ms" in shown
        assert "delayed 1  shed 2" in shown
        assert "sensor-1 -> gateway-1;  sensor-2 -> gateway-1" in shown
        assert "readings-a, valid, peaks" in shown  # what sensor-1 hosts
        assert "127.0.0.6:4700" in shown
        assert "down" in shown


def test_the_view_before_any_status_and_after_the_end() -> None:
    p = Progress(app="urban-sensing", names=NAMES, via="edge-1", duration=60.0)
    assert "not submitted" in render(p, now=5.0)
    p = progress()
    p.app_id = "urban-sensing-abc123"
    p.observe(status(state="finished"), now=120.0)
    p.ended = 120.0
    shown = render(p, now=130.0)
    assert "finished  20.0 s" in shown
    assert "stops in" not in shown
    assert "/s now" not in shown


def test_the_summary() -> None:
    p = progress()
    p.app_id = "urban-sensing-abc123"
    p.observe(status(state="stopped"), now=110.0)
    p.ended, p.interrupted = 110.0, True
    x = summarize(p, workdir=Path("/w"), wall_s=20.0)
    assert x["app_id"] == "urban-sensing-abc123"
    assert x["state"] == "stopped"
    assert x["interrupted"] is True
    assert (x["records_in"], x["records_out"]) == (4000, 84)
    assert x["mean_throughput_rps"] == 3990.5
    assert (x["latency_p50_ms"], x["latency_p99_ms"]) == (6.75, 8.274)
    assert x["placement"]["readings"] == ["gateway-1"]
    assert len(x["paths"]) == 2
    assert x["outputs"]["peaks-out"] == f"{OUT}/urban-peaks.jsonl"
    assert (x["run_s"], x["wall_s"], x["peers"]) == (10.0, 20.0, 5)
    text = summary_text(x)
    assert text.startswith("summary: urban-sensing-abc123 stopped (Ctrl-C) after 10.0 s")
    assert f"sink peaks-out @ gateway-1: {OUT}/urban-peaks.jsonl" in text


def test_the_summary_of_a_run_that_never_submitted() -> None:
    p = Progress(app="urban-sensing", names=NAMES, via="edge-1", duration=60.0)
    p.interrupted = True
    x = summarize(p, workdir=Path("/w"), wall_s=1.0)
    assert (x["app_id"], x["state"], x["records_in"]) == (None, "not submitted", 0)
    assert "not submitted (Ctrl-C)" in summary_text(x)


def test_apps_are_submitted_through_a_peer_that_neither_reads_nor_writes() -> None:
    spec = apps.load("urban-sensing")  # sensor-1, sensor-2 -> gateway-1
    assert submit_peer(LocalCluster(8), spec) == 7  # edge-4
    assert submit_peer(LocalCluster(4), spec) == 3  # gateway-2
    assert submit_peer(LocalCluster(3), spec) == 2  # all pinned: the last
