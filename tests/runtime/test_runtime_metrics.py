"""InstanceMeter: rate, service time, waiting, utilization over a sliding window."""

from __future__ import annotations

import pytest

from agiledart.runtime.metrics import InstanceMeter


def test_a_saturated_queue_has_utilization_one() -> None:
    m = InstanceMeter(0.0, window_s=10)
    m.queued(0.0)
    for k in range(100):  # back to back: 1,000 records in 0.1 s, never empty
        m.executed(k / 10, (k + 1) / 10, 1000, waited_s=0.05)
    r = m.reading(10.0)
    assert r.utilization == pytest.approx(1.0)
    assert r.busy == pytest.approx(1.0)
    assert r.rate == pytest.approx(10_000, rel=0.02)
    assert r.service_us == pytest.approx(100.0)
    assert r.wait_ms == pytest.approx(50.0)


def test_an_idle_inbox_counts_as_empty_time() -> None:
    m = InstanceMeter(0.0, window_s=10)
    for second in range(10):  # one item a second, queued 0.1 s, executed in 0.05 s
        m.queued(second)
        m.executed(second + 0.1, second + 0.15, 100, waited_s=0.1)
        m.drained(second + 0.15)
    r = m.reading(10.0)
    assert r.utilization == pytest.approx(0.15)
    assert r.busy == pytest.approx(0.05)
    assert r.rate == pytest.approx(100.0)
    assert r.service_us == pytest.approx(500.0)


def test_old_load_leaves_the_window() -> None:
    m = InstanceMeter(0.0, window_s=5)
    m.queued(0.0)
    m.executed(0.0, 1.0, 5000, waited_s=0.0)
    m.drained(1.0)
    assert m.reading(2.0).rate > 0
    later = m.reading(20.0)
    assert later.rate == 0
    assert later.utilization == 0
    assert later.service_us is None
    assert later.wait_ms is None


def test_a_stretch_still_open_counts_up_to_now() -> None:
    m = InstanceMeter(0.0, window_s=10)
    m.queued(1.0)  # fed from 1 s: the clock starts
    m.drained(3.0)
    m.queued(6.0)  # non-empty since 6 s, nothing executed yet (a stuck worker)
    assert m.reading(10.0).utilization == pytest.approx((2 + 4) / 9)


def test_the_wait_for_the_first_input_is_not_idleness() -> None:
    m = InstanceMeter(0.0, window_s=10)
    m.queued(5.0)  # deployed at 0, first input at 5
    assert m.reading(10.0).utilization == pytest.approx(1.0)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s"):
        InstanceMeter(0.0, window_s=0)
