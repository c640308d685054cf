"""Duplicate batches are dropped; gaps are detected and listed."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from agiledart.dataplane import SequenceTracker


def test_in_order_and_duplicates() -> None:
    t = SequenceTracker()
    assert [t.accept(s) for s in (0, 1, 1, 2, 0)] == [True, True, False, True, False]
    s = t.statistics()
    assert (s.next_expected, s.delivered, s.duplicates, s.gaps_detected, s.missing) == (
        3,
        3,
        2,
        0,
        0,
    )


def test_gaps_detected_and_filled() -> None:
    t = SequenceTracker()
    for s in (0, 3, 4, 7):
        assert t.accept(s)
    assert t.missing() == [(1, 3), (5, 7)]
    assert t.statistics().gaps_detected == 2
    assert not t.accept(4)
    assert t.accept(1)
    assert t.accept(2)
    assert t.missing() == [(5, 7)]
    assert t.next_expected == 5
    assert t.accept(5)
    assert t.accept(6)
    assert t.missing() == []
    assert t.next_expected == 8
    assert t.statistics().delivered == 8


def test_resume_from() -> None:
    t = SequenceTracker(next_expected=10)
    assert not t.accept(9)
    assert t.accept(10)


@given(st.integers(1, 60), st.integers(0, 2**32), st.floats(0, 1))
def test_each_number_delivered_once(n: int, seed: int, dup_rate: float) -> None:
    rng = random.Random(seed)
    arrivals = list(range(n))
    arrivals += [rng.randrange(n) for _ in range(int(n * dup_rate))]
    rng.shuffle(arrivals)
    t = SequenceTracker()
    delivered = [s for s in arrivals if t.accept(s)]
    assert sorted(delivered) == list(range(n))
    assert t.missing() == []
    assert t.statistics().duplicates == len(arrivals) - n
