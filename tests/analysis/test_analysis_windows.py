"""Windows are counted from the trace's first record even when the reader's tasks,
which count the latency windows while they parse, were told a later start: the reader
notices and reads again from the true one."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agiledart.analysis import analyze, reader
from agiledart.traces import TraceWriter

from .traces import percentile_fits, read_csv

T0 = time.time() * 1000.0 - 60_000.0  # a minute ago: each file's meta line is later


def _write(root: Path) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(5)
    tuples = []
    for peer in ("p1", "p2"):
        with TraceWriter(root, peer, zone="z1") as writer:
            ts = np.sort(T0 + rng.random(300) * 3000.0 + (0.0 if peer == "p2" else 400.0))
            for i, (t, x) in enumerate(zip(ts.tolist(), rng.gamma(2.0, 6.0, 300), strict=True)):
                writer.emit(
                    "tuple",
                    ts=t,
                    app="a",
                    sink="out",
                    trace_id=i,
                    source_ts=t - x,
                    sink_ts=t,
                    latency_ms=float(x),
                )
                tuples.append(("a", t, float(x)))
    return tuples


def test_windows_count_from_the_first_record_past_the_start_of_every_file(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tuples = _write(tmp_path / "traces")
    # only each file's first line (its meta line, the latest record) is looked at
    monkeypatch.setattr(reader, "GUESS_BYTES", 1)
    with caplog.at_level(logging.INFO, logger="agiledart.analysis"):
        analysis = analyze(tmp_path / "traces", tmp_path / "out", spark=spark)
    assert any("reading again" in r.getMessage() for r in caplog.records)
    t0 = min(t for _, t, _ in tuples)
    windows: dict[int, list[float]] = defaultdict(list)
    for _, t, x in tuples:
        windows[math.floor((t - t0) / 1000.0)].append(x)
    rows = read_csv(analysis.out / "tables" / "latency_windows.csv")
    assert sorted(int(r["window"]) for r in rows) == sorted(windows)
    for row in rows:
        values = windows[int(row["window"])]
        assert int(row["count"]) == len(values)
        assert percentile_fits(row["p50_ms"], values, 0.5)
        assert math.isclose(float(row["max_ms"]), max(values))


def test_the_start_is_looked_for_by_spark_tasks_across_many_files(
    spark: Any, tmp_path: Path
) -> None:
    # more files than the guess has tasks (a few per core): each task looks at several
    root = tmp_path / "traces"
    starts = []
    for n in range(9):
        with TraceWriter(root, f"p{n}", zone="z1") as writer:
            for i in range(5):
                writer.emit("peer", ts=T0 + 1000.0 * n + i, event="join", subject=f"p{n}")
        starts.append(T0 + 1000.0 * n)
    # and one file with nothing valid in it
    (root / "p9").mkdir()
    (root / "p9" / "trace-000000.ndjson").write_text("not json\n")
    files = reader.trace_files(root)
    assert len(files) == 10
    assert len(files) > reader.GUESS_TASKS_PER_CORE * spark.sparkContext.defaultParallelism
    assert reader._t0_guess(spark, files) == min(starts)
    assert reader._t0_guess(spark, files[-1:]) is None
