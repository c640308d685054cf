"""Striped states: one fragment per holder per stripe, encoded and decoded lazily."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.recovery import (
    CodecConfigError,
    Fragment,
    MixedFragmentsError,
    NotEnoughFragments,
    StripeDecoder,
    StripeEncoder,
    decode,
    decode_stream,
    encode,
    encode_stream,
)

IDS: dict[str, Any] = {"app": "urban", "instance": "per-city#0", "epoch": 7}


def split(state: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(state), *(c % (len(state) + 1) for c in cuts)})
    return [state[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=3000),
    st.lists(st.integers(0, 3000), max_size=12),
    st.integers(1, 6),
    st.integers(0, 3),
    st.integers(1, 200),
    st.randoms(use_true_random=False),
)
def test_stream_round_trip(
    state: bytes, cuts: list[int], m: int, k: int, block_size: int, rng: random.Random
) -> None:
    stripes = list(encode_stream(split(state, cuts), m=m, k=k, block_size=block_size, **IDS))
    assert [f for stripe in stripes for f in stripe] == encode(
        state, m=m, k=k, block_size=block_size, **IDS
    )
    assert [s[0].stripe for s in stripes] == list(range(len(stripes)))
    assert [s[0].last for s in stripes] == [False] * (len(stripes) - 1) + [True]
    for stripe in stripes:
        assert [f.index for f in stripe] == list(range(m + k))
        assert all(len(f.block) <= block_size for f in stripe)
    subsets = [rng.sample(stripe, m) for stripe in stripes]
    assert b"".join(decode_stream(subsets)) == state


def test_stripe_boundaries() -> None:
    block_size, m = 4, 2  # stripes of 8 bytes
    for size, stripes in [(0, 1), (1, 1), (8, 1), (9, 2), (16, 2), (17, 3)]:
        fragments = encode(bytes(size), m=m, k=1, block_size=block_size, **IDS)
        assert len(fragments) == 3 * stripes, size
        assert decode(fragments) == bytes(size)


def test_encoding_is_lazy() -> None:
    """At most one stripe and one chunk are read ahead of what was produced."""
    read: list[int] = []

    def chunks() -> Iterator[bytes]:
        for i in range(100):
            read.append(i)
            yield bytes([i]) * 10

    stripes = encode_stream(chunks(), m=2, k=1, block_size=10, **IDS)  # stripes of 20 bytes
    assert read == []
    first = next(stripes)
    assert first[0].stripe == 0
    assert len(read) == 3
    assert sum(1 for _ in stripes) == 49


def test_decoding_is_lazy() -> None:
    state = random.Random(1).randbytes(1000)
    stripes = list(encode_stream([state], m=3, k=1, block_size=10, **IDS))
    given: list[int] = []

    def fetched() -> Iterator[list[Fragment]]:
        for stripe in stripes:
            given.append(stripe[0].stripe)
            yield stripe[1:]

    parts = decode_stream(itertools.chain(fetched(), [[], []]))  # trailing groups: unread
    assert next(parts) == state[:30]
    assert given == [0]
    assert b"".join(parts) == state[30:]


def test_a_stream_that_stops_early() -> None:
    stripes = list(encode_stream([bytes(100)], m=2, k=1, block_size=10, **IDS))
    with pytest.raises(NotEnoughFragments, match="before the last stripe"):
        b"".join(decode_stream(stripes[:-1]))
    with pytest.raises(NotEnoughFragments):
        decode([f for stripe in stripes[:-1] for f in stripe])
    holed = [f for i, stripe in enumerate(stripes) for f in stripe if i != 2]
    with pytest.raises(NotEnoughFragments, match="stripe 2"):
        decode(holed)


def test_the_decoder_can_retry_a_stripe() -> None:
    stripes = list(encode_stream([bytes(range(60))], m=3, k=2, block_size=10, **IDS))
    decoder = StripeDecoder()
    with pytest.raises(NotEnoughFragments):
        decoder.decode_stripe(stripes[0][:2])
    assert (decoder.next_stripe, decoder.length, decoder.done) == (0, 0, False)
    assert decoder.decode_stripe(stripes[0][2:]) == bytes(range(30))
    assert decoder.decode_stripe(tuple(stripes[1][::-1])) == bytes(range(30, 60))
    assert (decoder.next_stripe, decoder.length, decoder.done) == (2, 60, True)
    with pytest.raises(CodecConfigError):
        decoder.decode_stripe(stripes[1])


def test_a_stripe_out_of_place_is_rejected() -> None:
    stripes = list(encode_stream([bytes(50)], m=2, k=1, block_size=10, **IDS))
    decoder = StripeDecoder()
    with pytest.raises(MixedFragmentsError, match="stripe 1"):
        decoder.decode_stripe(stripes[1])
    other = encode(bytes(50), m=2, k=1, block_size=10, **{**IDS, "epoch": 8})
    decoder.decode_stripe(stripes[0])
    with pytest.raises(MixedFragmentsError):
        decoder.decode_stripe(stripes[1][:1] + [f for f in other if f.stripe == 1])


def test_stripes_of_two_encodings_of_one_epoch_do_not_mix() -> None:
    """Each stripe carries the digest of the state so far: a foreign stripe fails it."""
    first = list(encode_stream([b"a" * 40], m=2, k=1, block_size=10, **IDS))
    second = list(encode_stream([b"b" * 40], m=2, k=1, block_size=10, **IDS))
    with pytest.raises(NotEnoughFragments, match="stripe 1"):
        b"".join(decode_stream([first[0], second[1]]))


def test_a_finished_encoder_is_closed() -> None:
    encoder = StripeEncoder(m=2, k=1, **IDS)
    assert encoder.feed(b"abc") == []
    assert decode(encoder.finish()) == b"abc"
    with pytest.raises(CodecConfigError):
        encoder.feed(b"more")
    with pytest.raises(CodecConfigError):
        encoder.finish()


def test_arguments_are_checked_before_any_chunk_is_read() -> None:
    def chunks() -> Iterator[bytes]:
        raise AssertionError("read")
        yield b""

    with pytest.raises(CodecConfigError):
        encode_stream(chunks(), m=0, k=1, **IDS)
