"""run_local against the plain-Python reference; executor stages and snapshots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agiledart import apps
from agiledart.app import App, AppSpec, parse_spec
from agiledart.app.errors import ExecutionError
from agiledart.local.executor import Emission, Executor, LocalRunner, run_local, source_batches
from agiledart.local.reference import canonical, reference_outputs
from agiledart.operators import BoundedOutOfOrderness

# sinks whose stream order is defined (a single path ending in a windowed operator)
ORDERED = {"averages-out", "peaks-out", "top-routes-out", "top-areas-out", "counts-out",
           "top-words-out", "clean-out", "totals-out", "totals"}  # fmt: skip


@pytest.mark.parametrize("name", apps.names())
def test_bundled_app_matches_reference(name: str) -> None:
    spec = apps.load(name, overrides=["params.count=30000"] if name == "throughput" else [])
    runner = LocalRunner(spec)
    out = runner.run()
    expected = reference_outputs(spec)
    assert set(out) == {s.id for s in spec.sinks}
    for sink, records in out.items():
        assert records, f"{name}: sink {sink} got nothing"
        assert canonical(records) == canonical(expected[sink])
        if sink in ORDERED:
            assert records == expected[sink]
    for op_id, op in runner.executor.operators.items():
        assert op.stats.late == 0, op_id
        assert op.stats.errors == 0, (op_id, op.stats.last_error)


def test_results_do_not_depend_on_batch_size() -> None:
    spec = apps.load("urban-sensing", overrides=["params.count=5000"])
    a = run_local(spec, batch_size=1000)
    b = run_local(spec, batch_size=37)
    assert a == b


def test_bundled_apps_do_real_work() -> None:
    etl = apps.load("etl", overrides=["params.count=8000"])
    runner = LocalRunner(etl)
    out = runner.run()["clean-out"]
    dedupe = runner.executor.operators["dedupe"]
    assert dedupe.duplicates > 0  # type: ignore[attr-defined]
    assert len({r["id"] for r in out}) == len(out)
    assert all(set(r) == {"ts", "id", "sensor", "city", "metric", "value", "unit"} for r in out)
    assert all(r["value"] != -999.0 for r in out)

    routes = run_local(apps.load("frequent-routes"))["top-routes-out"]
    assert all(len(w["top"]) == 10 for w in routes)
    assert all(w["top"][0]["value"] >= w["top"][-1]["value"] > 1 for w in routes)


def batches(spec: AppSpec, size: int) -> Iterator[tuple[str, list[Any] | int]]:
    """The source side of run_local: round-robin batches, then watermarks."""
    live = [
        (
            s.id,
            source_batches(s, batch_size=size),
            BoundedOutOfOrderness(s.params["out_of_order_ms"]),
        )
        for s in spec.sources
    ]
    while live:
        for entry in list(live):
            sid, it, gen = entry
            batch = next(it, None)
            if batch is None:
                live.remove(entry)
                yield sid, gen.finish()
                continue
            yield sid, batch
            wm = gen.observe(batch)
            if wm is not None:
                yield sid, wm


def deliver(spec: AppSpec, out: dict[str, list[Any]], emitted: list[Emission]) -> None:
    for producer, what in emitted:
        if isinstance(what, list):
            for sink in spec.sinks:
                if producer in sink.inputs:
                    out[sink.id] += what


def step(ex: Executor, upstream: str, what: list[Any] | int) -> list[Emission]:
    return ex.feed(upstream, what) if isinstance(what, list) else ex.watermark(upstream, what)


def test_executor_stages_equal_whole_app() -> None:
    spec = apps.load("urban-sensing", overrides=["params.count=6000"])
    first = Executor(spec, operators=["readings", "valid", "by-city-metric"])
    second = Executor(spec, operators=["averages", "peaks"])
    assert first.exits == {"by-city-metric"}
    assert second.entries == {"by-city-metric"}
    out: dict[str, list[Any]] = {s.id: [] for s in spec.sinks}
    for sid, what in batches(spec, 500):
        for producer, item in step(first, sid, what):
            deliver(spec, out, step(second, producer, item))
    assert out == run_local(spec, batch_size=500)


def test_executor_snapshot_and_resume_mid_run() -> None:
    spec = apps.load("profitable-areas", overrides=["params.count=6000"])
    events = list(batches(spec, 256))
    whole: dict[str, list[Any]] = {s.id: [] for s in spec.sinks}
    ex = Executor(spec)
    for sid, what in events:
        deliver(spec, whole, step(ex, sid, what))
    resumed: dict[str, list[Any]] = {s.id: [] for s in spec.sinks}
    ex = Executor(spec)
    half = len(events) // 2
    for sid, what in events[:half]:
        deliver(spec, resumed, step(ex, sid, what))
    ex = Executor(spec, states=ex.snapshot())
    for sid, what in events[half:]:
        deliver(spec, resumed, step(ex, sid, what))
    assert resumed == whole
    assert whole["top-areas-out"]


def test_file_source_with_bad_lines(tmp_path: Path) -> None:
    lines = [f'{{"ts": {t}, "city": "c{t % 2}", "value": {t}}}' for t in range(0, 100, 5)]
    lines[3] = "{not json"
    lines[7] = '{"city": "no ts"}'
    lines[9] = "[1, 2]"
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    spec = (
        App("files")
        .source("in", peer="p", connector="file", path="in.jsonl")
        .window("w", size_ms=50, key="city", aggregate="sum", field="value")
        .sink("out", peer="p", connector="file", path="out.jsonl")
        .build()
    )
    assert spec.sources[0].params["format"] == "jsonl"
    runner = LocalRunner(spec, base_dir=tmp_path)
    out = runner.run()["out"]
    stats = runner.parse_stats["in"]
    assert (stats.records, stats.bad) == (17, 3)
    assert [e.line for e in stats.errors] == [4, 8, 10]
    good = [t for i, t in enumerate(range(0, 100, 5)) if i not in (3, 7, 9)]
    assert sum(r["value"] for r in out) == sum(good)
    assert reference_outputs(spec, base_dir=tmp_path)["out"] == out


def test_csv_file_source(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("ts,key,n\n1,a,2\n2,b,3.5\n3,a\n4,a,1\n")
    spec = (
        App("csv")
        .source("in", peer="p", connector="file", path="in.csv")
        .aggregate("total", aggregate="sum", key="key", field="n")
        .sink("out", peer="p", connector="stdout")
        .build()
    )
    out = run_local(spec, base_dir=tmp_path)["out"]
    assert [(r["key"], r["value"]) for r in out] == [("a", 2), ("b", 3.5), ("a", 3)]


def test_what_run_local_cannot_run(tmp_path: Path) -> None:
    base = {
        "name": "x",
        "operators": [],
        "sinks": [{"id": "o", "peer": "p", "connector": "stdout", "inputs": ["s"]}],
    }
    mqtt = parse_spec(
        {
            **base,
            "sources": [{"id": "s", "peer": "p", "connector": "mqtt", "params": {"topic": "t"}}],
        }
    )
    with pytest.raises(ExecutionError, match="network runtime"):
        run_local(mqtt)
    unbounded = parse_spec(
        {
            **base,
            "sources": [
                {"id": "s", "peer": "p", "connector": "generator",
                 "params": {"dataset": "counter", "rate": 10}}
            ],
        }
    )  # fmt: skip
    assert not unbounded.finite
    with pytest.raises(ExecutionError, match="unbounded"):
        run_local(unbounded)
    missing = parse_spec(
        {**base, "sources": [{"id": "s", "peer": "p", "connector": "file",
                              "params": {"path": "nope.csv"}}]}
    )  # fmt: skip
    with pytest.raises(ExecutionError, match="cannot read"):
        run_local(missing, base_dir=tmp_path)
    with pytest.raises(ExecutionError, match="no such operators"):
        Executor(mqtt, operators=["ghost"])


def test_source_straight_to_sink_and_on_output() -> None:
    spec = parse_spec(
        {
            "name": "direct",
            "sources": [
                {"id": "s", "peer": "p", "connector": "generator",
                 "params": {"dataset": "counter", "rate": 100, "count": 2500}}
            ],
            "sinks": [{"id": "o", "peer": "p", "connector": "stdout", "inputs": ["s"]}],
        }
    )  # fmt: skip
    seen: list[tuple[str, int]] = []
    assert run_local(spec, on_output=lambda sink, recs: seen.append((sink, len(recs)))) == {"o": []}
    assert sum(n for _, n in seen) == 2500
    assert [r["seq"] for r in run_local(spec)["o"]] == list(range(2500))
