"""``analyze`` over synthetic traces of every record type (one peer's in gzip): the
tables match the same figures computed in plain Python on the same files."""

from __future__ import annotations

import itertools
import logging
import math
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agiledart.analysis import Analysis, analyze
from agiledart.analysis.sections import SECTIONS
from agiledart.traces import TraceWriter

from .traces import close, percentile_fits, read_csv, valid_records

T0 = time.time() * 1000.0 - 60_000.0  # a minute ago: the writers' meta lines come last
TUPLES = 400


def _write(root: Path) -> None:
    rng = np.random.default_rng(11)
    w = {
        p: TraceWriter(root, p, zone="z1" if p != "p3" else "z2", compress=p == "p3")
        for p in ("p1", "p2", "p3", "p5")
    }
    for app, peer, sink in (("a1", "p1", "out"), ("a2", "p3", "out2")):
        ts = np.sort(T0 + rng.random(TUPLES) * 5000.0)
        lat = rng.gamma(2.0, 6.0, TUPLES)
        for i, (t, x) in enumerate(zip(ts.tolist(), lat.tolist(), strict=True)):
            w[peer].emit(
                "tuple",
                ts=t,
                app=app,
                sink=sink,
                trace_id=i,
                source_ts=t - x,
                sink_ts=t,
                latency_ms=x,
            )
    instances = (
        ("a1", "map", "p1"),
        ("a1", "map", "p2"),
        ("a1", "win", "p2"),
        ("a2", "filter", "p3"),
    )
    for app, op, peer in instances:
        seen_in = seen_out = 0
        for s in range(6):
            seen_in += int(rng.integers(50, 150))
            seen_out += int(rng.integers(10, 50))
            if (app, op, peer) == ("a1", "map", "p2") and s == 4:  # the instance restarted
                seen_in, seen_out = 30, 12
            w[peer].emit(
                "opstats",
                ts=T0 + 500.0 + 1000.0 * s + rng.random() * 10,
                app=app,
                operator=op,
                records_in=seen_in,
                records_out=seen_out,
                rate_in=100.0,
                queue=int(rng.integers(0, 9)),
                utilization=None if s == 0 else 0.5,
                service_us=None,
            )
    w["p1"].emit(
        "placement",
        ts=T0 + 100.0,
        app="a1",
        name="one",
        strategy=None,
        placement={"map": ["p1"], "win": ["p2"]},
        paths=[["p1", "p2"]],
    )
    w["p1"].emit(
        "placement",
        ts=T0 + 200.0,
        app="a1",
        name="one",
        strategy="agiledart",
        placement={"map": ["p1", "p2"], "win": ["p2", "p4"], "sink": ["p1"]},
        paths=[["p1", "p2", "p1"], ["p2", "p4", "p1"]],
    )
    w["p3"].emit(
        "placement",
        ts=T0 + 150.0,
        app="a2",
        name="two",
        strategy="agiledart",
        placement={"filter": ["p3"], "sink": ["p3"]},
        paths=[["p3"]],
    )
    w["p1"].emit("scheduler", ts=T0 + 50.0, zone="z1", scheduler="p1", event="elected", apps=1)
    w["p2"].emit("scheduler", ts=T0 + 3000.0, zone="z1", scheduler="p2", event="elected", apps=2)
    w["p3"].emit("scheduler", ts=T0 + 60.0, zone="z2", scheduler="p3", event="elected", apps=1)
    for s, (health, n) in enumerate(((0.3, 1), (0.5, 2), (0.7, 3), (0.92, 3), (0.95, 3))):
        w["p2"].emit(
            "scaling",
            ts=T0 + 1000.0 * s,
            app="a1",
            operator="map",
            health=health,
            instances=n,
            target=min(n + 1, 3),
            decision="up" if n < 3 else "hold",
        )
    for phase, at, took in (
        ("detected", 2000.0, None),
        ("restored", 2600.0, 600.0),
        ("resumed", 2900.0, 900.0),
    ):
        w["p2"].emit(
            "recovery",
            ts=T0 + at,
            app="a1",
            dead_peer="p4",
            epoch=None if took is None else 2,
            phase=phase,
            duration_ms=took,
            operators=["win"],
        )
    for epoch in (1, 2, 3):
        w["p1"].emit(
            "checkpoint",
            ts=T0 + 1000.0 * epoch,
            app="a1",
            epoch=epoch,
            bytes=4096 * epoch,
            duration_ms=3.0 * epoch,
            m=3,
            k=2,
            committed=epoch < 3,
        )
    w["p5"].emit("peer", ts=T0 + 10.0, event="joined", subject="p5", node_id=None, zone="z1")
    w["p1"].emit("peer", ts=T0 + 1900.0, event="suspected", subject="p4", node_id="ab", zone=None)
    w["p1"].emit("peer", ts=T0 + 2000.0, event="dead", subject="p4", node_id="ab", zone=None)
    # two instances whose samples are in two files of their peer: one file after the
    # other (the reader's runs join up; the counter goes down where they meet: a restart),
    # and interleaved in time (the instance is computed from its records)
    later = {("a2", "sort"): [(s, 100 * s if s < 4 else 10 * s) for s in range(7)]}
    later[("a2", "join")] = [(s, 70 * s) for s in range(7)]

    def samples(writer: TraceWriter, op: str, steps: list[tuple[int, int]]) -> None:
        for s, counter in steps:
            writer.emit(
                "opstats",
                ts=T0 + 700.0 + 700.0 * s,
                app="a2",
                operator=op,
                records_in=counter,
                records_out=counter // 2,
                rate_in=10.0,
                queue=s,
                utilization=0.25,
                service_us=None,
            )

    samples(w["p5"], "sort", later[("a2", "sort")][:4])
    samples(w["p5"], "join", later[("a2", "join")][0::2])
    for writer in w.values():
        writer.close()
    with TraceWriter(root, "p5", zone="z1") as second:
        samples(second, "sort", later[("a2", "sort")][4:])
        samples(second, "join", later[("a2", "join")][1::2])


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def synthetic(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("synthetic")
    _write(root / "traces")
    logger = logging.getLogger("agiledart.analysis")
    lines, level = _Lines(), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        analysis = analyze(root / "traces", root / "out", spark=spark)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    records = valid_records(root / "traces")
    return {
        "analysis": analysis,
        "records": records,
        "t0": min(r["ts"] for r in records),
        "log": lines.lines,
    }


def test_progress_counts_the_sections_from_zero(synthetic: dict[str, Any]) -> None:
    progress = [m for m in synthetic["log"] if re.match(r"^\d+/\d+ sections", m)]
    done = [tuple(map(int, re.findall(r"\d+", m)[:2])) for m in progress]
    assert done == [(n, len(SECTIONS)) for n in range(len(SECTIONS) + 1)]
    assert progress[0] == f"0/{len(SECTIONS)} sections"


def _table(synthetic: dict[str, Any], name: str) -> list[dict[str, str]]:
    analysis: Analysis = synthetic["analysis"]
    return read_csv(analysis.out / "tables" / f"{name}.csv")


def _of(synthetic: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in synthetic["records"] if r["type"] == kind]


def test_every_record_is_read_gzip_included(synthetic: dict[str, Any]) -> None:
    analysis: Analysis = synthetic["analysis"]
    counts = defaultdict(int)
    for r in synthetic["records"]:
        counts[r["type"]] += 1
    assert analysis.records == dict(counts)
    assert analysis.records["tuple"] == 2 * TUPLES
    assert analysis.malformed_total == 0
    table = {r["type"]: int(r["records"]) for r in _table(synthetic, "record_counts")}
    assert table["tuple"] == 2 * TUPLES
    assert table["meta"] == 5


def test_latency_percentiles_per_window(synthetic: dict[str, Any]) -> None:
    t0 = synthetic["t0"]
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in _of(synthetic, "tuple"):
        groups[(r["app"], math.floor((r["ts"] - t0) / 1000.0))].append(r["latency_ms"])
    rows = _table(synthetic, "latency_windows")
    assert len(rows) == len(groups)
    for row in rows:
        values = groups[(row["app"], int(row["window"]))]
        assert int(row["count"]) == len(values)
        for q in (50, 95, 99):
            assert percentile_fits(row[f"p{q}_ms"], values, q / 100)
        assert close(float(row["t_s"]), int(row["window"]) * 1.0)
    summary = {r["app"]: r for r in _table(synthetic, "latency_summary")}
    for app in ("a1", "a2"):
        values = [r["latency_ms"] for r in _of(synthetic, "tuple") if r["app"] == app]
        assert percentile_fits(summary[app]["p99_ms"], values, 0.99)
        assert close(float(summary[app]["mean_ms"]), float(np.mean(values)))


def test_throughput_per_operator(synthetic: dict[str, Any]) -> None:
    t0 = synthetic["t0"]
    by_instance: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in _of(synthetic, "opstats"):
        by_instance[(r["app"], r["operator"], r["peer"])].append(r)
    out: dict[tuple[str, str, int], float] = defaultdict(float)
    for (app, op, _), samples in by_instance.items():
        samples.sort(key=lambda r: r["ts"])
        for prev, cur in itertools.pairwise(samples):
            w = math.floor((cur["ts"] - t0) / 1000.0)
            grown = cur["records_out"] - prev["records_out"]
            out[(app, op, w)] += grown if grown >= 0 else cur["records_out"]
        out[(app, op, math.floor((samples[0]["ts"] - t0) / 1000.0))] += 0.0
    rows = _table(synthetic, "throughput_windows")
    assert {(r["app"], r["operator"], int(r["window"])) for r in rows} == set(out)
    for r in rows:
        assert close(float(r["out_per_s"]), out[(r["app"], r["operator"], int(r["window"]))])
    summary = {(r["app"], r["operator"]): r for r in _table(synthetic, "throughput_summary")}
    assert summary[("a1", "map")]["instances"] == "2"
    for op in ("sort", "join"):
        assert int(summary[("a2", op)]["records_in"]) == max(
            r["records_in"] for r in _of(synthetic, "opstats") if r["operator"] == op
        )


def test_operators_per_peer(synthetic: dict[str, Any]) -> None:
    latest: dict[str, dict[str, Any]] = {}
    for r in sorted(_of(synthetic, "placement"), key=lambda r: r["ts"]):
        latest[r["app"]] = r
    count: dict[str, int] = {r["peer"]: 0 for r in synthetic["records"]}
    for p in latest.values():
        for peers in p["placement"].values():
            for peer in peers:
                count[peer] = count.get(peer, 0) + 1
    rows = _table(synthetic, "operators_per_peer")
    assert {r["peer"]: int(r["operators"]) for r in rows} == count
    assert count == {"p1": 2, "p2": 2, "p3": 2, "p4": 1, "p5": 0}
    hist = {
        int(r["operators"]): int(r["peers"]) for r in _table(synthetic, "operators_per_peer_hist")
    }
    assert hist == {0: 1, 1: 1, 2: 3}


def test_schedulers_scaling_recovery_checkpoints(synthetic: dict[str, Any]) -> None:
    zones = {r["zone"]: r for r in _table(synthetic, "schedulers")}
    assert zones["z1"]["schedulers"] == "2"
    assert zones["z1"]["latest"] == "p2"
    assert zones["z1"]["names"] == "p1 p2"
    assert zones["z2"]["latest_apps"] == "1"
    scaling = _table(synthetic, "scaling")
    assert [int(r["instances"]) for r in scaling] == [1, 2, 3, 3, 3]
    t0 = synthetic["t0"]
    first = min(r["ts"] for r in _of(synthetic, "scaling"))
    assert close(float(scaling[0]["t_s"]), (first - t0) / 1000.0)
    (incident,) = _table(synthetic, "recovery_incidents")
    assert close(float(incident["detect_to_resume_s"]), 0.9)
    assert close(float(incident["restored_ms"]), 600.0)
    assert incident["epoch"] == "2"
    (ckpt,) = _table(synthetic, "checkpoint_summary")
    assert (ckpt["checkpoints"], ckpt["committed"], ckpt["last_epoch"]) == ("3", "2", "3")
    events = {r["event"]: int(r["records"]) for r in _table(synthetic, "peer_event_counts")}
    assert events == {"dead": 1, "joined": 1, "suspected": 1}


def test_report_shows_every_plot(synthetic: dict[str, Any]) -> None:
    analysis: Analysis = synthetic["analysis"]
    page = analysis.report.read_text()
    plots = sorted(p.name for p in (analysis.out / "plots").iterdir())
    assert plots == [
        f"{name}.png"
        for name in (
            "checkpoints",
            "latency",
            "operators_normal_probability",
            "operators_per_peer",
            "peer_events",
            "recovery",
            "scaling",
            "schedulers",
            "throughput",
        )
    ]
    for name in plots:
        assert f'src="plots/{name}"' in page
    for table in (analysis.out / "tables").iterdir():
        assert f'href="tables/{table.name}"' in page
    assert "no records of this type" not in page.split('id="routing"')[0]
    assert "http" not in page  # nothing to fetch: the report reads offline
