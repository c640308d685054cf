"""Join, top_k, dedupe, union, running aggregate and the stateless operators."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agiledart.app import OperatorSpec, builtin_resolver
from agiledart.app.errors import FunctionError, OperatorError, SnapshotError
from agiledart.operators import (
    FINAL_WATERMARK,
    MIN_WATERMARK,
    Aggregate,
    BoundedOutOfOrderness,
    Dedupe,
    Filter,
    FlatMap,
    Join,
    KeyBy,
    Map,
    TopK,
    Union,
    Window,
    build_operator,
)


def r(ts: int, **kw: Any) -> dict[str, Any]:
    return {"ts": ts, **kw}


# --- union and watermarks ------------------------------------------------------------


def test_union_takes_min_watermark_over_inputs() -> None:
    u = Union(inputs=3)
    batch = [r(1)]
    assert u.on_batch(2, batch) is batch
    assert u.on_watermark(0, 100) == ([], None)
    assert u.on_watermark(1, 50) == ([], None)
    assert u.on_watermark(2, 70) == ([], 50)
    assert u.watermark == 50
    assert u.on_watermark(1, 200) == ([], 70)
    assert u.on_watermark(2, 300) == ([], 100)
    assert u.on_watermark(2, 250) == ([], None)  # going back is ignored
    with pytest.raises(OperatorError):
        u.on_watermark(3, 1)


def test_bounded_out_of_orderness() -> None:
    g = BoundedOutOfOrderness(100)
    assert g.observe([r(500), r(450)]) == 400
    assert g.observe([r(420)]) is None
    assert g.observe([]) is None
    assert g.observe([r(700), {"no": "ts"}]) == 600
    assert g.finish() == FINAL_WATERMARK
    with pytest.raises(OperatorError):
        BoundedOutOfOrderness(-1)


# --- join ----------------------------------------------------------------------------


def test_join_pairs_same_key_same_window() -> None:
    j = Join(key="k", window_ms=10)
    left = [r(1, k="a", side="L1"), r(4, k="b", side="L2"), r(12, k="a", side="L3")]
    right = [r(3, k="a", side="R1"), r(8, k="a", side="R2"), r(15, k="a", side="R3")]
    assert j.on_batch(0, left) == []
    assert j.on_batch(1, right) == []
    assert j.on_watermark(0, 20) == ([], None)  # right input has no watermark yet
    out, wm = j.on_watermark(1, 20)
    assert [(o["key"], o["left"]["side"], o["right"]["side"], o["ts"]) for o in out] == [
        ("a", "L1", "R1", 3),
        ("a", "L1", "R2", 8),
        ("a", "L3", "R3", 15),
    ]
    assert wm == 20


def test_join_holds_watermark_to_window_start() -> None:
    j = Join(key="k", window_ms=10)
    j.on_watermark(0, 15)
    out, wm = j.on_watermark(1, 17)
    assert wm == 10  # outputs of the window [10, 20) may carry ts >= 10
    j.on_batch(0, [r(16, k=1)])
    j.on_batch(1, [r(15, k=1)])
    out, wm = j.on_watermark(0, FINAL_WATERMARK)
    assert out == []  # right still at 17
    out, wm = j.on_watermark(1, FINAL_WATERMARK)
    assert [o["ts"] for o in out] == [16]
    assert wm == FINAL_WATERMARK


def test_join_order_and_lateness() -> None:
    j = Join(key="k", window_ms=100)
    j.on_batch(1, [r(5, k="z"), r(6, k=1), r(7, k="a")])
    j.on_batch(0, [r(1, k="a"), r(2, k=1), r(3, k="z"), r(4, k="q")])
    j.on_watermark(0, 50)
    j.on_watermark(1, 50)
    j.on_batch(0, [r(10, k="a")])  # late
    out, _ = j.on_watermark(0, FINAL_WATERMARK)
    out2, _ = j.on_watermark(1, FINAL_WATERMARK)
    assert out == []
    assert [o["key"] for o in out2] == [1, "a", "z"]
    assert j.stats.late == 1
    with pytest.raises(OperatorError):
        j.on_batch(2, [])


# --- top_k ---------------------------------------------------------------------------


def test_top_k_per_window_best_first() -> None:
    t = TopK(k=2, by="n", window_ms=10)
    t.on_batch(0, [r(1, n=5, id=1), r(2, n=9, id=2), r(3, n=7, id=3), r(12, n=1, id=4)])
    out, _ = t.on_watermark(0, FINAL_WATERMARK)
    assert out == [
        {"window_start": 0, "window_end": 10, "top": [r(2, n=9, id=2), r(3, n=7, id=3)], "ts": 9},
        {"window_start": 10, "window_end": 20, "top": [r(12, n=1, id=4)], "ts": 19},
    ]


def test_top_k_ties_independent_of_arrival_order() -> None:
    records = [r(i % 7, n=i % 3, id=i) for i in range(300)]
    results = []
    for seed in range(4):
        xs = records[:]
        random.Random(seed).shuffle(xs)
        t = TopK(k=5, by="n", window_ms=100)
        for i in range(0, len(xs), 17):
            t.on_batch(0, xs[i : i + 17])
        results.append(t.on_watermark(0, FINAL_WATERMARK)[0])
    assert all(x == results[0] for x in results)
    assert [x["n"] for x in results[0][0]["top"]] == [2] * 5
    assert [x["ts"] for x in results[0][0]["top"]] == [0] * 5  # smaller ts first on ties


def test_top_k_drops_bad_and_late() -> None:
    t = TopK(k=3, by="n", window_ms=10)
    t.on_batch(0, [r(1, n="x"), r(2), r(3, n=True)])
    t.on_watermark(0, 15)
    t.on_batch(0, [r(5, n=1)])
    assert (t.stats.errors, t.stats.late) == (3, 1)
    assert t.on_watermark(0, FINAL_WATERMARK) == ([], FINAL_WATERMARK)


# --- dedupe --------------------------------------------------------------------------


def test_dedupe_within_ttl() -> None:
    d = Dedupe(key="id", ttl_ms=100)
    out = d.on_batch(0, [r(0, id=1), r(50, id=1), r(99, id=1), r(100, id=1), r(10, id=2)])
    assert [(x["ts"], x["id"]) for x in out] == [(0, 1), (100, 1), (10, 2)]
    assert d.duplicates == 2


def test_dedupe_eviction_does_not_change_result() -> None:
    rng = random.Random(5)
    records = []
    for i in range(2000):
        ts = i * 3 + rng.randint(0, 20)
        records.append(r(ts, id=rng.randint(0, 40)))
    eager = Dedupe(key="id", ttl_ms=50)
    lazy = Dedupe(key="id", ttl_ms=50)
    out_e: list[Any] = []
    top = MIN_WATERMARK
    for i in range(0, len(records), 10):
        batch = records[i : i + 10]
        out_e += eager.on_batch(0, batch)
        top = max(top, *(x["ts"] for x in batch))
        eager.on_watermark(0, top - 20)
    out_l = lazy.on_batch(0, records)
    assert out_e == out_l
    assert len(eager._seen) < len(lazy._seen)
    assert eager.stats.late == 0


def test_dedupe_late_dropped() -> None:
    d = Dedupe(key="id", ttl_ms=10)
    d.on_watermark(0, 100)
    assert d.on_batch(0, [r(99, id=1), r(100, id=2), {"ts": 101}]) == [r(100, id=2)]
    assert (d.stats.late, d.stats.errors) == (1, 1)


# --- running aggregate ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("aggregate", "values"),
    [
        ("count", [1, 2, 1, 3]),
        ("sum", [4, 6, 1, 10]),
        ("mean", [4.0, 3.0, 1.0, 10 / 3]),
        ("min", [4, 2, 1, 2]),
        ("max", [4, 4, 1, 4]),
    ],
)
def test_running_aggregate(aggregate: str, values: list[Any]) -> None:
    a = Aggregate(aggregate=aggregate, key="k", field="v")
    out = a.on_batch(0, [r(1, k="x", v=4), r(2, k="x", v=2), r(3, k="y", v=1)])
    out += a.on_batch(0, [r(4, k="x", v=4), {"ts": 5, "v": 1}])
    assert [o["value"] for o in out] == values
    assert [o["key"] for o in out] == ["x", "x", "y", "x"]
    assert [o["ts"] for o in out] == [1, 2, 3, 4]
    assert a.stats.errors == 1


def test_running_aggregate_unkeyed_and_bad_value() -> None:
    a = Aggregate(aggregate="sum", field="v")
    out = a.on_batch(0, [r(1, v=1), r(2, v="2"), r(3, v=3.5)])
    assert [(o["key"], o["value"]) for o in out] == [(None, 1), (None, 4.5)]
    assert a.stats.errors == 1
    with pytest.raises(OperatorError):
        Aggregate(aggregate="sum")


# --- stateless -----------------------------------------------------------------------


def test_stateless_errors_counted_and_dropped() -> None:
    m = Map(lambda x: {**x, "inv": 1 / x["v"]})
    assert [o["inv"] for o in m.on_batch(0, [r(1, v=2), r(2, v=0), r(3, v=4)])] == [0.5, 0.25]
    assert m.stats.errors == 1
    assert "ZeroDivisionError" in m.stats.last_error
    f = Filter(lambda x: x["v"] > 1)
    assert f.on_batch(0, [r(1, v=2), r(2), r(3, v=0)]) == [r(1, v=2)]
    assert f.stats.errors == 1
    fm = FlatMap(lambda x: [x] * x["n"])
    assert len(fm.on_batch(0, [r(1, n=2), r(2), r(3, n=3)])) == 5
    assert fm.stats.errors == 1


def test_key_by() -> None:
    one = KeyBy(fields=["city"])
    two = KeyBy(fields=["city", "metric"])
    fn = KeyBy(fn=lambda x: x["city"][:2])
    x = r(1, city="Geneva", metric="dust")
    assert one.on_batch(0, [x])[0]["key"] == "Geneva"
    assert two.on_batch(0, [x])[0]["key"] == "Geneva/dust"
    assert fn.on_batch(0, [x])[0]["key"] == "Ge"
    assert "key" not in x  # input untouched
    with pytest.raises(OperatorError):
        KeyBy()


def test_watermark_passes_through_stateless() -> None:
    m = Map(lambda x: x)
    assert m.on_watermark(0, 10) == ([], 10)
    assert m.on_watermark(0, 5) == ([], None)


# --- factory -------------------------------------------------------------------------


def test_build_operator_binds_params() -> None:
    spec = OperatorSpec(
        id="hot", op="filter", fn="builtin:is_hot", params={"threshold": 10}, inputs=("x",)
    )
    op = build_operator(spec, builtin_resolver())
    recs = [r(1, metric="temperature", value=v) for v in (5, 15)]
    assert op.on_batch(0, recs) == [recs[1]]


def test_resolver_fallback_for_code_ids() -> None:
    code = "0" * 64
    calls = []

    def code_resolver(ref: str) -> Any:
        calls.append(ref)
        return lambda x, factor=1: {**x, "v": x["v"] * factor}

    spec = OperatorSpec(id="m", op="map", fn=f"{code}:double", params={"factor": 2}, inputs=("x",))
    op = build_operator(spec, builtin_resolver(code_resolver))
    assert op.on_batch(0, [r(1, v=3)]) == [r(1, v=6)]
    assert calls == [f"{code}:double"]
    with pytest.raises(FunctionError, match="code resolver"):
        build_operator(spec, builtin_resolver())
    with pytest.raises(FunctionError, match="unknown built-in"):
        builtin_resolver()("builtin:nope")
    with pytest.raises(FunctionError, match="bad function reference"):
        builtin_resolver()("nope")


def test_snapshot_errors() -> None:
    w = Window(size_ms=10, aggregate="count")
    with pytest.raises(SnapshotError, match="msgpack"):
        w.restore(b"\xc1garbage")
    with pytest.raises(SnapshotError, match="cannot restore"):
        w.restore(Dedupe(key="k", ttl_ms=1).snapshot())
    with pytest.raises(SnapshotError):
        Join(key="k", window_ms=5).restore(Union(inputs=3).snapshot())
    with pytest.raises(SnapshotError):
        w.restore(b"\x01")
