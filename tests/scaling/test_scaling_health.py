"""The health score: its calibration, shape, bounds and special cases."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.errors import AgiledartError
from agiledart.scaling import (
    HEALTH_MAX,
    HEALTH_MIN,
    REFERENCE_HEALTH,
    HealthModel,
    ScalingUsageError,
    health,
    health_from_headroom,
    service_rate,
)

rates = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
queues = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
service_rates = st.none() | st.floats(min_value=0, max_value=1e9, allow_nan=False)
counts = st.integers(min_value=1, max_value=10_000)
models = st.builds(
    HealthModel,
    reference_utilization=st.floats(min_value=0.05, max_value=1),
    target_latency_s=st.floats(min_value=0.01, max_value=100),
)


def f(
    x: int, rate: float, mu: float | None, q: float = 0, model: HealthModel | None = None
) -> float:
    return health(x, rate=rate, service_rate=mu, queue=q, model=model or HealthModel()).value


def test_reference_utilization_scores_the_default_target() -> None:
    # 10 instances of 100 records/s at 70 % utilisation, nothing queued
    assert f(10, 700, 100) == pytest.approx(REFERENCE_HEALTH)
    assert f(4, 0.5 * 400, 100, model=HealthModel(reference_utilization=0.5)) == pytest.approx(0.9)


def test_shape_linear_below_the_reference_one_nine_per_reference_above() -> None:
    # below: proportional to capacity (h = x / 10 here)
    assert f(5, 700, 100) == pytest.approx(0.45)
    assert f(1, 700, 100) == pytest.approx(0.09)
    # above: h = 2 -> 0.99, h = 3 -> 0.999
    assert f(20, 700, 100) == pytest.approx(0.99)
    assert f(30, 700, 100) == pytest.approx(0.999)
    # the default dead-band 0.9 ± 0.05 is 6 % too little to 30 % too much capacity
    assert health_from_headroom(0.85 / 0.9) == pytest.approx(0.85)
    assert health_from_headroom(1 + math.log10(2)) == pytest.approx(0.95)


def test_queue_folds_into_the_load_as_drain_time() -> None:
    # λ = 500/s, 10 x 100/s: a backlog of 250 drains in 250 / (1000 - 500) = 0.5 s
    s = health(10, rate=500, service_rate=100, queue=250, model=HealthModel(target_latency_s=1))
    assert s.load == pytest.approx((500 + 250) / 1000)
    # the same backlog against a 0.25 s target: it would take twice too long
    tight = health(
        10, rate=500, service_rate=100, queue=250, model=HealthModel(target_latency_s=0.25)
    )
    assert tight.load == pytest.approx((500 + 1000) / 1000)
    assert tight.value < s.value


@given(x=counts, rate=rates, q=queues, mu=service_rates, model=models)
@settings(max_examples=300, deadline=None)
def test_always_in_the_open_interval(
    x: int, rate: float, q: float, mu: float | None, model: HealthModel
) -> None:
    value = f(x, rate, mu, q, model)
    assert 0 < value < 1
    assert HEALTH_MIN <= value <= HEALTH_MAX


@given(
    x=counts,
    rate=rates,
    q=queues,
    mu=st.floats(min_value=1e-3, max_value=1e6),
    model=models,
)
@settings(max_examples=300, deadline=None)
def test_rises_with_capacity(x: int, rate: float, q: float, mu: float, model: HealthModel) -> None:
    lo, hi = f(x, rate, mu, q, model), f(x + 1, rate, mu, q, model)
    assert hi >= lo
    if lo > HEALTH_MIN and hi < HEALTH_MAX:
        assert hi > lo


@given(
    x=counts,
    rate=rates,
    q=queues,
    mu=st.floats(min_value=1e-3, max_value=1e6),
    extra=st.floats(min_value=1e-3, max_value=1e6),
)
@settings(max_examples=300, deadline=None)
def test_falls_with_load(x: int, rate: float, q: float, mu: float, extra: float) -> None:
    base = f(x, rate, mu, q)
    assert f(x, rate + extra, mu, q) <= base
    assert f(x, rate, mu, q + extra) <= base


@given(
    x=st.integers(1, 100),
    rate=st.floats(0, 1e5),
    q=st.floats(0, 1e5),
    mu=st.floats(1, 1e4),
    latency=st.floats(0.01, 10),
)
@settings(max_examples=300, deadline=None)
def test_load_at_most_one_iff_the_backlog_drains_within_the_target(
    x: int, rate: float, q: float, mu: float, latency: float
) -> None:
    s = health(x, rate=rate, service_rate=mu, queue=q, model=HealthModel(target_latency_s=latency))
    assert s.load is not None
    spare = x * mu - rate
    drains = spare > 0 and q / spare <= latency
    if not math.isclose(s.load, 1.0, rel_tol=1e-9):
        assert (s.load <= 1) == (drains or (q == 0 and spare >= 0))


def test_unknown_service_rate_is_the_neutral_score() -> None:
    s = health(4, rate=100, service_rate=None, queue=10)
    assert s.value == REFERENCE_HEALTH
    assert s.load is None
    assert not s.known
    # whatever x is: no evidence about capacity
    assert f(1, 100, None) == f(64, 100, None)


def test_no_demand_is_the_best_score_whatever_mu() -> None:
    for mu in (None, 0.0, 1.0, math.inf):
        s = health(3, rate=0, service_rate=mu, queue=0)
        assert s.value == HEALTH_MAX
        assert s.known


def test_extremes_stay_inside_the_interval() -> None:
    assert f(1, 100, 0.0) == HEALTH_MIN  # no capacity at all
    assert f(1, 100, math.inf) == HEALTH_MAX  # unmeasurably fast
    assert f(1, 1e9, 1e-3, 1e9) == HEALTH_MIN
    assert health_from_headroom(math.inf) == HEALTH_MAX
    assert health_from_headroom(0) == HEALTH_MIN


def test_headroom_curve_is_continuous_and_increasing() -> None:
    eps = 1e-9
    assert health_from_headroom(1 - eps) == pytest.approx(health_from_headroom(1 + eps))
    hs = [i / 100 for i in range(1, 1000)]
    values = [health_from_headroom(h) for h in hs]
    assert all(a < b for a, b in itertools.pairwise(values) if b < HEALTH_MAX)


def test_service_rate_from_service_time() -> None:
    assert service_rate(None) is None
    assert service_rate(1000.0) == pytest.approx(1000.0)
    assert service_rate(250) == pytest.approx(4000.0)
    assert service_rate(0.0) == math.inf
    with pytest.raises(ScalingUsageError):
        service_rate(-1.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate": -1.0}, "rate"),
        ({"rate": math.nan}, "rate"),
        ({"rate": math.inf}, "rate"),
        ({"queue": -3.0}, "queue"),
        ({"queue": math.nan}, "queue"),
        ({"service_rate": -2.0}, "service_rate"),
        ({"service_rate": math.nan}, "service_rate"),
        ({"instances": 0}, "instances"),
        ({"instances": True}, "instances"),
        ({"instances": 2.0}, "instances"),
    ],
)
def test_bad_measurements_are_usage_errors(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"instances": 2, "rate": 10.0, "service_rate": 5.0, "queue": 1.0}
    args.update(kwargs)
    with pytest.raises(ScalingUsageError, match=field) as err:
        health(args.pop("instances"), **args)  # type: ignore[arg-type]
    assert isinstance(err.value, AgiledartError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"reference_utilization": 0},
        {"reference_utilization": 1.5},
        {"reference_utilization": math.nan},
        {"target_latency_s": 0},
        {"target_latency_s": math.inf},
        {"target_latency_s": -1},
    ],
)
def test_bad_model_is_a_usage_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(ScalingUsageError):
        HealthModel(**kwargs)
    with pytest.raises(ScalingUsageError):
        health_from_headroom(-1)
