"""Snapshot mid-stream, restore into a fresh operator: identical results."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.operators import (
    FINAL_WATERMARK,
    Aggregate,
    Dedupe,
    Join,
    Operator,
    TopK,
    Union,
    Window,
)

Event = tuple[str, int, Any]

FACTORIES: dict[str, Callable[..., Operator]] = {
    "window-tumbling": lambda state=None: Window(
        size_ms=20, aggregate="mean", key="k", field="v", state=state
    ),
    "window-sliding": lambda state=None: Window(
        size_ms=30, slide_ms=10, aggregate="max", key="k", field="v", state=state
    ),
    "window-count": lambda state=None: Window(size_ms=25, aggregate="count", state=state),
    "join": lambda state=None: Join(key="k", window_ms=20, state=state),
    "top_k": lambda state=None: TopK(k=3, by="v", window_ms=20, state=state),
    "dedupe": lambda state=None: Dedupe(key="k", ttl_ms=15, state=state),
    "aggregate": lambda state=None: Aggregate(aggregate="mean", key="k", field="v", state=state),
    "union": lambda state=None: _union(state),
}


def _union(state: bytes | None) -> Operator:
    u = Union(inputs=2)
    if state is not None:
        u.restore(state)
    return u


def events(seed: int, inputs: int) -> list[Event]:
    rng = random.Random(seed)
    out: list[Event] = []
    top = [0] * inputs
    for _ in range(rng.randint(1, 40)):
        i = rng.randrange(inputs)
        batch = []
        for _ in range(rng.randint(0, 8)):
            top[i] += rng.randint(0, 4)
            ts = top[i] - rng.randint(0, 5)
            batch.append({"ts": ts, "k": rng.choice(["a", "b", 3, None]), "v": rng.random()})
        out.append(("batch", i, batch))
        if rng.random() < 0.5:
            out.append(("wm", i, top[i] - 5))
    out += [("wm", i, FINAL_WATERMARK) for i in range(inputs)]
    return out


def drive(op: Operator, evs: list[Event]) -> list[Any]:
    out: list[Any] = []
    for kind, i, what in evs:
        if kind == "batch":
            out.append(("r", op.on_batch(i, what)))
        else:
            recs, wm = op.on_watermark(i, what)
            out.append(("w", recs, wm))
    return out


@pytest.mark.parametrize("name", sorted(FACTORIES))
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32), split=st.floats(0, 1))
def test_restore_mid_stream_gives_identical_results(name: str, seed: int, split: float) -> None:
    make = FACTORIES[name]
    inputs = make().inputs
    evs = events(seed, inputs)
    at = int(split * len(evs))
    whole = drive(make(), evs)
    first = make()
    head = drive(first, evs[:at])
    state = first.snapshot()
    # records in a snapshot survive a msgpack round trip of the bytes' container
    state = msgpack.unpackb(msgpack.packb({"s": state}))["s"]
    tail = drive(make(state=state), evs[at:])
    assert head + tail == whole


def test_snapshot_is_msgpack_with_state() -> None:
    w = Window(size_ms=10, aggregate="sum", key="k", field="v")
    w.on_batch(0, [{"ts": 1, "k": "a", "v": 2}])
    w.on_watermark(0, 3)
    snap = msgpack.unpackb(w.snapshot(), strict_map_key=False)
    assert snap["kind"] == "window"
    assert snap["wms"] == [3]
    assert snap["state"] == [[0, [["a", [2]]]]]
