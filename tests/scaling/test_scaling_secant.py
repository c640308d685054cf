"""The secant rule: eq. 1, its guards, and how fast it reaches the target."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.scaling import (
    Point,
    ScalingUsageError,
    SecantRule,
    SecantSearch,
    health_from_headroom,
    secant_estimate,
)

Curve = Callable[[int], float]
RULE = SecantRule(max_instances=512)


def health_curve(need: float) -> Curve:
    """This package's health score of an operator needing ``need`` instances at the
    reference utilisation (f(need) = 0.9)."""
    return lambda x: health_from_headroom(x / need)


def exp_curve(a: float) -> Curve:
    return lambda x: 1 - math.exp(-a * x)


def logistic(k: float, middle: float) -> Curve:
    return lambda x: 1 / (1 + math.exp(-k * (x - middle)))


def run(curve: Curve, x: int, rule: SecantRule = RULE, n: int = 40) -> list[int]:
    """The counts the search visits, one per decision, starting with ``x``."""
    search = SecantSearch(rule)
    xs = [x]
    for _ in range(n):
        x = search.observe(Point(x, curve(x)))
        xs.append(x)
    return xs


def decisions(xs: list[int]) -> int:
    """How many decisions until the count stays (the index of the last change)."""
    return max((i for i in range(1, len(xs)) if xs[i] != xs[i - 1]), default=0)


def acceptable(curve: Curve, x: int, rule: SecantRule) -> bool:
    """In the dead-band; or over it with the count below under it; or pinned at a bound."""
    f = curve(x)
    if rule.settled(f):
        return True
    if f > rule.target:
        return x == 1 or curve(x - 1) < rule.target - rule.tolerance
    return x == rule.max_instances


def alternates(xs: list[int]) -> bool:
    """Whether the distinct counts ever go A, B, A, B."""
    d = [xs[0]]
    for v in xs[1:]:
        if v != d[-1]:
            d.append(v)
    return any(d[i] == d[i + 2] and d[i + 1] == d[i + 3] for i in range(len(d) - 3))


# -- eq. 1 ------------------------------------------------------------------------------


def test_estimate_is_equation_1() -> None:
    prev, cur = Point(2, 0.3), Point(4, 0.6)
    assert secant_estimate(cur, prev, 0.9) == pytest.approx(6.0)
    # the paper's f* = 1
    assert secant_estimate(cur, prev, 1.0) == pytest.approx(4 + 0.4 * 2 / 0.3)
    # the order of the points does not matter: it is a line
    assert secant_estimate(prev, cur, 0.9) == pytest.approx(6.0)


def test_estimate_with_equal_f_has_no_root() -> None:
    with pytest.raises(ScalingUsageError, match="equal health"):
        secant_estimate(Point(4, 0.5), Point(2, 0.5), 0.9)


def test_step_follows_the_secant_rounding_up() -> None:
    assert RULE.step(Point(4, 0.6), Point(2, 0.3)) == 6
    assert RULE.step(Point(4, 0.61), Point(2, 0.3)) == 6  # 5.87
    assert RULE.step(Point(4, 0.3), Point(2, 0.1)) == 10  # 9.999999999999998: no fuzz
    # down: from 9 (0.96) and 10 (0.99) the line meets 0.9 at 7
    assert RULE.step(Point(9, 0.96), Point(10, 0.99)) == 7
    # 5.67 rounds up to 6
    assert RULE.step(Point(9, 0.96), Point(10, 0.978)) == 6


# -- guards -----------------------------------------------------------------------------


def test_first_step_is_one_toward_the_target() -> None:
    assert RULE.step(Point(5, 0.5)) == 6
    assert RULE.step(Point(5, 0.99)) == 4
    # the same count twice is no slope either
    assert RULE.step(Point(5, 0.5), Point(5, 0.4)) == 6


def test_dead_band_holds() -> None:
    for f in (0.85, 0.88, 0.9, 0.93, 0.95):
        assert RULE.step(Point(7, f), Point(3, 0.4)) == 7
    assert RULE.step(Point(7, 0.84), Point(3, 0.4)) > 7
    assert RULE.step(Point(7, 0.96), Point(9, 0.99)) < 7
    exact = SecantRule(max_instances=8, tolerance=0)
    assert exact.step(Point(3, 0.9)) == 3
    assert exact.step(Point(3, 0.8999)) == 4


def test_equal_f_steps_one_then_gallops_the_same_way() -> None:
    # a flat stretch under the band: +1, then each probe twice the last move
    assert run(lambda _x: 0.5, 1, n=6) == [1, 2, 4, 8, 16, 32, 64]
    # an idle operator (f flat at the top) sheds instances in log2 decisions
    xs = run(lambda _x: 1 - 1e-9, 64)
    assert xs[-1] == 1
    assert decisions(xs) <= 2 * math.log2(64)
    # equal f after a move the same way: twice that move
    assert RULE.step(Point(8, 0.99), Point(9, 0.99)) == 6
    # after a move the other way: one step (kept above 12, known to be under the band)
    assert RULE.step(Point(10, 0.5), Point(12, 0.5)) == 13


def test_falling_f_is_noise_not_a_slope() -> None:
    # f fell across a move up: no slope, so a probe (here twice the last move)
    assert RULE.step(Point(6, 0.70), Point(5, 0.72)) == 8
    # f rose across a move down: no slope either
    assert RULE.step(Point(6, 0.99), Point(7, 0.97)) == 4


def test_clamped_to_one_and_max() -> None:
    rule = SecantRule(max_instances=8)
    assert rule.step(Point(2, 0.3), Point(1, 0.25)) == 8  # the line says 14
    assert rule.step(Point(8, 0.3), Point(7, 0.28)) == 8  # at max: hold
    assert rule.step(Point(1, 0.99)) == 1  # at one: hold
    assert rule.step(Point(1, 0.99), Point(2, 0.999)) == 1
    assert rule.step(Point(12, 0.9)) == 8  # over max: back to max


def test_bounded_descent_halves_at_most() -> None:
    # two over-provisioned points: the line's root is far below, the step stops at half
    assert RULE.step(Point(39, 0.998), Point(40, 0.999)) == 20
    shy = SecantRule(max_instances=64, max_shrink=0.75)
    assert shy.step(Point(39, 0.998), Point(40, 0.999)) == 30


def test_bracket_holds_over_the_band_next_to_a_count_under_it() -> None:
    # 9 was under the band, 10 over it: 10 holds (too many beat too few)
    assert RULE.step(Point(10, 0.97), Point(9, 0.7)) == 10
    # and with the bracket passed in explicitly
    assert RULE.step(Point(10, 0.97), below=9) == 10
    # a step that would leave the bracket bisects it
    assert RULE.step(Point(4, 0.5), Point(3, 0.45), above=12) == 8  # the line says 12
    # the line says 2, halving says 10; past the middle of (4, 20): bisect
    assert RULE.step(Point(20, 0.99), Point(21, 0.995), below=4) == 12


def test_step_function_curve_settles_without_alternating() -> None:
    def curve(x: int) -> float:  # no count is in the band
        return 0.5 if x < 7 else 0.99

    for start in (1, 3, 6, 7, 8, 20, 100):
        xs = run(curve, start)
        assert xs[-1] == 7, (start, xs)
        assert not alternates(xs)


def test_resolution_ignores_slopes_inside_the_noise() -> None:
    flat = (Point(2, 0.012), Point(1, 0.005))
    assert RULE.step(*flat) == 4  # 0.007 apart: a probe, twice the last move
    assert SecantRule(max_instances=512, resolution=0).step(*flat) == 129


def test_target_one_is_the_papers_special_case() -> None:
    rule = SecantRule(max_instances=64, target=1.0, tolerance=0.05)
    xs = run(health_curve(10), 1, rule)
    # f* = 1 is never reached: the rule stops once f >= 1 − tolerance
    assert health_curve(10)(xs[-1]) >= 0.95
    assert decisions(xs) <= 4


def test_cooled_down() -> None:
    rule = SecantRule(max_instances=4, cooldown_s=30)
    assert rule.cooled_down(5.0, None)
    assert not rule.cooled_down(129.9, 100.0)
    assert rule.cooled_down(130.0, 100.0)
    assert SecantRule(max_instances=4, cooldown_s=0).cooled_down(100.0, 100.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_instances": 0}, "max_instances"),
        ({"max_instances": 2.5}, "max_instances"),
        ({"target": 0}, "target"),
        ({"target": 1.2}, "target"),
        ({"target": math.nan}, "target"),
        ({"target": 1.0, "tolerance": 0}, "target 1"),
        ({"tolerance": 1}, "tolerance"),
        ({"tolerance": -0.1}, "tolerance"),
        ({"cooldown_s": -1}, "cooldown"),
        ({"cooldown_s": math.inf}, "cooldown"),
        ({"max_shrink": 0}, "max_shrink"),
        ({"max_shrink": 1}, "max_shrink"),
        ({"resolution": -0.01}, "resolution"),
    ],
)
def test_bad_rule_is_a_usage_error(kwargs: dict[str, float], match: str) -> None:
    args: dict[str, float] = {"max_instances": 8}
    args.update(kwargs)
    with pytest.raises(ScalingUsageError, match=match):
        SecantRule(**args)  # type: ignore[arg-type]


def test_bad_points_and_brackets_are_usage_errors() -> None:
    with pytest.raises(ScalingUsageError):
        RULE.step(Point(3, 1.5))
    with pytest.raises(ScalingUsageError):
        RULE.step(Point(3, math.nan))
    with pytest.raises(ScalingUsageError):
        RULE.step(Point(0, 0.5))
    with pytest.raises(ScalingUsageError, match="below < above"):
        RULE.step(Point(3, 0.5), below=5, above=5)
    with pytest.raises(ScalingUsageError):
        RULE.step(Point(3, 0.5), below=0)


# -- convergence ------------------------------------------------------------------------


@pytest.mark.parametrize("need", [3, 7, 10, 25, 50, 80])
def test_health_curve_from_one_instance_in_two_decisions(need: int) -> None:
    """+1, then one secant step, exact because f is linear below the reference (DS2's
    'three steps' come from the same linearity of rates)."""
    xs = run(health_curve(need), 1)
    assert decisions(xs) == 2
    assert xs[-1] == need


def test_health_curve_beyond_ninety_instances_takes_one_probe_more() -> None:
    # f(1) and f(2) are within the resolution: one more probe before the secant step
    xs = run(health_curve(120), 1)
    assert xs[:4] == [1, 2, 4, 120]
    assert decisions(xs) == 3


@pytest.mark.parametrize("need", [3, 10, 25, 50, 100])
def test_health_curve_from_four_times_too_many(need: int) -> None:
    """A probe, a halving, then the secant (or the bracket) lands on the need."""
    xs = run(health_curve(need), 4 * need)
    assert decisions(xs) <= 3
    assert acceptable(health_curve(need), xs[-1], RULE)


@pytest.mark.parametrize("a", [0.05, 0.1, 0.3, 1.0])
def test_exponential_curve_from_one_instance(a: float) -> None:
    """f = 1 − e^(−a x), concave: the secant approaches from below, 2-4 decisions."""
    curve = exp_curve(a)
    xs = run(curve, 1)
    assert decisions(xs) <= 4
    assert acceptable(curve, xs[-1], RULE)


@pytest.mark.parametrize(("k", "middle"), [(0.5, 10), (0.3, 10), (0.2, 15), (0.3, 30), (1, 20)])
def test_logistic_curve(k: float, middle: float) -> None:
    curve = logistic(k, middle)
    # from the middle of its slope: as fast as on the other curves
    xs = run(curve, round(middle))
    assert decisions(xs) <= 3
    assert acceptable(curve, xs[-1], RULE)
    # from its flat floor the first secant step overshoots to the flat top and the
    # bracket bisects back: slower, but it gets there and stays
    rule = SecantRule(max_instances=128)
    xs = run(curve, 1, rule)
    assert decisions(xs) <= 14
    assert acceptable(curve, xs[-1], rule)
    assert not alternates(xs)


@given(
    need=st.floats(min_value=0.5, max_value=100),
    start=st.integers(min_value=1, max_value=128),
)
@settings(max_examples=300, deadline=None)
def test_health_curve_converges_from_anywhere(need: float, start: int) -> None:
    rule = SecantRule(max_instances=128)
    curve = health_curve(need)
    xs = run(curve, start, rule)
    assert acceptable(curve, xs[-1], rule), xs
    assert decisions(xs) <= 16, xs
    assert not alternates(xs)


@given(
    kind=st.sampled_from(["health", "exp", "logistic"]),
    shape=st.floats(min_value=0, max_value=1),
    start=st.integers(min_value=1, max_value=128),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
@settings(max_examples=300, deadline=None)
def test_noisy_curves_never_alternate(kind: str, shape: float, start: int, seed: int) -> None:
    """Noise up to 0.02 (under the 0.05 dead-band) on f: the count never flips between
    two values, whatever the noise does (the bracket remembers which side each was)."""
    rule = SecantRule(max_instances=128)
    curve = {
        "health": health_curve(1 + 60 * shape),
        "exp": exp_curve(0.05 + shape),
        "logistic": logistic(0.15 + 0.35 * shape, 5 + 45 * shape),
    }[kind]
    rng = random.Random(seed)
    search = SecantSearch(rule)
    x, xs = start, [start]
    for _ in range(60):
        f = min(1.0, max(0.0, curve(x) + rng.uniform(-0.02, 0.02)))
        x = search.observe(Point(x, f))
        xs.append(x)
    assert not alternates(xs), xs


@given(
    need=st.floats(min_value=1, max_value=60),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
@settings(max_examples=200, deadline=None)
def test_dead_band_absorbs_noise_within_its_margin(need: float, seed: int) -> None:
    """Settled where f is within tolerance − a of the target, noise up to a never moves
    the count."""
    rule = SecantRule(max_instances=128)
    curve = health_curve(need)
    amplitude = 0.02
    settled = [x for x in range(1, 129) if abs(curve(x) - rule.target) <= 0.05 - amplitude]
    if not settled:
        return
    rng = random.Random(seed)
    search = SecantSearch(rule)
    x = rng.choice(settled)
    for _ in range(50):
        assert search.observe(Point(x, curve(x) + rng.uniform(-amplitude, amplitude))) == x
