"""Window operator semantics: tumbling, sliding, aggregates, lateness, ordering."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.app.errors import OperatorError
from agiledart.local.reference import _windows as reference_windows
from agiledart.operators import FINAL_WATERMARK, Window


def rec(ts: int, key: Any = "a", value: Any = 1.0) -> dict[str, Any]:
    return {"ts": ts, "k": key, "v": value}


def run(op: Window, records: list[dict[str, Any]], wm: int = FINAL_WATERMARK) -> list[Any]:
    assert op.on_batch(0, records) == []
    out, _ = op.on_watermark(0, wm)
    return out


def test_tumbling_count_unkeyed() -> None:
    op = Window(size_ms=5000, aggregate="count")
    out = run(op, [rec(t) for t in range(0, 12000, 1000)])
    assert out == [
        {"key": None, "window_start": 0, "window_end": 5000, "value": 5, "ts": 4999},
        {"key": None, "window_start": 5000, "window_end": 10000, "value": 5, "ts": 9999},
        {"key": None, "window_start": 10000, "window_end": 15000, "value": 2, "ts": 14999},
    ]


@pytest.mark.parametrize(
    ("aggregate", "expected"),
    [("count", 3), ("sum", 6.5), ("mean", 6.5 / 3), ("min", -1.5), ("max", 5)],
)
def test_every_aggregate(aggregate: str, expected: Any) -> None:
    op = Window(size_ms=10, aggregate=aggregate, key="k", field="v")
    out = run(op, [rec(1, "x", 3), rec(2, "x", -1.5), rec(9, "x", 5), rec(10, "x", 100)], wm=10)
    assert out == [{"key": "x", "window_start": 0, "window_end": 10, "value": expected, "ts": 9}]


def test_sum_of_ints_is_exact_int() -> None:
    op = Window(size_ms=10, aggregate="sum", field="v")
    big = 2**60
    out = run(op, [rec(1, value=big), rec(2, value=1), rec(3, value=-big)])
    assert out[0]["value"] == 1
    assert type(out[0]["value"]) is int


def test_sliding_windows() -> None:
    op = Window(size_ms=10, slide_ms=5, aggregate="sum", field="v")
    out = run(op, [rec(0, value=1), rec(3, value=2), rec(7, value=4), rec(12, value=8)])
    assert [(o["window_start"], o["window_end"], o["value"]) for o in out] == [
        (-5, 5, 3),
        (0, 10, 7),
        (5, 15, 12),
        (10, 20, 8),
    ]


def test_sliding_with_non_dividing_slide() -> None:
    op = Window(size_ms=10, slide_ms=4, aggregate="count")
    out = run(op, [rec(t) for t in range(0, 13)])
    got = {(o["window_start"], o["window_end"]): o["value"] for o in out}
    expect = {}
    for s in range(-8, 13, 4):
        n = sum(1 for t in range(13) if s <= t < s + 10)
        if n:
            expect[(s, s + 10)] = n
    assert got == expect


def test_fires_only_when_watermark_passes_end() -> None:
    op = Window(size_ms=5000, aggregate="count")
    op.on_batch(0, [rec(100), rec(4999), rec(5000)])
    assert op.on_watermark(0, 4999) == ([], 4999)
    out, wm = op.on_watermark(0, 5000)
    assert wm == 5000
    assert [(o["window_end"], o["value"]) for o in out] == [(5000, 2)]
    assert op.on_watermark(0, 4000) == ([], None)  # watermarks never go back
    out, _ = op.on_watermark(0, FINAL_WATERMARK)
    assert [(o["window_end"], o["value"]) for o in out] == [(10000, 1)]
    assert op.finished


def test_out_of_order_within_bound_is_not_late() -> None:
    ordered = [rec(t, value=t) for t in range(0, 20)]
    shuffled = ordered[:]
    random.Random(3).shuffle(shuffled)
    a = Window(size_ms=5, aggregate="sum", field="v")
    b = Window(size_ms=5, aggregate="sum", field="v")
    assert run(a, ordered) == run(b, shuffled)
    assert b.stats.late == 0


def test_late_records_counted_and_dropped() -> None:
    op = Window(size_ms=10, aggregate="count")
    op.on_batch(0, [rec(1), rec(12)])
    out, _ = op.on_watermark(0, 11)
    assert [o["value"] for o in out] == [1]
    op.on_batch(0, [rec(5), rec(10), rec(11), rec(15)])  # 5 and 10 are behind the watermark
    assert op.stats.late == 2
    out, _ = op.on_watermark(0, FINAL_WATERMARK)
    assert [(o["window_start"], o["value"]) for o in out] == [(10, 3)]


def test_final_watermark_closes_every_window() -> None:
    op = Window(size_ms=7, slide_ms=3, aggregate="max", key="k", field="v")
    op.on_batch(0, [rec(t, key=t % 3, value=t) for t in range(50)])
    out, wm = op.on_watermark(0, FINAL_WATERMARK)
    assert wm == FINAL_WATERMARK
    assert out
    assert op._panes == {}


def test_output_order_is_window_end_then_key() -> None:
    op = Window(size_ms=10, aggregate="count", key="k")
    records = [rec(15, "b"), rec(1, "b"), rec(2, None), rec(3, 3), rec(4, "a"), rec(11, 2.5)]
    out = run(op, records)
    assert [(o["window_end"], o["key"]) for o in out] == [
        (10, None),
        (10, 3),
        (10, "a"),
        (10, "b"),
        (20, 2.5),
        (20, "b"),
    ]


def test_bad_records_counted_not_fatal() -> None:
    op = Window(size_ms=10, aggregate="sum", key="k", field="v")
    bad = [{"ts": 1, "k": "a"}, {"k": "a", "v": 1}, rec(2, value="x"), rec(3, key=[1]), rec(4)]
    out = run(op, bad)
    assert op.stats.errors == 4
    assert "KeyError" in op.stats.last_error or "TypeError" in op.stats.last_error
    assert [o["value"] for o in out] == [1.0]


def test_constructor_checks() -> None:
    with pytest.raises(OperatorError):
        Window(size_ms=5, slide_ms=6, aggregate="count")
    with pytest.raises(OperatorError):
        Window(size_ms=5, aggregate="median")
    with pytest.raises(OperatorError):
        Window(size_ms=5, aggregate="sum")


def test_float_sums_do_not_depend_on_order() -> None:
    values = [0.1, 1e16, 0.2, -1e16, 0.3, 1 / 3]
    results = set()
    for seed in range(6):
        vs = values[:]
        random.Random(seed).shuffle(vs)
        op = Window(size_ms=100, aggregate="sum", field="v")
        results.add(run(op, [rec(i, value=v) for i, v in enumerate(vs)])[0]["value"])
    assert results == {math.fsum(values)}


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    size=st.integers(1, 40),
    slide_div=st.integers(1, 5),
    aggregate=st.sampled_from(["count", "sum", "mean", "min", "max"]),
    keyed=st.booleans(),
    lag=st.integers(0, 15),
)
def test_streaming_equals_grouping(
    seed: int, size: int, slide_div: int, aggregate: str, keyed: bool, lag: int
) -> None:
    """Any batching and watermark cadence within the disorder bound gives the reference."""
    rng = random.Random(seed)
    slide = max(1, size // slide_div)
    records = []
    base = rng.randint(-50, 50)
    for _ in range(rng.randint(0, 120)):
        base += rng.randint(0, 3)
        ts = base + rng.randint(0, lag)  # at most lag behind the largest ts so far
        records.append(rec(ts, key=rng.choice("abc"), value=rng.choice([rng.random(), 7])))
    op = Window(
        size_ms=size, slide_ms=slide, aggregate=aggregate, key="k" if keyed else None, field="v"
    )
    out: list[Any] = []
    top = -(2**62)
    i = 0
    while i < len(records):
        n = rng.randint(1, 10)
        batch = records[i : i + n]
        i += n
        op.on_batch(0, batch)
        top = max(top, *(r["ts"] for r in batch))
        fired, _ = op.on_watermark(0, top - lag)
        out += fired
    fired, _ = op.on_watermark(0, FINAL_WATERMARK)
    out += fired
    assert op.stats.late == 0
    expect = reference_windows(records, size, slide, "k" if keyed else None, aggregate, "v")
    assert out == expect
