"""The controller options the peers' driver turns on (agiledart.runtime.scaling): the
first step up through the origin, no step down to a count predicted short of f*, a
stabilisation window for steps down, and forgetting the secant's points when the cost
of a record changed for good (not for one noisy second)."""

from __future__ import annotations

import pytest

from agiledart.scaling import (
    Action,
    Measurement,
    ScalingController,
    ScalingPolicy,
    ScalingUsageError,
    SecantRule,
)

MU = 100.0


def controller(**options: object) -> ScalingController:
    rule = SecantRule(max_instances=64, cooldown_s=0.0)
    policy = ScalingPolicy(rule=rule, **options)  # type: ignore[arg-type]
    return ScalingController("app-1", "op", stateful=False, policy=policy)


def m(x: int, rate: float, *, mu: float = MU, queue: float = 0.0) -> Measurement:
    return Measurement(
        instances=x,
        rate=rate,
        service_rate=mu,
        queue=queue,
        busy=min(1.0, rate / (x * mu)),
        link_wait=0.0,
    )


def test_the_first_step_up_goes_through_the_origin_to_the_right_count() -> None:
    # λ = 2100/s, 70 % of 100/s per instance: 30 instances, in one decision
    d = controller(through_origin=True).observe(0.0, m(1, 2100))
    assert (d.action, d.target) == (Action.UP, 30)
    # without the option the rule's first step is one instance
    assert controller().observe(0.0, m(1, 2100)).target == 2


def test_the_origin_step_ignores_a_backlog_the_secant_then_sees() -> None:
    # 5 s of input queued on top of λ: scored without it, the step is still 30
    d = controller(through_origin=True).observe(0.0, m(1, 2100, queue=10_500))
    assert d.target == 30
    assert d.health < 0.1  # the decision's own score does count the backlog


def test_no_step_down_to_a_count_predicted_short_of_the_target() -> None:
    # need 2.2 instances at f* = 0.9: 3 is over the band (0.957) and 2 short of f*
    c = controller(through_origin=True)
    for t in range(5):
        d = c.observe(float(t), m(3, 154))
        assert d.action is Action.HOLD
        assert "would fall short of f*" in d.reason


def test_a_step_down_waits_for_the_stabilisation_window() -> None:
    c = controller(down_after=3)
    actions = [c.observe(float(t), m(40, 700)).action for t in range(3)]
    assert actions == [Action.HOLD, Action.HOLD, Action.DOWN]
    c = controller(down_after=3)
    assert c.observe(0.0, m(40, 700)).action is Action.HOLD
    assert c.observe(1.0, m(10, 700)).action is Action.HOLD  # healthy: the count restarts
    assert c.observe(2.0, m(40, 700)).action is Action.HOLD


def test_one_noisy_service_rate_keeps_the_points_a_lasting_change_drops_them() -> None:
    c = controller()
    c.observe(0.0, m(1, 154))
    c.observe(1.0, m(2, 154))
    assert c.search.previous is not None
    assert c.search.previous.instances == 1
    c.observe(2.0, m(2, 154, mu=140))  # one second 40 % faster
    assert c.search.previous is not None  # the point at one instance is kept
    c.observe(3.0, m(2, 154, mu=MU))
    c.observe(4.0, m(2, 154, mu=400))  # costs fell to a quarter, and stay there
    assert c.search.previous is not None
    c.observe(5.0, m(2, 154, mu=400))
    assert c.search.previous is None  # forgotten: measured under another cost
    assert c.search.current is not None
    assert c.search.current.instances == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_bad_window_is_a_usage_error(bad: object) -> None:
    with pytest.raises(ScalingUsageError, match="down_after"):
        ScalingPolicy(rule=SecantRule(max_instances=4), down_after=bad)  # type: ignore[arg-type]
