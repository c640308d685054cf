"""The KL-UCB link cost ω of Algorithm 1 (paper §V-B).

Theory of operation
-------------------
A link (v, v') has had t' transmission attempts, s of them successful, so its empirical
success rate is θ̂ = s / t'. Its optimistic success rate is the KL-UCB upper bound ::

    u* = max{ u in [θ̂, 1] : t' · KL(θ̂, u) <= C · log τ }
    KL(p, q) = p log(p/q) + (1-p) log((1-p)/(1-q))       (Bernoulli KL, 0 log 0 = 0)

and its cost is ω = 1 / u*, an optimistic estimate of its expected delay in slots
(always >= 1). C in (0, 1] is the exploration factor; τ >= 1 is the time index. Here τ
is the 1-based index of the packet being routed, as in Talebi et al.'s KL-HHR, from
which the paper's Algorithm 1 comes: within one packet every link's bound is the same,
and log 1 = 0 makes the first packet pure exploitation of what is already known.

Edge cases, all exact:

* t' = 0 (untried): u* = 1, ω = 1.
* θ̂ = 1: u* = 1 (the interval [θ̂, 1] is a point).
* C · log τ = 0 (τ = 1): u* = θ̂; with θ̂ = 0 that gives u* = 0 and ω = +inf.
* θ̂ = 0: KL(0, u) = -log(1 - u), so u* = 1 - exp(-C log τ / t').

Otherwise u* solves t' · KL(θ̂, u) = C log τ on (θ̂, 1). We solve it by Newton's method
in x = -log(1 - u): there KL is convex and increasing (KL'(x) = (u - θ̂)/u > 0 right of
θ̂), so from any start right of θ̂ the first step lands right of the root and the rest
walk down to it monotonically. The start is the quadratic approximation
u = θ̂ + sqrt(2 θ̂ (1 - θ̂) d), d = C log τ / t', capped by the upper bound
x <= (d + H(θ̂)) / (1 - θ̂) (from KL >= (1 - θ̂) x - H(θ̂)); it reaches 1e-13 in at
most five or six steps.

:func:`kl_ucb_upper` works on arrays of links (a whole-graph refresh: ~0.3 ms for 512
links); :func:`kl_ucb_upper_one` is the same computation in plain floats for one link
(a few microseconds, where numpy's per-call overhead would dominate: a relay's handful
of out-links, or the one link that just got feedback). The tests check both against
plain bisection.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agiledart.bandit.errors import BanditUsageError

__all__ = [
    "exploration_bound",
    "kl_bernoulli",
    "kl_ucb_cost",
    "kl_ucb_cost_one",
    "kl_ucb_upper",
    "kl_ucb_upper_one",
]

_MAX_NEWTON = 60
_REL_TOL = 1e-13


def exploration_bound(tau: int, exploration: float) -> float:
    """C · log τ, after checking C in (0, 1] and τ >= 1."""
    if not 0.0 < exploration <= 1.0:
        msg = f"exploration factor C must be in (0, 1], got {exploration!r}"
        raise BanditUsageError(msg)
    if tau < 1:
        msg = f"time index tau must be >= 1, got {tau!r}"
        raise BanditUsageError(msg)
    return exploration * math.log(tau)


def kl_bernoulli(p: ArrayLike, q: ArrayLike) -> NDArray[np.float64]:
    """KL(p, q) between Bernoulli distributions, elementwise, with 0 log 0 = 0."""
    p_arr = np.asarray(p, dtype=np.float64)
    q_arr = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p_arr > 0, p_arr * np.log(p_arr / q_arr), 0.0)
        b = np.where(p_arr < 1, (1 - p_arr) * np.log((1 - p_arr) / (1 - q_arr)), 0.0)
    return np.asarray(a + b, dtype=np.float64)


def kl_ucb_upper(
    theta_hat: ArrayLike, attempts: ArrayLike, bound: ArrayLike
) -> NDArray[np.float64]:
    """u* = max{u in [θ̂, 1] : t' · KL(θ̂, u) <= bound}, elementwise; 1 where t' = 0."""
    p, t, b = np.broadcast_arrays(
        np.asarray(theta_hat, dtype=np.float64),
        np.asarray(attempts, dtype=np.float64),
        np.asarray(bound, dtype=np.float64),
    )
    u = np.ones(p.shape, dtype=np.float64)
    tried = t > 0
    d = np.zeros(p.shape, dtype=np.float64)
    np.divide(b, t, out=d, where=tried)
    exact = tried & (d <= 0) & (p < 1)
    u[exact] = p[exact]
    never = tried & (d > 0) & (p <= 0)
    u[never] = -np.expm1(-d[never])
    inner = tried & (d > 0) & (p > 0) & (p < 1)
    if inner.any():
        u[inner] = _newton_upper(p[inner], d[inner])
    return u


def kl_ucb_cost(
    successes: ArrayLike, attempts: ArrayLike, tau: int, exploration: float
) -> NDArray[np.float64]:
    """ω = 1 / u* per link, >= 1; +inf only for a link that never succeeded at τ = 1."""
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(attempts, dtype=np.float64)
    theta_hat = np.zeros(np.broadcast_shapes(s.shape, t.shape), dtype=np.float64)
    np.divide(s, t, out=theta_hat, where=t > 0)
    u = kl_ucb_upper(theta_hat, t, exploration_bound(tau, exploration))
    with np.errstate(divide="ignore"):
        return np.asarray(1.0 / u, dtype=np.float64)


def _newton_upper(p: NDArray[np.float64], d: NDArray[np.float64]) -> NDArray[np.float64]:
    """Root of KL(p, u) = d on (p, 1) for 0 < p < 1 and d > 0, by Newton in x = -log(1-u)."""
    q = 1.0 - p
    neg_entropy = p * np.log(p) + q * np.log(q)
    x = (d - neg_entropy) / q
    guess = p + np.sqrt(2.0 * p * q * d)
    ok = guess < 1.0
    x[ok] = np.minimum(x[ok], -np.log1p(-guess[ok]))
    x_floor = -np.log1p(-p)
    offset = neg_entropy - d
    for _ in range(_MAX_NEWTON):
        u = -np.expm1(-x)
        # f / f' with f = KL - d and f' = (u - p) / u; the gap is > 0 right of p, and
        # should rounding put x on the floor, a huge step right recovers.
        step = (offset + q * x - p * np.log(u)) * u / np.maximum(u - p, 1e-300)
        done = bool((np.abs(step) <= _REL_TOL * (1.0 + x)).all())
        x = np.maximum(x - step, x_floor)
        if done:
            break
    return np.asarray(-np.expm1(-x), dtype=np.float64)


def kl_ucb_upper_one(theta_hat: float, attempts: float, bound: float) -> float:
    """:func:`kl_ucb_upper` for one link, in plain floats."""
    if attempts <= 0 or theta_hat >= 1.0:
        return 1.0
    d = bound / attempts
    if d <= 0:
        return theta_hat
    if theta_hat <= 0:
        return -math.expm1(-d)
    p, q = theta_hat, 1.0 - theta_hat
    neg_entropy = p * math.log(p) + q * math.log(q)
    x = (d - neg_entropy) / q
    guess = p + math.sqrt(2.0 * p * q * d)
    if guess < 1.0:
        x = min(x, -math.log1p(-guess))
    x_floor = -math.log1p(-p)
    offset = neg_entropy - d
    for _ in range(_MAX_NEWTON):
        u = -math.expm1(-x)
        step = (offset + q * x - p * math.log(u)) * u / max(u - p, 1e-300)
        done = abs(step) <= _REL_TOL * (1.0 + x)
        x = max(x - step, x_floor)
        if done:
            break
    return -math.expm1(-x)


def kl_ucb_cost_one(successes: float, attempts: float, bound: float) -> float:
    """ω = 1 / u* for one link, given the bound C · log τ from :func:`exploration_bound`."""
    u = kl_ucb_upper_one(successes / attempts if attempts > 0 else 0.0, attempts, bound)
    return 1.0 / u if u > 0 else math.inf
