"""The secant rule for an operator's instance count (paper §IV-C, eq. 1).

Scaling is root finding: find the instance count x with f(x) = f*, where f is the
health score (:mod:`agiledart.scaling.health`) and f* the target (default 0.9; the
paper's f* = 1 is the special case). f is only known where it was measured, one point
per phase, so the rule is the secant method over the last two phases' points
(x_{n−1}, f_{n−1}) and (x_n, f_n):

    x_{n+1} = x_n + (f* − f_n) · (x_n − x_{n−1}) / (f_n − f_{n−1})

It needs no model of the operator: contention for cores, a slower peer or a costlier
record mix all show up in the measured points. The raw formula is
:func:`secant_estimate`. :meth:`SecantRule.step` wraps it in the safeguards that make
a root finder usable on noisy integer data:

1. Dead-band: |f_n − f*| <= ``tolerance`` -> keep x_n. Noise smaller than the band
   never moves the count. f < 1 always, so f* = 1 needs a tolerance > 0 (it then
   means f >= 1 − tolerance).
2. No usable slope: no previous point (the first decision), equal f values,
   f falling as capacity rose (noise: f rises with capacity), or, for a step
   up, f values within ``resolution`` of each other (the noise floor: extrapolating
   a slope between two points closer than the noise extrapolates the noise, and a
   step up has no bound but ``max_instances``). Then step by one toward the target; but
   when the last move already went that way and f did not rise across it, probe
   twice as far as that move (at most doubling the count), so a flat stretch of f
   (an idle operator, a saturated top, a stuck floor) costs log2 decisions, not one
   per instance.
3. Round up: x_{n+1} = ceil(estimate), the smallest count the secant line predicts
   reaches f*. A step is at least one (up, or down from over the dead-band); rounding
   to the nearest could stop one count short of the band.
4. Bounded descent: a step down keeps at least ``max_shrink`` of the instances
   (default half). Above the reference f saturates, the line through two
   over-provisioned points is nearly flat and its root far too low; halving reaches
   the target in log2 steps instead of crashing to one instance.
5. Bracket (Dekker's safeguard): ``below``, the largest count measured under the
   dead-band, and ``above``, the smallest measured over it (the two points count
   too), are never revisited: a step that would leave (below, above), or, with both
   known, go past the middle of the bracket, bisects it instead. When no count is
   left inside, the answer is ``above`` (too many instances beat too few): a count
   over the band whose lower neighbour is under it holds. So the count never
   alternates between two values (A, B, A, B), with or without noise.
6. Clamp to [1, ``max_instances``].

:class:`SecantSearch` is the rule's memory for one operator (the two points and the
bracket). The cool-down between decisions is :meth:`SecantRule.cooled_down`, with the
time passed in. No clock, no I/O.

Convergence (decisions until the count stays; dead-band 0.9 ± 0.05; tests in
``tests/scaling``): on this package's health curve 2 from one instance (+1, then one
exact secant step, f being linear in x below the reference; 3 when the need exceeds
~90 instances, the first two points then lying within ``resolution``), at most 4 from
anywhere in [x*/2, 2x*] and 5 in [x*/4, 4x*]. On f = 1 − e^(−a·x): 2-5 from one
instance. On a logistic: 2-4 from a count on its slope, but up to ~14 from its flat
floor, where the first secant step overshoots to the flat top and the bracket then
bisects back (DS2 needs at most 3 because it models rates; the secant only sees f).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agiledart.scaling.errors import ScalingUsageError
from agiledart.scaling.health import REFERENCE_HEALTH, check_instances

__all__ = ["DEFAULT_TARGET", "Point", "SecantRule", "SecantSearch", "secant_estimate"]

DEFAULT_TARGET = REFERENCE_HEALTH

#: float slack: estimates this close to an integer are that integer, f this close to
#: the dead-band's edge is on it
_ROUNDING_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class Point:
    """One phase: ``instances`` ran and the operator's health was ``health``."""

    instances: int
    health: float


def secant_estimate(current: Point, previous: Point, target: float) -> float:
    """Eq. 1 unguarded: the real-valued x where the line through the two points meets
    ``target``. Raises :class:`ScalingUsageError` when the line has no root (equal f)."""
    df = current.health - previous.health
    if df == 0:
        msg = f"equal health {current.health} at {previous.instances} and {current.instances}"
        raise ScalingUsageError(msg)
    dx = current.instances - previous.instances
    return current.instances + (target - current.health) * dx / df


@dataclass(frozen=True, slots=True, kw_only=True)
class SecantRule:
    """The guarded secant rule (module docstring) and its settings."""

    max_instances: int
    """The most instances the operator may run (typically the peer's workers)."""
    target: float = DEFAULT_TARGET
    """f* in (0, 1]."""
    tolerance: float = 0.05
    """Half-width of the dead-band around f*, in [0, 1); > 0 when f* = 1."""
    cooldown_s: float = 30.0
    """Seconds between two changes of the instance count, >= 0."""
    max_shrink: float = 0.5
    """A step down keeps at least this share of the instances, in (0, 1)."""
    resolution: float = 0.01
    """Health values closer than this are equal (the score's noise floor), in [0, 1)."""

    def __post_init__(self) -> None:
        check_instances(self.max_instances, "max_instances")
        if not (isinstance(self.target, int | float) and 0 < self.target <= 1):
            msg = f"target must be in (0, 1], got {self.target!r}"
            raise ScalingUsageError(msg)
        tol = self.tolerance
        if not (isinstance(tol, int | float) and 0 <= tol < 1):
            msg = f"tolerance must be in [0, 1), got {tol!r}"
            raise ScalingUsageError(msg)
        if self.target == 1 and tol == 0:
            msg = "target 1 needs a tolerance > 0: the health score never reaches 1"
            raise ScalingUsageError(msg)
        cool = self.cooldown_s
        if not (isinstance(cool, int | float) and 0 <= cool < math.inf):
            msg = f"cooldown_s must be a finite number >= 0, got {cool!r}"
            raise ScalingUsageError(msg)
        res = self.resolution
        if not (isinstance(res, int | float) and 0 <= res < 1):
            msg = f"resolution must be in [0, 1), got {res!r}"
            raise ScalingUsageError(msg)
        if not (isinstance(self.max_shrink, int | float) and 0 < self.max_shrink < 1):
            msg = f"max_shrink must be in (0, 1), got {self.max_shrink!r}"
            raise ScalingUsageError(msg)

    def under(self, health: float) -> bool:
        """Whether ``health`` is under the dead-band (too few instances)."""
        return health < self.target - self.tolerance - _ROUNDING_SLACK

    def over(self, health: float) -> bool:
        """Whether ``health`` is over the dead-band (too many instances)."""
        return health > self.target + self.tolerance + _ROUNDING_SLACK

    def settled(self, health: float) -> bool:
        """Whether ``health`` is within the dead-band around the target (its edges
        included, with float slack: 0.9 − 0.85 is not 0.05 in binary)."""
        return not self.under(health) and not self.over(health)

    def cooled_down(self, now: float, last_change: float | None) -> bool:
        """Whether a change may be decided at ``now``, the last one made at
        ``last_change`` (None: never), both on the caller's monotonic clock."""
        return last_change is None or now - last_change >= self.cooldown_s

    def clamp(self, instances: int) -> int:
        return min(self.max_instances, max(1, instances))

    def step(
        self,
        current: Point,
        previous: Point | None = None,
        *,
        below: int | None = None,
        above: int | None = None,
    ) -> int:
        """The next instance count from the current phase's point, the previous phase's
        (None on the first decision) and the bracket: ``below``, the largest count
        measured under the dead-band, ``above``, the smallest measured over it (None:
        unknown). Equal to ``current.instances``: hold."""
        x = check_instances(current.instances)
        f = _health(current.health)
        if below is not None:
            check_instances(below, "below")
        if above is not None:
            check_instances(above, "above")
            if below is not None and below >= above:
                msg = f"the bracket must have below < above, got {below} and {above}"
                raise ScalingUsageError(msg)
        if self.settled(f):
            return self.clamp(x)
        up = f < self.target
        direction = 1 if up else -1
        # a step down is bounded by max_shrink, a step up is not: only up must a
        # slope stand clear of the noise floor
        slope = _slope(current, previous, self.resolution if up else 0.0)
        if slope is not None:
            estimate = x + (self.target - f) / slope
            nxt = math.ceil(estimate - _ROUNDING_SLACK)
            nxt = max(nxt, x + 1) if up else min(nxt, x - 1)
        elif previous is not None and (x - previous.instances) * direction > 0:
            # on the way, and f did not rise across the last move: probe twice as far
            nxt = x + direction * min(2 * abs(x - previous.instances), x)
        else:
            nxt = x + direction
        if not up:
            nxt = max(nxt, math.ceil(x * self.max_shrink - _ROUNDING_SLACK))
        if previous is not None:
            below, above = self.fold(below, above, previous)
        below, above = self.fold(below, above, current)
        return self.clamp(_bracketed(x, nxt, below, above))

    def fold(
        self, below: int | None, above: int | None, point: Point
    ) -> tuple[int | None, int | None]:
        """The bracket updated with ``point``, the newest measurement at its count:
        under the dead-band raises ``below`` to it, over lowers ``above`` to it, and
        bounds that contradict it are dropped."""
        x, f = check_instances(point.instances), _health(point.health)
        under, over = self.under(f), self.over(f)
        if under:  # too few at x, so at any count <= x
            below = x if below is None else max(below, x)
        elif over:  # too many at x, so at any count >= x
            above = x if above is None else min(above, x)
        if below is not None and below >= x and not under:
            below = None
        if above is not None and above <= x and not over:
            above = None
        return below, above


def _slope(current: Point, previous: Point | None, resolution: float) -> float | None:
    """The secant's slope, None when unusable: no previous point, the same count, f
    values equal within ``resolution``, or f falling with capacity (which f, rising with
    capacity, shows only through noise)."""
    if previous is None or previous.instances == current.instances:
        return None
    dx = current.instances - check_instances(previous.instances)
    df = current.health - _health(previous.health)
    if abs(df) <= resolution or df * dx <= 0:
        return None
    return df / dx


def _bracketed(x: int, nxt: int, below: int | None, above: int | None) -> int:
    """Keep ``nxt`` strictly inside (below, above), and with both known between ``x``
    and the middle of the bracket (Dekker's safeguard); bisect when it is not. With no
    count left inside, take ``above``: too many instances beat too few."""
    lo = 0 if below is None else below
    if above is not None and above - lo <= 1:
        return above
    if above is None:
        return max(nxt, lo + 1)
    middle = (lo + above + 1) // 2
    if not lo < nxt < above:
        return middle
    if below is not None and not min(x, middle) <= nxt <= max(x, middle):
        return middle
    return nxt


class SecantSearch:
    """The rule's memory for one operator: the last two phases' points and the bracket.

    :meth:`observe` takes the health measured at the current count and returns the next
    count. Repeated observations at the same count refine that count's point (the
    latest wins); a new count pushes the old point back to ``previous``. The bracket is
    kept consistent with the newest measurement at each count. :meth:`forget` drops
    everything, for when the load the points were measured under is gone.
    """

    __slots__ = ("above", "below", "current", "previous", "rule")

    def __init__(self, rule: SecantRule) -> None:
        self.rule = rule
        self.current: Point | None = None
        self.previous: Point | None = None
        self.below: int | None = None
        self.above: int | None = None

    def forget(self) -> None:
        self.current = self.previous = None
        self.below = self.above = None

    def record(self, point: Point) -> None:
        """Remember ``point`` without deciding (see :meth:`observe`)."""
        self.below, self.above = self.rule.fold(self.below, self.above, point)
        if self.current is not None and self.current.instances != point.instances:
            self.previous = self.current
        self.current = point

    def observe(self, point: Point) -> int:
        """Record ``point`` and return the next count (``point.instances``: hold)."""
        self.record(point)
        return self.rule.step(point, self.previous, below=self.below, above=self.above)


def _health(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        msg = f"a health score must be in [0, 1], got {value!r}"
        raise ScalingUsageError(msg)
    return float(value)
