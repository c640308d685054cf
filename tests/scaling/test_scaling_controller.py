"""ScalingController: cool-down, bottleneck classification, decisions and their trace."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import pytest

from agiledart.scaling import (
    Action,
    Bottleneck,
    Measurement,
    ScalingController,
    ScalingDecision,
    ScalingPolicy,
    ScalingUsageError,
    SecantRule,
)
from agiledart.traces.schema import SCHEMA_VERSION, check

MU = 100.0  # records/s one instance serves


def policy(**rule: float) -> ScalingPolicy:
    args: dict[str, float] = {"max_instances": 64, "cooldown_s": 30.0}
    args.update(rule)
    return ScalingPolicy(rule=SecantRule(**args))  # type: ignore[arg-type]


def controller(*, stateful: bool = False, **rule: float) -> ScalingController:
    return ScalingController("app-1", "count", stateful=stateful, policy=policy(**rule))


def compute_bound(x: int, rate: float, *, queue: float = 0.0) -> Measurement:
    """An operator limited by its workers: busy in proportion to its utilisation."""
    return Measurement(
        instances=x,
        rate=rate,
        service_rate=MU,
        queue=queue,
        busy=min(1.0, rate / (x * MU)),
        link_wait=0.05,
    )


def link_bound(x: int, rate: float) -> Measurement:
    """An operator waiting on its output links: records pile up, workers idle."""
    return Measurement(
        instances=x, rate=rate, service_rate=MU / 4, queue=5000, busy=0.3, link_wait=0.7
    )


def drive(
    c: ScalingController,
    x: int,
    measure: Callable[[float, int], Measurement],
    *,
    until: float,
    every: float = 5.0,
) -> tuple[int, list[ScalingDecision]]:
    """Observe every ``every`` seconds and carry out each change at once."""
    changes = []
    t = 0.0
    while t <= until:
        d = c.observe(t, measure(t, x))
        if d.changes:
            changes.append(d)
            x = d.target
        t += every
    return x, changes


def test_reaches_the_right_count_in_two_decisions() -> None:
    # λ = 2100/s at 70 % of 100/s per instance: 30 instances
    x, changes = drive(controller(), 1, lambda _t, x: compute_bound(x, 2100), until=300)
    assert x == 30
    assert [(d.action, d.target) for d in changes] == [(Action.UP, 2), (Action.UP, 30)]
    assert all(d.bottleneck is Bottleneck.COMPUTE for d in changes)


def test_scales_down_when_over_provisioned() -> None:
    x, changes = drive(controller(), 40, lambda _t, x: compute_bound(x, 700), until=600)
    assert x == 10
    assert changes
    assert all(d.action is Action.DOWN and d.bottleneck is None for d in changes)
    assert len(changes) <= 3


def test_cool_down_between_changes_and_nothing_recorded_during_it() -> None:
    c = controller(cooldown_s=30)
    d = c.observe(0.0, compute_bound(1, 2100))
    assert (d.action, d.target) == (Action.UP, 2)
    for t in (1.0, 10.0, 29.9):
        held = c.observe(t, compute_bound(2, 2100))
        assert held.action is Action.HOLD
        assert "cool-down" in held.reason
        assert c.search.current is not None
        assert c.search.current.instances == 1  # the settling operator is not measured
    d = c.observe(30.0, compute_bound(2, 2100))
    assert (d.action, d.target) == (Action.UP, 30)


def test_holds_in_the_dead_band_without_starting_a_cool_down() -> None:
    c = controller()
    for t in range(0, 100, 5):
        d = c.observe(float(t), compute_bound(10, 700))
        assert d.action is Action.HOLD
        assert "healthy" in d.reason
        assert d.health == pytest.approx(0.9)
    assert c.last_change is None


def test_holds_over_the_band_when_one_fewer_was_under_it() -> None:
    # need 2.2 instances: 2 is under the band (0.82), 3 over it (0.957)
    c = controller()
    x, changes = drive(c, 1, lambda _t, x: compute_bound(x, 154), until=300)
    assert x == 3
    assert [d.target for d in changes] == [2, 3]
    d = c.observe(400.0, compute_bound(3, 154))
    assert d.action is Action.HOLD
    assert "2 was under it" in d.reason


def test_holds_until_the_service_rate_is_measured() -> None:
    c = controller()
    m = Measurement(instances=1, rate=500, service_rate=None, queue=200, busy=0, link_wait=0)
    d = c.observe(0.0, m)
    assert d.action is Action.HOLD
    assert "no service time" in d.reason
    assert c.search.current is None


def test_queue_backlog_asks_for_more() -> None:
    # at the reference rate but with 5 s of input queued: the backlog must drain in 1 s
    d = controller().observe(0.0, compute_bound(10, 700, queue=3500))
    assert d.action is Action.UP
    assert d.health < 0.85


def test_compute_bottleneck_scales_up_whether_stateful_or_not() -> None:
    for stateful in (False, True):
        c = controller(stateful=stateful)
        c.observe(0.0, compute_bound(4, 2100))
        d = c.observe(30.0, compute_bound(5, 2100))
        assert d.bottleneck is Bottleneck.COMPUTE
        assert d.action is Action.UP
        assert d.target == 30


def test_bandwidth_bottleneck_stateless_scales_out() -> None:
    c = controller()
    d = c.observe(0.0, link_bound(4, 500))
    assert d.bottleneck is Bottleneck.BANDWIDTH
    assert d.action is Action.SCALE_OUT
    assert d.target > 4
    assert "links" in d.reason
    assert c.search.current is None  # the curve changes with the links
    assert c.observe(5.0, link_bound(d.target, 500)).action is Action.HOLD  # cool-down


def test_bandwidth_bottleneck_stateful_migrates_keeping_its_count() -> None:
    c = controller(stateful=True)
    d = c.observe(0.0, link_bound(4, 500))
    assert d.bottleneck is Bottleneck.BANDWIDTH
    assert d.action is Action.MIGRATE
    assert d.target == d.instances == 4
    assert c.last_change == 0.0


def test_classification_needs_saturated_links_and_idle_workers() -> None:
    c = controller()

    def m(busy: float, link_wait: float) -> Measurement:
        return Measurement(
            instances=2, rate=10, service_rate=1, queue=0, busy=busy, link_wait=link_wait
        )

    assert c.classify(m(busy=0.3, link_wait=0.7)) is Bottleneck.BANDWIDTH
    assert c.classify(m(busy=0.95, link_wait=0.7)) is Bottleneck.COMPUTE  # both: compute
    assert c.classify(m(busy=0.95, link_wait=0.0)) is Bottleneck.COMPUTE
    assert c.classify(m(busy=0.3, link_wait=0.2)) is Bottleneck.COMPUTE


def test_at_max_instances_it_holds() -> None:
    c = controller(max_instances=8)
    d = c.observe(0.0, compute_bound(8, 2100))
    assert d.action is Action.HOLD
    assert d.bottleneck is Bottleneck.COMPUTE
    assert "max_instances" in d.reason


def test_load_change_forgets_the_old_points() -> None:
    rates = {True: 700.0, False: 2100.0}  # before / after t = 100
    x, changes = drive(controller(), 1, lambda t, x: compute_bound(x, rates[t < 100]), until=400)
    assert x == 30
    # 1 -> 2 -> 10 for 700/s; after the step the old points are gone: a probe, then
    # one exact secant step
    assert [d.target for d in changes] == [2, 10, 11, 30]


def test_trace_record_follows_the_schema() -> None:
    d = controller().observe(0.0, compute_bound(1, 2100))
    fields = d.trace_fields()
    assert fields == {
        "app": "app-1",
        "operator": "count",
        "health": d.health,
        "instances": 1,
        "target": 2,
        "decision": "up",
    }
    record = {"v": SCHEMA_VERSION, "type": "scaling", "ts": 1.0, "peer": "p1", **fields}
    check(record)
    check(json.loads(json.dumps(record)))
    assert {a.value for a in Action} == {"hold", "up", "down", "scale-out", "migrate"}


def test_decisions_are_frozen() -> None:
    d = controller().observe(0.0, compute_bound(1, 2100))
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.target = 5  # type: ignore[misc]


def test_time_must_not_go_backwards() -> None:
    c = controller()
    c.observe(10.0, compute_bound(1, 100))
    with pytest.raises(ScalingUsageError, match="backwards"):
        c.observe(9.0, compute_bound(1, 100))


@pytest.mark.parametrize(
    "kwargs",
    [{"busy": 1.5}, {"busy": -0.1}, {"link_wait": 2.0}, {"instances": 0}],
)
def test_bad_measurement_is_a_usage_error(kwargs: dict[str, float]) -> None:
    args: dict[str, float | None] = {
        "instances": 1,
        "rate": 1.0,
        "service_rate": 1.0,
        "queue": 0.0,
        "busy": 0.5,
    }
    args.update(kwargs)
    with pytest.raises(ScalingUsageError):
        Measurement(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs", [{"busy_high": 1.5}, {"link_saturated": -1}, {"rate_drift": 0}, {"rule": None}]
)
def test_bad_policy_is_a_usage_error(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"rule": SecantRule(max_instances=4)}
    args.update(kwargs)
    with pytest.raises(ScalingUsageError):
        ScalingPolicy(**args)  # type: ignore[arg-type]
