"""Fragment wire format: round trip, strict limits, and garbage -> FragmentError only."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agiledart.recovery import (
    MAX_BLOCK_SIZE,
    CheckpointId,
    Fragment,
    FragmentError,
    decode,
    encode,
)
from agiledart.recovery.fragment import FORMAT_VERSION, MAX_ID_CHARS, MAX_WIRE_SIZE

IDS: dict[str, Any] = {"app": "urban", "instance": "per-city#0", "epoch": 7}
ONE = encode(b"0123456789", m=3, k=2, **IDS)[4]


def parse(data: bytes) -> Fragment | None:
    """from_bytes, with FragmentError (the only error allowed) as None."""
    try:
        return Fragment.from_bytes(data)
    except FragmentError:
        return None


@settings(deadline=None)
@given(st.binary(max_size=1000), st.integers(1, 6), st.integers(0, 4), st.integers(1, 300))
def test_round_trip(state: bytes, m: int, k: int, block_size: int) -> None:
    for fragment in encode(state, m=m, k=k, block_size=block_size, **IDS):
        wire = fragment.to_bytes()
        assert Fragment.from_bytes(wire) == fragment
        assert Fragment.from_bytes(bytearray(wire)) == fragment
        assert Fragment.from_bytes(memoryview(wire)) == fragment


def test_identity() -> None:
    assert ONE.checkpoint == CheckpointId("urban", "per-city#0", 7)
    assert (ONE.index, ONE.m, ONE.k, ONE.n, ONE.stripe, ONE.last) == (4, 3, 2, 5, 0, True)
    assert (ONE.length, ONE.padding, len(ONE.block)) == (10, 2, 4)


def test_the_largest_fragment_fits_the_wire_limit() -> None:
    biggest = replace(
        ONE, app="\U0001f600" * MAX_ID_CHARS, instance="\U0001f600" * MAX_ID_CHARS,
        epoch=2**63 - 1, stripe=2**32 - 1, m=1, k=255, index=255,
        length=MAX_BLOCK_SIZE, padding=0, block=bytes(MAX_BLOCK_SIZE),
    ).sealed()  # fmt: skip
    wire = biggest.to_bytes()
    assert len(wire) <= MAX_WIRE_SIZE
    assert Fragment.from_bytes(wire) == biggest
    biggest.verify()


def test_oversized_input_is_refused_unread() -> None:
    with pytest.raises(FragmentError, match="exceeds"):
        Fragment.from_bytes(bytes(MAX_WIRE_SIZE + 1))


@settings(max_examples=500)
@given(st.binary(max_size=400))
@example(b"")
@example(b"\x9e")
@example(b"\xdd\xff\xff\xff\xff")  # array32 claiming 4G items
@example(b"\xc6\xff\xff\xff\xff")  # bin32 claiming 4 GiB
@example(b"\x91" * 5000)  # deep nesting
@example(ONE.to_bytes() + b"\x00")  # trailing byte
@example(ONE.to_bytes()[:-1])  # truncated
def test_garbage_raises_fragment_error_only(data: bytes) -> None:
    parse(data)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=16) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=30,
)  # fmt: skip


@given(msgpack_values)
def test_wellformed_msgpack_of_the_wrong_shape(value: object) -> None:
    assert parse(msgpack.packb(value)) is None


field_values = (
    st.none() | st.booleans() | st.integers(-3, 300) | st.text(max_size=3)
    | st.binary(max_size=40) | st.lists(st.integers(0, 9), max_size=2)
)  # fmt: skip


@given(st.lists(field_values, min_size=13, max_size=13), st.sets(st.integers(0, 12)))
def test_fields_of_the_wrong_type_or_range(values: list[Any], keep: set[int]) -> None:
    """Version 1 arrays whose fields are partly valid, partly random."""
    fields = [*ONE.header()[1:], ONE.block_digest, ONE.block]
    mixed = [fields[i] if i in keep else value for i, value in enumerate(values)]
    parse(msgpack.packb([FORMAT_VERSION, *mixed]))


@settings(max_examples=300)
@given(st.integers(0, 8 * len(ONE.to_bytes()) - 1))
def test_every_bit_flip_is_caught(bit: int) -> None:
    wire = bytearray(ONE.to_bytes())
    wire[bit // 8] ^= 1 << (bit % 8)
    fragment = parse(bytes(wire))
    if fragment is not None:
        with pytest.raises(FragmentError):
            fragment.verify()


@pytest.mark.parametrize(
    "change",
    [
        {"epoch": True},
        {"epoch": -1},
        {"m": 0},
        {"k": 254},
        {"index": 5},
        {"last": 1},
        {"app": ""},
        {"app": b"urban"},
        {"state_digest": bytes(31)},
        {"block": bytearray(4)},
        {"padding": 1},
        {"length": 13},
    ],
)
def test_out_of_range_fields(change: dict[str, Any]) -> None:
    bad = replace(ONE, **change)
    with pytest.raises(FragmentError):
        bad.check_layout()
    with pytest.raises(FragmentError):
        bad.verify()
    # msgpack cannot carry a bytearray apart from bytes: check the rest on the wire too
    if "block" not in change:
        assert parse(bad.to_bytes()) is None


def test_wire_fragments_decode() -> None:
    fragments = encode(b"over the wire", m=2, k=2, **IDS)
    received = [Fragment.from_bytes(f.to_bytes()) for f in fragments[2:]]
    assert decode(received) == b"over the wire"
