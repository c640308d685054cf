"""Checking what apps wrote against the plain-Python reference (shared by the e2e tests)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from agiledart.app import AppSpec
from agiledart.datasets import read_file
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs
from agiledart.runtime.appstate import AppRecord
from agiledart.runtime.connectors import open_sink


def quick(spec: AppSpec, seconds: float = 1.5) -> list[str]:
    """Overrides replaying every source within about ``seconds`` of wall time."""
    out = []
    for s in spec.sources:
        count, rate = s.params.get("count"), s.params.get("rate")
        if count and rate:
            out.append(f"sources.{s.id}.params.speedup={max(1.0, count / rate / seconds):.3f}")
    return out


def running_record(app_id: str) -> AppRecord:
    """A minimal record of a running app scheduled by ``edge-1`` (no spec, no placement)."""
    return AppRecord(
        app_id=app_id,
        name="q",
        spec={},
        state="running",
        scheduler=("127.0.0.1", 1),
        scheduler_name="edge-1",
        submitted_at=0.0,
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def log_sizes(cluster: LocalCluster) -> dict[str, int]:
    assert cluster.workdir is not None
    return {p.stem: p.stat().st_size for p in cluster.workdir.glob("*.log")}


def stdout_records(cluster: LocalCluster, peer: str, since: int) -> list[dict[str, Any]]:
    """What a stdout sink printed (peers' stdout goes to their log) after ``since``."""
    assert cluster.workdir is not None
    with (cluster.workdir / f"{peer}.log").open("rb") as f:
        f.seek(since)
        lines = f.read().decode().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def normalise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON round trip, as the sink files hold them (tuples become lists...)."""
    return [json.loads(json.dumps(r, sort_keys=True)) for r in records]


def check_outputs(
    cluster: LocalCluster, spec: AppSpec, status: dict[str, Any], logs: dict[str, int]
) -> None:
    assert status["state"] == "finished", status.get("error")
    expected = reference_outputs(spec)
    sinks_stats: dict[str, Any] = {}
    for peer_stats in status["peers"].values():
        sinks_stats.update(peer_stats["sinks"])
    for sink in spec.sinks:
        want = normalise(expected[sink.id])
        if sink.connector == "stdout":
            got = stdout_records(cluster, sink.peer, logs.get(sink.peer, 0))
        elif sink.params["format"] == "csv":  # compare what CSV can carry: both read back
            path = Path(sinks_stats[sink.id]["path"])
            got = list(read_file(path, "csv"))
            mirror = cluster.workdir / f"{status['app_id']}-{sink.id}.csv"  # type: ignore[operator]
            params = {**sink.params, "path": str(mirror)}
            mirror_sink = open_sink(replace(sink, params=params), out_dir=mirror.parent)
            mirror_sink.write(expected[sink.id])
            mirror_sink.close()
            want = list(read_file(mirror, "csv"))
        else:
            got = read_jsonl(Path(sinks_stats[sink.id]["path"]))
        assert len(got) == len(want), sink.id
        assert canonical(got) == canonical(want), sink.id
    assert status["totals"]["late"] == 0
    assert status["totals"]["errors"] == 0
