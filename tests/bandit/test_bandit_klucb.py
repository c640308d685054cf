"""The KL-UCB link cost against a slow, obviously-correct reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agiledart.bandit import BanditUsageError
from agiledart.bandit.klucb import (
    exploration_bound,
    kl_bernoulli,
    kl_ucb_cost,
    kl_ucb_cost_one,
    kl_ucb_upper,
    kl_ucb_upper_one,
)


def kl_ref(p: float, q: float) -> float:
    a = p * math.log(p / q) if p > 0 else 0.0
    b = (1 - p) * math.log((1 - p) / (1 - q)) if p < 1 else 0.0
    return a + b


def upper_ref(p: float, t: float, bound: float) -> float:
    """max{u in [p, 1] : t KL(p, u) <= bound}, by 200 bisection steps."""
    if t == 0 or p == 1:
        return 1.0
    if bound == 0:
        return p  # KL(p, u) = 0 only at u = p (bisection would trip on rounding)
    lo, hi = p, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if t * kl_ref(p, mid) <= bound:
            lo = mid
        else:
            hi = mid
    return lo


def random_cases(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = rng.integers(1, 5000, n).astype(float)
    s = np.floor(rng.random(n) ** rng.choice([0.2, 1.0, 5.0], n) * (t + 1)).clip(0, t)
    bound = rng.uniform(0.001, 1.0, n) * np.log(rng.integers(2, 10**6, n))
    return s / t, t, bound


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_bound_matches_bisection(seed: int) -> None:
    p, t, bound = random_cases(seed, 400)
    got = kl_ucb_upper(p, t, bound)
    want = np.array([upper_ref(*case) for case in zip(p, t, bound, strict=True)])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("seed", range(5))
def test_scalar_bound_matches_vectorised(seed: int) -> None:
    p, t, bound = random_cases(100 + seed, 400)
    vec = kl_ucb_upper(p, t, bound)
    one = [
        kl_ucb_upper_one(a, b, c)
        for a, b, c in zip(p.tolist(), t.tolist(), bound.tolist(), strict=True)
    ]
    np.testing.assert_allclose(one, vec, rtol=1e-11, atol=1e-13)


@given(
    successes=st.integers(0, 10_000),
    extra=st.integers(0, 10_000),
    tau=st.integers(1, 10**9),
    exploration=st.floats(1e-3, 1.0),
)
def test_cost_matches_reference(successes: int, extra: int, tau: int, exploration: float) -> None:
    attempts = successes + extra
    bound = exploration_bound(tau, exploration)
    want_u = upper_ref(successes / attempts if attempts else 0.0, attempts, bound)
    want = 1 / want_u if want_u > 0 else math.inf
    got = kl_ucb_cost(successes, attempts, tau, exploration)
    assert float(got) == pytest.approx(want, rel=1e-9)
    assert kl_ucb_cost_one(successes, attempts, bound) == pytest.approx(want, rel=1e-9)
    assert got >= 1.0


def test_the_bound_is_where_the_kl_budget_runs_out() -> None:
    p, t, bound = random_cases(7, 200)
    u = kl_ucb_upper(p, t, bound)
    inside = (u > p) & (u < 1)
    np.testing.assert_allclose((t * kl_bernoulli(p, u))[inside], bound[inside], rtol=1e-6)


def test_untried_link_costs_one() -> None:
    assert kl_ucb_cost(0, 0, 1, 0.5) == 1.0
    assert kl_ucb_cost(0, 0, 10**6, 1.0) == 1.0
    np.testing.assert_array_equal(kl_ucb_cost([0, 0], [0, 0], 50, 0.1), [1.0, 1.0])
    assert kl_ucb_cost_one(0, 0, 3.0) == 1.0


def test_edge_cases_are_exact() -> None:
    # θ̂ = 1: the interval [θ̂, 1] is a point.
    assert kl_ucb_cost(7, 7, 100, 1.0) == 1.0
    # τ = 1: log τ = 0, no exploration; the cost is 1/θ̂, or inf for a link never up.
    assert kl_ucb_cost(1, 4, 1, 0.5) == 4.0
    assert kl_ucb_cost(0, 3, 1, 0.5) == math.inf
    assert kl_ucb_cost_one(0, 3, 0.0) == math.inf
    # θ̂ = 0: KL(0, u) = -log(1 - u), so u* = 1 - exp(-bound / t').
    bound = exploration_bound(100, 0.3)
    assert float(kl_ucb_upper(0.0, 5, bound)) == pytest.approx(-math.expm1(-bound / 5), rel=1e-15)
    assert kl_ucb_upper_one(0.0, 5, bound) == pytest.approx(-math.expm1(-bound / 5), rel=1e-15)


def test_more_evidence_less_optimism() -> None:
    # Same θ̂, more attempts: a tighter bound. Later τ or larger C: a looser one.
    costs = kl_ucb_cost([1, 10, 100, 1000], [4, 40, 400, 4000], 1000, 0.5)
    assert np.all(np.diff(costs) > 0)
    assert np.all(costs < 4.0)
    assert kl_ucb_cost(10, 40, 10, 0.5) > kl_ucb_cost(10, 40, 1000, 0.5)
    assert kl_ucb_cost(10, 40, 100, 0.1) > kl_ucb_cost(10, 40, 100, 1.0)


def test_kl_bernoulli_handles_the_ends() -> None:
    np.testing.assert_allclose(
        kl_bernoulli([0.0, 1.0, 0.5], [0.5, 0.5, 0.5]), [math.log(2)] * 2 + [0]
    )


@pytest.mark.parametrize(("tau", "exploration"), [(0, 0.5), (5, 0.0), (5, 1.5), (5, -1.0)])
def test_bad_parameters_are_usage_errors(tau: int, exploration: float) -> None:
    with pytest.raises(BanditUsageError):
        kl_ucb_cost(1, 2, tau, exploration)
