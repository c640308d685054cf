"""The data plane's wire frames: the same bytes as before, every bad frame one FrameError."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agiledart.dataplane import Batch, BatchDecodeError, ProtocolError, Trace, TracePoint
from agiledart.dataplane.errors import FrameError
from agiledart.dataplane.frames import (
    BarrierFrame,
    CreditFrame,
    DataFrame,
    WatermarkFrame,
    check_records,
)

BATCH = Batch("src|p1", 7, [{"ts": 1}, {"ts": 2}], (TracePoint(1, Trace(99, 1.5)),))

#: each frame beside the map the runtime wrote before the frames were typed
GOOD: list[tuple[Any, dict[str, Any]]] = [
    (
        DataFrame("app", "src", BATCH, 3),
        {
            "a": "app",
            "p": "src",
            "b": {"e": "src|p1", "s": 7, "r": [{"ts": 1}, {"ts": 2}], "t": [[1, 99, 1.5]]},
            "g": 3,
        },
    ),
    (
        DataFrame("app", "src", Batch("src|p1", 0, []), 0),
        {"a": "app", "p": "src", "b": {"e": "src|p1", "s": 0, "r": []}, "g": 0},
    ),
    (
        WatermarkFrame("app", "src", 1000, 12.5, 2),
        {"a": "app", "p": "src", "w": 1000, "c": 12.5, "g": 2},
    ),
    (BarrierFrame("app", "m", 4, 1), {"a": "app", "p": "m", "e": 4, "g": 1}),
    (CreditFrame("app", "src|p1", 1, 5), {"a": "app", "e": "src|p1", "n": 1, "g": 5}),
    (
        CreditFrame("app", "src|p1", 0, 0, gone=True),
        {"a": "app", "e": "src|p1", "n": 0, "g": 0, "gone": True},
    ),
]


@pytest.mark.parametrize(("frame", "wire"), GOOD, ids=[type(f).__name__ for f, _ in GOOD])
def test_a_frame_is_the_same_bytes_on_the_wire_as_before(frame: Any, wire: dict[str, Any]) -> None:
    assert msgpack.packb(frame.to_wire()) == msgpack.packb(wire)
    assert type(frame).from_wire(msgpack.unpackb(msgpack.packb(wire))) == frame


def test_the_generation_may_be_left_out() -> None:
    assert BarrierFrame.from_wire({"a": "x", "p": "s", "e": 1}).generation == 0
    assert CreditFrame.from_wire({"a": "x", "e": "s|p", "n": 2}) == CreditFrame("x", "s|p", 2)


@pytest.mark.parametrize("clock", [None, "noon", float("nan"), [1]])
def test_a_watermark_without_a_usable_clock_reads_as_zero(clock: Any) -> None:
    raw = {"a": "x", "p": "s", "w": 10} | ({} if clock is None else {"c": clock})
    assert WatermarkFrame.from_wire(raw) == WatermarkFrame("x", "s", 10, 0.0)


B = {"e": "s|p", "s": 0, "r": []}
BAD: list[tuple[type[Any], Any]] = [
    (DataFrame, None),
    (DataFrame, [1, 2]),
    (DataFrame, {"a": 5, "p": "src", "b": B}),
    (DataFrame, {"a": "", "p": "src", "b": B}),
    (DataFrame, {"a": "app", "b": B}),
    (DataFrame, {"a": "app", "p": "src"}),
    (DataFrame, {"a": "app", "p": "src", "b": [1, 2, 3]}),
    (DataFrame, {"a": "app", "p": "src", "b": {"r": [{"x": 1}]}}),
    (DataFrame, {"a": "app", "p": "src", "b": {**B, "s": -1}}),
    (DataFrame, {"a": "app", "p": "src", "b": {**B, "t": 5}}),
    (DataFrame, {"a": "app", "p": "src", "b": {**B, "r": [{}], "t": [[0, 9, 1.0], "junk"]}}),
    (DataFrame, {"a": "app", "p": "src", "b": {**B, "r": [{}], "t": [[1, 9, 1.0]]}}),
    (DataFrame, {"a": "app", "p": "src", "b": B, "g": "1"}),
    (DataFrame, {"a": "app", "p": "src", "b": B, "g": -1}),
    (WatermarkFrame, {"a": "app", "p": "src", "w": "soon"}),
    (WatermarkFrame, {"a": "app", "p": "src", "w": 1.5}),
    (WatermarkFrame, {"a": "app", "p": "src", "w": True}),
    (WatermarkFrame, {"a": "app", "w": 10}),
    (WatermarkFrame, {"a": "app", "p": "src", "w": 10, "g": None}),
    (BarrierFrame, {"a": "app", "p": "src"}),
    (BarrierFrame, {"a": "app", "p": "src", "e": "1"}),
    (BarrierFrame, {"p": "src", "e": 1}),
    (BarrierFrame, "bar"),
    (CreditFrame, {"a": "app", "e": "s|p"}),
    (CreditFrame, {"a": "app", "e": 3, "n": 1}),
    (CreditFrame, {"a": "app", "e": "s|p", "n": 0}),
    (CreditFrame, {"a": "app", "e": "s|p", "n": -1, "gone": True}),
    (CreditFrame, {"a": "app", "e": "s|p", "n": 1, "gone": "yes"}),
    (CreditFrame, {"e": "s|p", "n": 1}),
]


@pytest.mark.parametrize(
    ("cls", "raw"), BAD, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(BAD)]
)
def test_every_bad_frame_is_one_frame_error(cls: type[Any], raw: Any) -> None:
    with pytest.raises(FrameError) as info:
        cls.from_wire(raw)
    assert isinstance(info.value, ProtocolError)


def test_a_bad_batch_inside_a_data_frame_is_a_batch_decode_error() -> None:
    with pytest.raises(BatchDecodeError):
        DataFrame.from_wire({"a": "app", "p": "src", "b": {"e": "s|p", "s": "0", "r": []}})


def test_records_that_are_not_maps_are_malformed() -> None:
    check_records(Batch("s|p", 0, [{"a": 1}, {}]))
    check_records(Batch("s|p", 0, []))
    for records in ([1, "two", None], [{"a": 1}, 2]):
        with pytest.raises(FrameError):
            check_records(Batch("s|p", 0, records))


FRAMES = (DataFrame, WatermarkFrame, BarrierFrame, CreditFrame)
leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
garbage = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["a", "p", "b", "e", "s", "r", "t", "w", "c", "g", "n", "gone"]),
            inner,
            max_size=6,
        )
    ),
    max_leaves=20,
)


@given(raw=garbage, which=st.sampled_from(FRAMES))
def test_any_garbage_is_a_frame_or_a_frame_error(raw: Any, which: type[Any]) -> None:
    try:
        frame = which.from_wire(raw)
    except FrameError:
        return
    assert type(frame).from_wire(frame.to_wire()) == frame
