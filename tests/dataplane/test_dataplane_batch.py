"""Batching by size and time; the wire codec and its strict validation."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agiledart.dataplane import (
    Batch,
    BatchDecodeError,
    Batcher,
    DataPlaneError,
    DataPlaneUsageError,
    ProtocolError,
    Trace,
    TracePoint,
)


def test_flush_by_size() -> None:
    b = Batcher("e1", max_records=3, max_delay_ms=1000)
    assert b.add("a", 0) is None
    assert b.add("b", 1) is None
    batch = b.add("c", 2)
    assert batch is not None
    assert (batch.edge, batch.seq, batch.records) == ("e1", 0, ["a", "b", "c"])
    assert len(b) == 0
    assert b.deadline is None
    assert b.add("d", 3) is None
    assert b.flush() == Batch("e1", 1, ["d"])
    assert b.flush() is None


def test_flush_by_time() -> None:
    b = Batcher("e1", max_records=100, max_delay_ms=10)
    assert b.add(1, 100.0) is None
    assert b.deadline == 110.0
    assert b.poll(109.9) is None
    assert b.add(2, 105.0) is None
    batch = b.poll(110.0)
    assert batch == Batch("e1", 0, [1, 2])
    assert b.poll(1000.0) is None
    # a late add past the deadline flushes immediately
    assert b.add(3, 200.0) is None
    assert b.add(4, 215.0) == Batch("e1", 1, [3, 4])


def test_zero_delay_flushes_every_record() -> None:
    b = Batcher("e", max_records=10, max_delay_ms=0)
    assert b.add("x", 5) == Batch("e", 0, ["x"])


def test_traces_ride_along_and_roundtrip() -> None:
    b = Batcher("e", max_records=3, max_delay_ms=50, first_seq=7)
    b.add({"v": 1}, 0)
    b.add({"v": 2}, 1, trace=Trace(99, 1.5))
    batch = b.add({"v": 3}, 2)
    assert batch is not None
    assert batch.seq == 7
    assert list(batch.traced()) == [({"v": 2}, Trace(99, 1.5))]
    again = Batch.decode(batch.encode())
    assert again == batch
    assert Batch.from_dict(batch.to_dict()) == batch


@pytest.mark.parametrize(
    "kwargs",
    [
        {"edge": "", "max_records": 1, "max_delay_ms": 1},
        {"edge": "e", "max_records": 0, "max_delay_ms": 1},
        {"edge": "e", "max_records": 1, "max_delay_ms": -1},
    ],
)
def test_batcher_misuse(kwargs: dict[str, Any]) -> None:
    edge = kwargs.pop("edge")
    with pytest.raises(DataPlaneUsageError):
        Batcher(edge, **kwargs)


@pytest.mark.parametrize(
    "obj",
    [
        [],
        {"e": "x", "s": 0},
        {"e": "x", "s": 0, "r": [], "z": 1},
        {"e": "", "s": 0, "r": []},
        {"e": 1, "s": 0, "r": []},
        {"e": "x", "s": -1, "r": []},
        {"e": "x", "s": True, "r": []},
        {"e": "x", "s": 1.0, "r": []},
        {"e": "x", "s": 0, "r": {}},
        {"e": "x", "s": 0, "r": [1], "t": [[1, 5, 0.0]]},
        {"e": "x", "s": 0, "r": [1], "t": [[0, -5, 0.0]]},
        {"e": "x", "s": 0, "r": [1], "t": [[0, 5, "now"]]},
        {"e": "x", "s": 0, "r": [1], "t": [[0, 5, float("nan")]]},
        {"e": "x", "s": 0, "r": [1], "t": [[0, 5]]},
        {"e": "x", "s": 0, "r": [1], "t": {}},
    ],
)
def test_invalid_dicts_rejected(obj: object) -> None:
    with pytest.raises(BatchDecodeError):
        Batch.from_dict(obj)
    with pytest.raises(BatchDecodeError):
        Batch.decode(msgpack.packb(obj))


def test_error_tree() -> None:
    assert issubclass(BatchDecodeError, ProtocolError)
    assert issubclass(ProtocolError, DataPlaneError)


@given(st.binary(max_size=200))
def test_decode_garbage_bytes(data: bytes) -> None:
    try:
        batch = Batch.decode(data)
    except BatchDecodeError:
        return
    assert isinstance(batch, Batch)


_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
_msg = st.recursive(
    _leaf,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=4),
    max_leaves=20,
)


@given(_msg | st.fixed_dictionaries({"e": _msg, "s": _msg, "r": _msg}, optional={"t": _msg}))
def test_decode_garbage_structures(obj: object) -> None:
    try:
        data = msgpack.packb(obj)
    except (OverflowError, ValueError):
        return  # hypothesis made something msgpack cannot carry at all
    try:
        batch = Batch.decode(data)
    except BatchDecodeError:
        return
    assert Batch.decode(batch.encode()) == batch or batch.records != batch.records  # NaN


_wire_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5)
_wire = st.recursive(
    _wire_leaf,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=4),
    max_leaves=20,
)


@given(
    st.text(min_size=1, max_size=8),
    st.integers(0, 2**63 - 1),
    st.lists(_wire, max_size=10),
)
def test_roundtrip(edge: str, seq: int, records: list[Any]) -> None:
    batch = Batch(edge, seq, records)
    again = Batch.decode(batch.encode())
    assert (again.edge, again.seq, again.traces) == (edge, seq, ())
    assert msgpack.packb(again.records) == msgpack.packb(records)


@pytest.mark.parametrize("record", [object(), 2**70, {1j: 2}])
def test_unencodable_record_is_local_misuse(record: object) -> None:
    with pytest.raises(DataPlaneUsageError):
        Batch("e", 0, [record]).encode()


def test_extend_takes_many_records_and_cut_numbers_full_batches() -> None:
    b = Batcher("e1", max_records=3, max_delay_ms=1000)
    assert not b.extend(["a", "b"], 0, [TracePoint(1, Trace(7, 1.0))])
    assert b.deadline == 1000
    assert b.extend(["c", "d", "e", "f", "g"], 5, [TracePoint(2, Trace(8, 2.0))])
    assert b.cut() == Batch("e1", 0, ["a", "b", "c"], (TracePoint(1, Trace(7, 1.0)),))
    assert b.deadline == 1000  # the rest waits since the first of them
    assert b.cut() == Batch("e1", 1, ["d", "e", "f"], (TracePoint(1, Trace(8, 2.0)),))
    assert b.cut() == Batch("e1", 2, ["g"])
    assert b.cut() is None
    assert b.deadline is None
    assert not b.extend([], 10)


def test_extend_reports_a_passed_deadline() -> None:
    b = Batcher("e1", max_records=100, max_delay_ms=10)
    assert not b.extend([1], 100.0)
    assert b.extend([2], 110.0)
    assert b.cut() == Batch("e1", 0, [1, 2])


@given(sizes=st.lists(st.integers(0, 9), max_size=12), size=st.integers(1, 5))
def test_extend_and_cut_keep_every_record_and_trace_in_order(sizes: list[int], size: int) -> None:
    b = Batcher("e", max_records=size, max_delay_ms=1e9)
    sent: list[int] = []
    traced: list[int] = []
    got: list[Batch] = []
    for n in sizes:
        records = list(range(len(sent), len(sent) + n))
        points = [TracePoint(i, Trace(r, 0.0)) for i, r in enumerate(records) if r % 3 == 0]
        sent += records
        traced += [r for r in records if r % 3 == 0]
        if b.extend(records, 0.0, points):
            while (batch := b.cut()) is not None:
                got.append(batch)
    while (batch := b.cut()) is not None:
        got.append(batch)
    assert [r for batch in got for r in batch.records] == sent
    assert [batch.seq for batch in got] == list(range(len(got)))
    assert all(len(batch.records) <= size for batch in got)
    assert [t.trace_id for batch in got for r, t in batch.traced() if r == t.trace_id] == traced
