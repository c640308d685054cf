"""Deterministic 5% trace sampling and sink-side latency."""

from __future__ import annotations

import pytest

from agiledart.dataplane import (
    Batch,
    Batcher,
    DataPlaneUsageError,
    TraceSampler,
    trace_latency,
)


def _picks(seed: int, n: int) -> list[int]:
    s = TraceSampler(rate=0.05, seed=seed)
    return [i for i in range(n) if s.sample(float(i)) is not None]


def test_deterministic_given_seed() -> None:
    assert _picks(7, 5000) == _picks(7, 5000)
    assert _picks(7, 5000) != _picks(8, 5000)


def test_rate_close_to_five_percent() -> None:
    s = TraceSampler(rate=0.05, seed=1)
    for i in range(100_000):
        s.sample(float(i))
    assert s.seen == 100_000
    assert 4500 < s.sampled < 5500


def test_rate_one_samples_all() -> None:
    s = TraceSampler(rate=1.0, seed=0)
    assert all(s.sample(0.0) is not None for _ in range(100))


def test_end_to_end_latency() -> None:
    sampler = TraceSampler(rate=0.05, seed=3)
    b = Batcher("src->sink", max_records=1000, max_delay_ms=10_000)
    for i in range(1000):
        batch = b.add(i, 1000.0 + i, trace=sampler.sample(1000.0 + i))
    assert batch is not None
    wire = Batch.decode(batch.encode())
    latencies = [trace_latency(tr, now=2500.0) for _, tr in wire.traced()]
    assert len(latencies) == sampler.sampled > 0
    assert latencies == [2500.0 - (1000.0 + rec) for rec, _ in wire.traced()]


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5])
def test_bad_rate(rate: float) -> None:
    with pytest.raises(DataPlaneUsageError):
        TraceSampler(rate=rate)


@pytest.mark.parametrize("rate", [0.05, 0.5, 1.0])
def test_sample_batch_draws_as_many_single_samples(rate: float) -> None:
    one, many = TraceSampler(rate=rate, seed=3), TraceSampler(rate=rate, seed=3)
    singles = [(i, t) for i in range(2500) if (t := one.sample(9.0)) is not None]
    batched = [
        (start + i, t)
        for start, n in ((0, 1000), (1000, 1), (1001, 0), (1001, 1499))
        for i, t in many.sample_batch(n, 9.0)
    ]
    assert batched == singles
    assert (many.seen, many.sampled) == (one.seen, one.sampled)


@pytest.mark.parametrize(("rate", "n"), [(0.05, 1000), (0.003, 1000), (1.0, 7), (0.5, 1)])
def test_sample_count_gives_the_expected_count_its_fraction_at_random(rate: float, n: int) -> None:
    sampler = TraceSampler(rate=rate, seed=5)
    counts = [len(sampler.sample_count(n, 4.0)) for _ in range(2000)]
    expected = n * rate
    assert set(counts) <= {int(expected), int(expected) + 1}
    assert abs(sum(counts) / len(counts) - expected) < 0.05 + expected * 0.02
    assert (sampler.seen, sampler.sampled) == (2000 * n, sum(counts))
    again = TraceSampler(rate=rate, seed=5)
    assert [len(again.sample_count(n, 4.0)) for _ in range(2000)] == counts
    assert all(t.source_ts == 4.0 for t in sampler.sample_count(n, 4.0))
