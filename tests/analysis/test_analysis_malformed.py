"""Malformed trace lines are counted by reason, reported and skipped; the rest is still
analyzed. A gzip trace cut short (a killed peer) is read up to the cut."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agiledart.analysis import Analysis, analyze
from agiledart.cli.entry import main
from agiledart.traces import TraceWriter

from .traces import percentile_fits, read_csv

GOOD = 50
BAD_LINES = {
    "not_json": [
        '{"v":1,"type":"tuple","ts":1000.0,"peer":"p1","app":"a","si',  # truncated
        "\x00\x01 garbage \xff",
        "[1, 2, 3]",
    ],
    "bad_fields": [
        '{"v":1,"type":"tuple","ts":1.0,"peer":"p1","app":"a","sink":"s","trace_id":1,'
        '"source_ts":1.0,"sink_ts":2.0,"latency_ms":"fast"}',
        '{"v":1,"type":"tuple","ts":1.0,"peer":"p1","app":"a","sink":"s","trace_id":1.5,'
        '"source_ts":1.0,"sink_ts":2.0,"latency_ms":3.0}',
        '{"v":1,"type":"tuple","ts":1.0,"peer":"p1","app":"a","sink":"s","trace_id":1,'
        '"source_ts":1.0,"sink_ts":2.0}',  # latency_ms missing
        '{"v":1,"type":"checkpoint","ts":1.0,"peer":"p1","app":"a","epoch":1,"bytes":1,'
        '"duration_ms":1.0,"m":1,"k":1,"committed":"yes"}',
    ],
    "unknown_type": ['{"v":1,"type":"gossip","ts":1.0,"peer":"p1"}', '{"ts": 5}'],
    "unsupported_version": [
        '{"v":2,"type":"tuple","ts":1.0,"peer":"p1","app":"a","sink":"s","trace_id":1,'
        '"source_ts":1.0,"sink_ts":2.0,"latency_ms":3.0}'
    ],
}


@pytest.fixture(scope="module")
def damaged(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("damaged")
    traces = root / "traces"
    latencies = np.random.default_rng(2).gamma(2.0, 5.0, GOOD).tolist()
    with TraceWriter(traces, "p1") as w:
        for i, x in enumerate(latencies):
            w.emit("tuple", app="a", sink="s", trace_id=i, source_ts=0.0, sink_ts=x, latency_ms=x)
    path = traces / "p1" / "trace-000001.ndjson"
    lines = path.read_text().splitlines()
    bad = [line for group in BAD_LINES.values() for line in group]
    mixed = lines[:20] + bad[:5] + ["", "   "] + lines[20:] + bad[5:]
    path.write_bytes("\n".join(mixed).encode("utf-8", "surrogateescape") + b"\n")
    # a peer killed while writing a compressed trace: flushed, never closed
    killed = TraceWriter(traces, "p2", compress=True)
    for i in range(30):
        killed.emit(
            "tuple", app="b", sink="s", trace_id=i, source_ts=0.0, sink_ts=1.0, latency_ms=7.0
        )
    killed.flush()
    cut = traces / "p2" / "trace-000001.ndjson.gz"
    shutil.copy(cut, root / "cut.gz")
    killed.close()
    shutil.copy(root / "cut.gz", cut)
    analysis = analyze(traces, root / "out", spark=spark)
    return {"root": root, "analysis": analysis, "latencies": latencies}


def test_counts_per_reason(damaged: dict[str, Any]) -> None:
    analysis: Analysis = damaged["analysis"]
    assert analysis.malformed == {k: len(v) for k, v in BAD_LINES.items()}
    summary = json.loads((analysis.out / "summary.json").read_text())
    assert summary["malformed"] == analysis.malformed
    rows = {
        r["reason"]: int(r["lines"]) for r in read_csv(analysis.out / "tables" / "malformed.csv")
    }
    assert rows == analysis.malformed
    per_file = read_csv(analysis.out / "tables" / "malformed_files.csv")
    assert {r["file"] for r in per_file} == {"p1/trace-000001.ndjson"}
    assert sum(int(r["lines"]) for r in per_file) == 10


def test_the_rest_is_analyzed(damaged: dict[str, Any]) -> None:
    analysis: Analysis = damaged["analysis"]
    assert analysis.records == {"meta": 2, "tuple": GOOD + 30}
    summary = {r["app"]: r for r in read_csv(analysis.out / "tables" / "latency_summary.csv")}
    assert int(summary["a"]["count"]) == GOOD
    assert percentile_fits(summary["a"]["p95_ms"], damaged["latencies"], 0.95)
    assert int(summary["b"]["count"]) == 30  # all of the cut gzip file


def test_report_shows_the_damage(damaged: dict[str, Any]) -> None:
    analysis: Analysis = damaged["analysis"]
    page = analysis.report.read_text()
    assert "10 of 92 lines did not fit the schema" in page
    assert "malformed_examples.csv" in page
    assert "&quot;latency_ms&quot;:&quot;fast&quot;" in page
    assert "\\x00\\x01 garbage" in page
    assert "\x00" not in page


def test_cli_reports_malformed_lines_on_stderr(
    damaged: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["analyze", str(damaged["root"] / "traces"), "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0
    assert (
        "warning: skipped 10 malformed lines (not_json: 3, unknown_type: 2, "
        "unsupported_version: 1, bad_fields: 4)" in captured.err
    )
    assert f"report: {tmp_path / 'report.html'}" in captured.out
