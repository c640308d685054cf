"""Replicas of one operator on one peer (agiledart.runtime.replicas): batches split by
key or in runs, outputs combined, and keyed state merged and re-split exactly when the
replica count changes mid-stream: the output equals one instance's."""

from __future__ import annotations

import json
import random
from typing import Any

import msgpack
import pytest

from agiledart.app import parse_spec
from agiledart.app.errors import ExecutionError
from agiledart.local.executor import Emission, Executor
from agiledart.operators.base import FINAL_WATERMARK
from agiledart.runtime.replicas import (
    combine,
    merge_snapshots,
    replica_of,
    split_records,
    split_snapshot,
)

OPERATORS: dict[str, dict[str, Any]] = {
    "window": {"op": "window", "params": {"size_ms": 50, "key": "key", "aggregate": "count"}},
    "sliding": {
        "op": "window",
        "params": {"size_ms": 60, "slide_ms": 20, "key": "key", "aggregate": "mean", "field": "v"},
    },
    "aggregate": {"op": "aggregate", "params": {"key": "key", "aggregate": "sum", "field": "v"}},
    "dedupe": {"op": "dedupe", "params": {"key": "key", "ttl_ms": 40}},
    "join": {"op": "join", "params": {"key": "key", "window_ms": 50}},
    "map": {"op": "map", "fn": "builtin:identity"},
}


def spec_of(kind: str) -> Any:
    op = {"id": "op", **OPERATORS[kind], "inputs": ["a", "b"] if kind == "join" else ["a"]}
    sources = [
        {
            "id": s,
            "peer": "p",
            "connector": "generator",
            "params": {"dataset": "counter", "rate": 10, "count": 10},
        }
        for s in (["a", "b"] if kind == "join" else ["a"])
    ]
    return parse_spec(
        {
            "name": "r",
            "sources": sources,
            "operators": [op],
            "sinks": [{"id": "out", "peer": "p", "connector": "discard", "inputs": ["op"]}],
        }
    )


def stream(seed: int, n: int = 600) -> list[tuple[str, list[dict[str, Any]] | int]]:
    """Batches from inputs a and b (random keys, ts rising with jitter) and watermarks."""
    rng = random.Random(seed)
    out: list[tuple[str, list[dict[str, Any]] | int]] = []
    ts = 0
    for i in range(0, n, 20):
        for src in ("a", "b"):
            batch = []
            for j in range(20):
                ts += rng.randint(0, 2)
                key: Any = rng.choice(["x", "y", 3, 4, None, "zz", 7.5])
                batch.append({"ts": ts, "key": key, "v": rng.randint(0, 9), "seq": i + j})
            out.append((src, batch))
        out += [("a", ts - 5), ("b", ts - 5)]
    out += [("a", FINAL_WATERMARK), ("b", FINAL_WATERMARK)]
    return out


def canonical(emitted: list[Emission]) -> list[str]:
    return sorted(
        json.dumps(r, sort_keys=True, default=str)
        for _, rs in emitted
        if isinstance(rs, list)
        for r in rs
    )


def run(kind: str, counts: list[int], seed: int = 1) -> list[str]:
    """Run the stream with the replica count changed to ``counts[i]`` at the i-th
    tenth of it, returning every record emitted."""
    spec = spec_of(kind)
    inputs = {"a", "b"} if kind == "join" else {"a"}
    field = None if kind == "map" else "key"
    units = [Executor(spec, operators=["op"])]
    steps = [s for s in stream(seed) if s[0] in inputs]
    out: list[Emission] = []
    every = max(1, len(steps) // len(counts))
    for i, (src, what) in enumerate(steps):
        n = counts[min(i // every, len(counts) - 1)]
        if n != len(units):
            if OPERATORS[kind]["op"] == "map":
                units = [Executor(spec, operators=["op"]) for _ in range(n)]
            else:
                merged = merge_snapshots([u.snapshot()["op"] for u in units])
                parts = split_snapshot(merged, n)
                units = [Executor(spec, operators=["op"], states={"op": p}) for p in parts]
        if isinstance(what, list):
            parts_in = split_records(what, len(units), field)
            outs = [u.feed(src, p) for u, p in zip(units, parts_in, strict=True) if p]
        else:
            outs = [u.watermark(src, what) for u in units]
        out += combine(outs)
    return canonical(out)


@pytest.mark.parametrize("kind", sorted(OPERATORS))
def test_changing_the_replica_count_mid_stream_gives_one_instances_output(kind: str) -> None:
    one = run(kind, [1])
    assert one  # the stream makes output
    assert run(kind, [1, 3, 3, 2, 4, 1, 1, 2]) == one
    assert run(kind, [2, 1, 5]) == one


def test_keyed_batches_go_to_the_replica_owning_the_key() -> None:
    records = [{"key": k, "i": i} for i, k in enumerate(["a", "b", "c", "a", 1, None, "b"])]
    parts = split_records(records, 3, "key")
    assert sum(len(p) for p in parts) == len(records)
    for i, part in enumerate(parts):
        assert all(replica_of(r["key"], 3) == i for r in part)
        assert [r["i"] for r in part] == sorted(r["i"] for r in part)  # order kept


def test_unkeyed_batches_split_in_runs_that_concatenate_to_the_input() -> None:
    records = [{"i": i} for i in range(10)]
    parts = split_records(records, 3, None)
    assert [len(p) for p in parts] == [4, 3, 3]
    assert [r for p in parts for r in p] == records
    assert split_records(records, 1, None) == [records]


def test_combined_outputs_put_records_before_the_lowest_watermark() -> None:
    outs: list[list[Emission]] = [
        [("op", [{"n": 1}]), ("op", 10)],
        [("op", [{"n": 2}]), ("op", 8)],
        [("op", 9)],
    ]
    assert combine(outs) == [("op", [{"n": 1}, {"n": 2}]), ("op", 8)]


def test_a_state_that_is_not_per_key_cannot_be_split() -> None:
    blob = msgpack.packb({"v": 1, "kind": "top_k", "wms": [0], "out_wm": 0, "state": []})
    with pytest.raises(ExecutionError, match="cannot be split by key"):
        split_snapshot(blob, 2)
    with pytest.raises(ExecutionError, match="not an operator snapshot"):
        split_snapshot(msgpack.packb([1, 2]), 2)
