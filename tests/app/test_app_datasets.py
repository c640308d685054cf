"""Generator datasets (deterministic, rate-driven event time) and file parsing."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.app import parse_spec
from agiledart.app.errors import DatasetError, ParseError
from agiledart.datasets import (
    DATASETS,
    MAX_LINE,
    ParseStats,
    generate,
    generate_batches,
    generator_kwargs,
    parse_csv,
    parse_jsonl,
    read_file,
)
from agiledart.datasets.urban import CITIES, METRICS


@pytest.mark.parametrize("dataset", DATASETS)
def test_deterministic_by_seed(dataset: str) -> None:
    a = list(generate(dataset, seed=3, count=5000, rate=1000))
    b = list(generate(dataset, seed=3, count=5000, rate=1000))
    c = list(generate(dataset, seed=4, count=5000, rate=1000))
    assert len(a) == 5000
    assert a == b
    assert a != c


@pytest.mark.parametrize("dataset", DATASETS)
def test_prefix_and_batch_size_independent(dataset: str) -> None:
    short = list(generate(dataset, seed=1, count=5000, rate=700))
    longer = [r for b in generate_batches(dataset, seed=1, count=9001, rate=700, batch_size=33)
              for r in b]  # fmt: skip
    assert longer[:5000] == short
    sizes = [len(b) for b in generate_batches(dataset, seed=1, count=100, rate=7, batch_size=33)]
    assert sizes == [33, 33, 33, 1]


@pytest.mark.parametrize("rate", [1000, 333, 2.5, 100_000])
def test_event_time_follows_rate(rate: float) -> None:
    recs = list(generate("counter", seed=0, count=3000, rate=rate, start_ts=10_000))
    for i, r in enumerate(recs):
        base = i * 1000 // rate if isinstance(rate, int) else math.floor(i * (1000.0 / rate))
        assert r["ts"] == 10_000 + base
        assert r["seq"] == i
    span = recs[-1]["ts"] - recs[0]["ts"]
    assert abs(span - 2999 * 1000 / rate) <= 1


def test_disorder_is_bounded() -> None:
    recs = list(generate("urban", seed=5, count=20000, rate=5000, disorder_ms=40, dup_ratio=0.1))
    top = -1
    behind = 0
    for r in recs:
        assert r["ts"] >= top - 40
        behind = max(behind, top - r["ts"])
        top = max(top, r["ts"])
    assert behind > 10  # really out of order


def test_urban_records() -> None:
    recs = list(generate("urban", seed=1, count=20000, rate=1000, sensors=3, dup_ratio=0.05))
    assert set(recs[0]) == {"ts", "city", "metric", "value", "sensor", "id"}
    assert {r["city"] for r in recs} == set(CITIES)
    assert len(CITIES) == 7
    assert {r["metric"] for r in recs} == set(METRICS)
    assert len({r["sensor"] for r in recs}) == 21
    assert all(r["sensor"].startswith(r["city"].lower().replace(" ", "-")) for r in recs)
    ids = [r["id"] for r in recs]
    dups = len(ids) - len(set(ids))
    assert 500 < dups < 1500
    glitches = sum(r["value"] == -999.0 for r in recs)
    assert 30 < glitches < 200


def test_taxi_records() -> None:
    recs = list(generate("taxi", seed=1, count=10000, rate=100, cells=50, taxis=20))
    r = recs[0]
    assert {"medallion", "hack_license", "pickup_cell", "dropoff_cell", "fare", "tip", "total",
            "distance", "payment", "trip_time_s", "pickup_ts", "dropoff_ts"} <= set(r)  # fmt: skip
    assert all(x["dropoff_ts"] == x["ts"] and x["pickup_ts"] < x["ts"] for x in recs)
    assert len({x["medallion"] for x in recs}) == 20
    assert all(re.fullmatch(r"[0-9A-F]{32}", x["medallion"]) for x in recs)
    cell = re.compile(r"(\d+)\.(\d+)")
    for x in recs:
        for c in (x["pickup_cell"], x["dropoff_cell"]):
            m = cell.fullmatch(c)
            assert m is not None
            assert c == "0.0" or (1 <= int(m[1]) <= 50 and 1 <= int(m[2]) <= 50)
    assert all(x["tip"] == 0.0 for x in recs if x["payment"] == "CSH")
    invalid = sum(x["distance"] == 0 or x["pickup_cell"] == "0.0" for x in recs)
    assert 30 < invalid < 200
    routes = [(x["pickup_cell"], x["dropoff_cell"]) for x in recs]
    assert max(routes.count(rt) for rt in set(routes[:200])) > 5  # hotspots make repeats


def test_words_and_counter() -> None:
    lines = list(generate("words", seed=2, count=500, rate=10))
    assert all(4 <= len(r["line"].split()) <= 14 for r in lines)
    words = [w for r in lines for w in r["line"].split()]
    assert words.count("the") > words.count("cloud")
    keys = {r["key"] for r in generate("counter", seed=2, count=500, rate=10, keys=4)}
    assert keys == {"k0", "k1", "k2", "k3"}
    assert list(generate("counter", seed=1, count=0, rate=5)) == []


def test_unbounded_without_count() -> None:
    it = generate("counter", seed=0, rate=10)
    assert len(list(itertools.islice(it, 10_000))) == 10_000


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate": 0},
        {"rate": 10, "count": -1},
        {"rate": 10, "disorder_ms": -1},
        {"rate": 10, "sensorz": 3},
        {"rate": 10, "sensors": 0},
    ],
)
def test_bad_generator_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(DatasetError):
        generate_batches("urban", **kwargs)


def test_unknown_dataset() -> None:
    with pytest.raises(DatasetError, match="urban, taxi, words, counter"):
        generate_batches("weather", rate=1)


@pytest.mark.parametrize("dataset", DATASETS)
def test_spec_defaults_are_generator_arguments(dataset: str) -> None:
    spec = parse_spec(
        {
            "name": "d",
            "sources": [{"id": "s", "peer": "p", "connector": "generator",
                         "params": {"dataset": dataset, "rate": 10, "count": 3}}],
            "sinks": [{"id": "o", "peer": "p", "connector": "stdout", "inputs": ["s"]}],
        }
    )  # fmt: skip
    params = spec.sources[0].params
    assert len(list(generate(dataset, **generator_kwargs(params)))) == 3


# --- files ---------------------------------------------------------------------------


def test_jsonl_bad_lines_counted() -> None:
    lines: list[str | bytes] = [
        '{"ts": 1, "a": 1}',
        "",
        "{broken",
        '"just a string"',
        '{"a": 2}',
        '{"ts": "soon"}',
        '{"ts": 3.0, "b": null}',
        '{"ts": true}',
        b'{"ts": 4, "x": "\xff"}',
        b'{"ts": 5}\r\n',
        "x" * (MAX_LINE + 1),
    ]
    stats = ParseStats()
    recs = list(parse_jsonl(lines, stats))
    assert recs == [{"ts": 1, "a": 1}, {"ts": 3, "b": None}, {"ts": 5}]
    assert type(recs[1]["ts"]) is int
    assert (stats.lines, stats.records, stats.bad) == (11, 3, 7)
    assert [e.line for e in stats.errors] == [3, 4, 5, 6, 8, 9, 11]
    assert all(isinstance(e, ParseError) for e in stats.errors)
    assert "not valid JSON" in stats.errors[0].reason
    assert "no 'ts' field" in str(stats.errors[2])
    assert "UTF-8" in stats.errors[5].reason


def test_csv_numbers_and_bad_rows() -> None:
    text = [
        "ts,city,value,code,note",
        "1,Geneva,12.5,007,hello",
        "2,Boston,-3,1e3,",
        "3,Rio,1,2",
        '4,"Rio, RJ",.5,+4,"quoted, comma"',
        "five,x,1,2,3",
        "",
        "6,nan,inf,-,x",
    ]
    stats = ParseStats()
    recs = list(parse_csv(text, stats))
    assert recs == [
        {"ts": 1, "city": "Geneva", "value": 12.5, "code": 7, "note": "hello"},
        {"ts": 2, "city": "Boston", "value": -3, "code": 1000.0, "note": None},
        {"ts": 4, "city": "Rio, RJ", "value": 0.5, "code": 4, "note": "quoted, comma"},
        {"ts": 6, "city": "nan", "value": "inf", "code": "-", "note": "x"},
    ]
    assert [e.line for e in stats.errors] == [4, 6]
    assert "4 fields, the header has 5" in stats.errors[0].reason


def test_csv_bad_header() -> None:
    stats = ParseStats()
    assert list(parse_csv(["ts,,x", "1,2,3", "4,5,6"], stats)) == []
    assert stats.bad == 3
    assert "header" in stats.errors[0].reason


def test_read_file(tmp_path: Path) -> None:
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"ts": 1}\n\xff\xfe\n{"ts": 2}\n')
    stats = ParseStats()
    assert list(read_file(p, "jsonl", stats)) == [{"ts": 1}, {"ts": 2}]
    assert stats.bad == 1


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.text(max_size=40)), max_size=20))
def test_any_garbage_is_parsed_or_counted(lines: list[str | bytes]) -> None:
    for parse in (parse_jsonl, parse_csv):
        stats = ParseStats()
        recs = list(parse(lines, stats))
        assert stats.records == len(recs)
        assert all(isinstance(r, dict) and type(r["ts"]) is int for r in recs)
        assert stats.bad == len(stats.errors)
        assert stats.records + stats.bad <= stats.lines + 1
