"""encode/decode: any m of n fragments rebuild the state; corruption and misuse are typed."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.recovery import (
    MAX_BLOCK_SIZE,
    MAX_FRAGMENTS,
    CodecConfigError,
    Fragment,
    MixedFragmentsError,
    NotEnoughFragments,
    decode,
    encode,
    erasure,
    replicate,
)

IDS: dict[str, Any] = {"app": "urban", "instance": "per-city#0", "epoch": 7}


def pick_m_of_each_stripe(fragments: list[Fragment], rng: random.Random) -> list[Fragment]:
    """A random m-subset of each stripe's n fragments, all shuffled together."""
    chosen: list[Fragment] = []
    for stripe in sorted({f.stripe for f in fragments}):
        of_stripe = [f for f in fragments if f.stripe == stripe]
        chosen += rng.sample(of_stripe, of_stripe[0].m)
    rng.shuffle(chosen)
    return chosen


def flip(block: bytes, position: int) -> bytes:
    corrupted = bytearray(block)
    corrupted[position % len(block)] ^= 0x40
    return bytes(corrupted)


@st.composite
def codes(draw: st.DrawFn) -> tuple[int, int, int]:
    m = draw(st.integers(1, 10))
    k = draw(st.integers(0, 8))
    block_size = draw(st.sampled_from([1, 3, 16, 64, 1024]))
    return m, k, block_size


@settings(max_examples=300, deadline=None)
@given(codes(), st.binary(max_size=2000), st.randoms(use_true_random=False))
def test_any_m_of_n_rebuild_the_state(
    code: tuple[int, int, int], state: bytes, rng: random.Random
) -> None:
    m, k, block_size = code
    fragments = encode(state, m=m, k=k, block_size=block_size, **IDS)
    stripes = max(1, -(-len(state) // (m * block_size)))
    assert len(fragments) == (m + k) * stripes
    assert all(len(f.block) <= block_size for f in fragments)
    assert decode(pick_m_of_each_stripe(fragments, rng)) == state


@pytest.mark.parametrize(("m", "k"), [(1, 0), (1, 255), (255, 1), (200, 56), (128, 128)])
def test_extreme_codes(m: int, k: int) -> None:
    state = random.Random(m * 1000 + k).randbytes(5 * m + 3)
    fragments = encode(state, m=m, k=k, **IDS)
    assert len(fragments) == m + k
    assert decode(fragments[-m:]) == state  # as many parity fragments as possible


@pytest.mark.parametrize(
    "kwargs",
    [
        {"m": 0, "k": 2},
        {"m": -1, "k": 2},
        {"m": 4, "k": -1},
        {"m": 200, "k": 57},
        {"m": True, "k": 2},
        {"m": 4.0, "k": 2},
        {"m": 4, "k": 2, "block_size": 0},
        {"m": 4, "k": 2, "block_size": MAX_BLOCK_SIZE + 1},
        {"m": 4, "k": 2, "app": ""},
        {"m": 4, "k": 2, "instance": "x" * 257},
        {"m": 4, "k": 2, "epoch": -1},
        {"m": 4, "k": 2, "epoch": 2**63},
    ],
)
def test_bad_parameters_are_local_misuse(kwargs: dict[str, Any]) -> None:
    with pytest.raises(CodecConfigError):
        encode(b"state", **{**IDS, **kwargs})


def test_n_of_256_is_the_limit() -> None:
    assert len(encode(b"x", m=MAX_FRAGMENTS - 1, k=1, **IDS)) == MAX_FRAGMENTS


@given(st.binary(min_size=1, max_size=500), st.integers(0, 5), st.integers(0, 10**6))
def test_a_corrupt_block_is_skipped_for_another(state: bytes, bad: int, position: int) -> None:
    fragments = encode(state, m=4, k=2, **IDS)
    fragments[bad] = replace(fragments[bad], block=flip(fragments[bad].block, position))
    assert decode(fragments) == state
    with_bad = [fragments[bad], *[f for f in fragments if f.index != bad][:3]]
    with pytest.raises(NotEnoughFragments, match="1 corrupt skipped"):
        decode(with_bad)


@pytest.mark.parametrize(
    "change",
    [
        {"index": 5},
        {"length": 39},
        {"padding": 1},
        {"last": False},
        {"state_digest": bytes(32)},
        {"k": 3},
        {"block_digest": bytes(32)},
        {"block": b"short"},
    ],
)
def test_a_corrupt_header_is_skipped_too(change: dict[str, Any]) -> None:
    state = bytes(range(40))
    fragments = encode(state, m=4, k=2, **IDS)
    fragments[0] = replace(fragments[0], **change)
    assert decode(fragments) == state
    with pytest.raises(NotEnoughFragments):
        decode(fragments[:4])


def test_fewer_than_m_intact_fragments() -> None:
    fragments = encode(b"a state of some length", m=4, k=2, **IDS)
    for subset in (fragments[:3], fragments[3:], []):
        with pytest.raises(NotEnoughFragments):
            decode(subset)


@pytest.mark.timeout(20)
def test_duplicates_count_once() -> None:
    """zfec never returns when given one block number twice: we deduplicate first."""
    fragments = encode(b"duplicates", m=3, k=2, **IDS)
    with pytest.raises(NotEnoughFragments, match="2 of m=3"):
        decode([fragments[4], fragments[4], fragments[1]])
    assert decode([fragments[4], fragments[4], fragments[1], fragments[2]]) == b"duplicates"


@pytest.mark.parametrize("other", [{"epoch": 8}, {"instance": "per-city#1"}, {"app": "taxi"}])
def test_fragments_of_other_checkpoints_are_rejected(other: dict[str, Any]) -> None:
    ours = encode(b"same bytes", m=2, k=1, **IDS)
    theirs = encode(b"same bytes", m=2, k=1, **{**IDS, **other})
    with pytest.raises(MixedFragmentsError):
        decode([ours[0], theirs[1]])
    with pytest.raises(MixedFragmentsError):
        decode([*ours, theirs[0]])  # even with enough of ours: the caller must filter


def test_two_encodings_of_one_epoch_are_told_apart() -> None:
    """An instance that checkpointed an epoch twice (crash, replay): no mixed blocks."""
    first = encode(b"state as first written", m=2, k=2, **IDS)
    second = encode(b"state as written again", m=2, k=2, **IDS)
    assert decode([first[0], second[1], first[3]]) == b"state as first written"
    with pytest.raises(NotEnoughFragments, match="1 other encoding"):
        decode([first[0], second[1]])


def test_the_callers_list_is_never_given_to_zfec(monkeypatch: pytest.MonkeyPatch) -> None:
    """zfec's Decoder.decode reorders its block list in place."""
    given_to_zfec: list[list[bytes]] = []
    real = erasure._zfec_decoder

    class Spy:
        def __init__(self, m: int, n: int) -> None:
            self.decoder = real(m, n)

        def decode(self, blocks: list[bytes], indices: list[int]) -> list[bytes]:
            given_to_zfec.append(blocks)
            return self.decoder.decode(blocks, indices)  # type: ignore[no-any-return]

    monkeypatch.setattr(erasure, "_zfec_decoder", Spy)
    state = bytes(range(256)) * 3
    fragments = encode(state, m=4, k=2, **IDS)
    caller = [fragments[5], fragments[4], fragments[0], fragments[1]]
    before = list(caller)
    assert decode(caller) == state
    assert decode(caller) == state  # and again, from the same list
    assert len(given_to_zfec) == 2
    assert all(a is b for a, b in zip(caller, before, strict=True))
    assert given_to_zfec[0] is not given_to_zfec[1]
    assert [b for b in given_to_zfec[0]] != [f.block for f in caller]  # zfec did reorder


def test_replication_is_m_equals_one() -> None:
    state = b"small state" * 10
    copies = replicate(state, copies=3, **IDS)
    assert [(f.m, f.k, f.block) for f in copies] == [(1, 2, state)] * 3
    assert all(decode([copy]) == state for copy in copies)
    assert copies == encode(state, m=1, k=2, **IDS)
    with pytest.raises(CodecConfigError):
        replicate(state, copies=0, **IDS)


def test_replication_across_stripes() -> None:
    state = bytes(range(100))
    copies = replicate(state, copies=2, block_size=30, **IDS)
    assert len(copies) == 2 * 4
    assert decode([c for c in copies if c.stripe % 2 == c.index]) == state
