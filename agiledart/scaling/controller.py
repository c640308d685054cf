"""One operator's scaling controller (paper §IV-C; docs/scaling.md).

Every peer runs one :class:`ScalingController` per operator it hosts; decisions are
local, there is no master. The driver (the peer's runtime, once a second or so) passes
the time and a :class:`Measurement` to :meth:`ScalingController.observe` and gets a
:class:`ScalingDecision` back; carrying it out (starting instances, asking a leaf-set
peer to take some, migrating state) is the driver's job.

Theory of operation, per observation:

1. Score: f = :func:`~agiledart.scaling.health.health` of the measurement.
2. Cool-down: within ``rule.cooldown_s`` of the last change, hold and record nothing:
   the operator is still settling (new instances warming up, a backlog draining), so
   its measurements do not describe the new count yet.
3. No service rate measured yet (and some demand): hold; the score has no evidence.
4. Load drift: the secant's points are only comparable under the same input rate. When
   λ has moved by more than ``rate_drift`` (relative) since the points were taken, the
   search forgets them and starts again from the current point. The same holds for μ
   (the cost of a record changed: a load step of the operator itself), judged with the
   same threshold over two observations in a row (one noisy second is not a step).
5. The secant rule (:class:`~agiledart.scaling.secant.SecantSearch`) proposes a count.
6. Bottleneck, when f is under the dead-band (paper §IV-C):

   * ``compute``: the instances are busy (or the links are not saturated): scale
     **up** to the proposed count, on this peer's workers;
   * ``bandwidth``: the output links are saturated (the operator waited for credits
     ``link_wait`` of the time, at least ``link_saturated``) while the instances are
     not busy (``busy`` under ``busy_high``): more instances here would wait on the
     same links. A stateless operator **scales out** to the proposed count, the new
     instances on leaf-set peers; a stateful one **migrates** with its state to a
     leaf-set peer on a better path, keeping its count. Either changes the health
     curve, so the search forgets its points.

   Over the dead-band the rule may scale **down** (compute only: fewer instances never
   need more bandwidth).

Decisions that change something start the cool-down. Every decision can be written as
the ``scaling`` trace record (:meth:`ScalingDecision.trace_fields`). No clock, no I/O.

::

    observe(now, m) ─ cool-down? ───────────────────────────────────── hold
                    ─ μ unknown? ───────────────────────────────────── hold
                    ─ f in dead-band, or the rule keeps x ──────────── hold
                    ─ f < f* − tol ─ compute ───────────────────────── up N
                                   ─ bandwidth ─ stateless ─────────── scale-out N
                                               ─ stateful ──────────── migrate
                    ─ f > f* + tol ─────────────────────────────────── down N
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from agiledart.scaling.errors import ScalingUsageError
from agiledart.scaling.health import (
    DEFAULT_MODEL,
    HealthModel,
    HealthScore,
    check_instances,
    health,
)
from agiledart.scaling.secant import Point, SecantRule, SecantSearch

__all__ = [
    "Action",
    "Bottleneck",
    "Measurement",
    "ScalingController",
    "ScalingDecision",
    "ScalingPolicy",
]


class Action(StrEnum):
    """What to do; the values are the ``decision`` field of the ``scaling`` trace."""

    HOLD = "hold"
    UP = "up"
    DOWN = "down"
    SCALE_OUT = "scale-out"
    MIGRATE = "migrate"


class Bottleneck(StrEnum):
    COMPUTE = "compute"
    BANDWIDTH = "bandwidth"


def _share(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        msg = f"{name} must be a share in [0, 1], got {value!r}"
        raise ScalingUsageError(msg)
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """What the driver measured over the last window for one operator."""

    instances: int
    """x, the instances running now."""
    rate: float
    """λ, records/s offered to the operator (arrivals at its inboxes)."""
    service_rate: float | None
    """μ, records/s one instance executes (1 / service time); None: not measured yet."""
    queue: float
    """q, records waiting in the operator's inboxes."""
    busy: float
    """Share of the window the instances spent executing (their mean), in [0, 1]."""
    link_wait: float = 0.0
    """Share of the window the operator waited for output credit, in [0, 1]."""

    def __post_init__(self) -> None:
        check_instances(self.instances)
        _share("busy", self.busy)
        _share("link_wait", self.link_wait)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingPolicy:
    """Everything a controller is configured with."""

    rule: SecantRule
    model: HealthModel = DEFAULT_MODEL
    busy_high: float = 0.8
    """Instances busy at least this share of the time are compute-bound."""
    link_saturated: float = 0.5
    """Waiting for output credit at least this share of the time: the links are full."""
    rate_drift: float = 0.25
    """Forget the secant's points when λ moved by more than this share since."""
    down_after: int = 1
    """Step down only after this many observations in a row over the dead-band (a
    stabilisation window: one noisy reading does not shed an instance)."""
    through_origin: bool = False
    """Use that f comes from a headroom linear in x (agiledart.scaling.health): a first
    step up (no previous point) along the line through the origin, f(0) = 0, rather
    than by one (one decision from a deep overload, see ``_through_origin``), and no
    step down to a count predicted to fall short of f* (``_predicted_down``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.rule, SecantRule):
            msg = f"rule must be a SecantRule, got {self.rule!r}"
            raise ScalingUsageError(msg)
        _share("busy_high", self.busy_high)
        _share("link_saturated", self.link_saturated)
        drift = self.rate_drift
        if not (isinstance(drift, int | float) and 0 < drift < math.inf):
            msg = f"rate_drift must be a finite number > 0, got {drift!r}"
            raise ScalingUsageError(msg)
        if isinstance(self.down_after, bool) or not isinstance(self.down_after, int):
            msg = f"down_after must be an int >= 1, got {self.down_after!r}"
            raise ScalingUsageError(msg)
        if self.down_after < 1:
            msg = f"down_after must be an int >= 1, got {self.down_after!r}"
            raise ScalingUsageError(msg)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingDecision:
    """One decision for one operator: ``action`` taking it from ``instances`` to
    ``target`` instances (equal for hold and migrate), and why."""

    app: str
    operator: str
    action: Action
    instances: int
    target: int
    health: float
    reason: str
    bottleneck: Bottleneck | None = None

    @property
    def changes(self) -> bool:
        """Whether the driver has something to do."""
        return self.action is not Action.HOLD

    def trace_fields(self) -> dict[str, str | int | float]:
        """The fields of the ``scaling`` trace record (agiledart.traces.schema), to be
        written as ``writer.emit("scaling", **decision.trace_fields())``."""
        return {
            "app": self.app,
            "operator": self.operator,
            "health": self.health,
            "instances": self.instances,
            "target": self.target,
            "decision": self.action.value,
        }


class ScalingController:
    """The scaling state machine of one operator (module docstring)."""

    def __init__(self, app: str, operator: str, *, stateful: bool, policy: ScalingPolicy) -> None:
        self.app = app
        self.operator = operator
        self.stateful = stateful
        self.policy = policy
        self.search = SecantSearch(policy.rule)
        self.last_change: float | None = None  #: when the last change was decided
        self._last_now = -math.inf
        self._rate_ref: float | None = None  # λ when the search's points were taken
        self._mu_ref: float | None = None  # μ when the search's points were taken
        self._over = 0  # observations in a row over the dead-band wanting fewer
        self._mu_moved = 0  # observations in a row with μ away from its reference

    def classify(self, m: Measurement) -> Bottleneck:
        """Compute unless the output links are saturated while the workers are not."""
        p = self.policy
        if m.link_wait >= p.link_saturated and m.busy < p.busy_high:
            return Bottleneck.BANDWIDTH
        return Bottleneck.COMPUTE

    def observe(self, now: float, m: Measurement) -> ScalingDecision:
        """Decide at ``now`` (the driver's monotonic clock, seconds) from ``m``."""
        if not isinstance(now, int | float) or math.isnan(now) or now < self._last_now:
            msg = f"now must not go backwards: {now!r} after {self._last_now!r}"
            raise ScalingUsageError(msg)
        self._last_now = now
        score = health(
            m.instances,
            rate=m.rate,
            service_rate=m.service_rate,
            queue=m.queue,
            model=self.policy.model,
        )
        rule = self.policy.rule
        if self.last_change is not None and not rule.cooled_down(now, self.last_change):
            left = rule.cooldown_s - (now - self.last_change)
            return self._hold(m, score, f"cool-down, {left:.1f}s left")
        if not score.known:
            return self._hold(m, score, "no service time measured yet")
        self._track_drift(m.rate, m.service_rate)
        nxt = self.search.observe(Point(m.instances, score.value))
        f, x = score.value, m.instances
        self._over = self._over + 1 if nxt < x and rule.over(f) else 0
        if rule.under(f):
            return self._under(now, m, score, nxt)
        if nxt < x and self.policy.through_origin:
            nxt = self._predicted_down(m, nxt)
            if nxt == x:
                self._over = 0  # every reading of the window must allow the step
                why = f"over the dead-band: f={f:.3f}, but {x - 1} would fall short of f*"
                return self._hold(m, score, why)
        if nxt < x and 0 < self._over < self.policy.down_after:
            why = f"over the dead-band: f={f:.3f} ({self._over} of {self.policy.down_after})"
            return self._hold(m, score, why)
        if nxt < x:
            why = "over the dead-band" if rule.over(f) else "over max_instances"
            return self._change(now, m, score, Action.DOWN, nxt, f"{why}: f={f:.3f}")
        if rule.settled(f):
            return self._hold(m, score, f"healthy: f={f:.3f} within the dead-band")
        if x == 1:
            return self._hold(m, score, f"over the dead-band: f={f:.3f}, at one instance")
        return self._hold(m, score, f"over the dead-band: f={f:.3f}, but {x - 1} was under it")

    def _under(self, now: float, m: Measurement, score: HealthScore, nxt: int) -> ScalingDecision:
        f, x = score.value, m.instances
        kind = self.classify(m)
        if kind is Bottleneck.BANDWIDTH:
            why = f"output links saturated (link_wait={m.link_wait:.2f}, busy={m.busy:.2f})"
            if self.stateful:
                self.search.forget()
                return self._change(now, m, score, Action.MIGRATE, x, why, kind)
            if nxt > x:
                self.search.forget()
                return self._change(now, m, score, Action.SCALE_OUT, nxt, why, kind)
        else:
            nxt = max(nxt, self._through_origin(m))
        if kind is Bottleneck.COMPUTE and nxt > x:
            why = f"under the dead-band: f={f:.3f}, busy={m.busy:.2f}"
            return self._change(now, m, score, Action.UP, nxt, why, kind)
        return self._hold(m, score, f"under the dead-band: f={f:.3f}, at max_instances", kind)

    def _predicted_down(self, m: Measurement, nxt: int) -> int:
        """The lowest count in [nxt, x) at which the health model, its headroom linear
        in the count (:mod:`agiledart.scaling.health`), predicts f >= f* (x: none), so a
        step down is not a probe that comes straight back up."""
        x, model, rule = m.instances, self.policy.model, self.policy.rule
        for count in range(nxt, x):
            predicted = health(
                count, rate=m.rate, service_rate=m.service_rate, queue=m.queue, model=model
            )
            if predicted.value >= rule.target:
                return count
        return x

    def _through_origin(self, m: Measurement) -> int:
        """With no previous point (the first decision since the load changed), the
        secant through the current point and the origin: no instances serve nothing,
        f(0) = 0, and f is proportional to the capacity under the reference, so this is
        the count that reaches f* in one step (DS2's rate model). The point is scored
        without the backlog (q = 0): a queue that grew during the step would otherwise
        ask for capacity to drain it at once, an overshoot to take back later; the
        secant's next steps see the backlog. Never past a count known to be over the
        dead-band."""
        rule, search, x = self.policy.rule, self.search, m.instances
        if not self.policy.through_origin or search.previous is not None or not m.rate:
            return x
        score = health(
            x, rate=m.rate, service_rate=m.service_rate, queue=0, model=self.policy.model
        )
        if not score.known or score.value <= 0 or not rule.under(score.value):
            return x
        nxt = rule.clamp(math.ceil(x * rule.target / score.value - 1e-9))
        return nxt if search.above is None else min(nxt, search.above)

    def _track_drift(self, rate: float, mu: float | None) -> None:
        drift = self.policy.rate_drift
        ref, mu_ref = self._rate_ref, self._mu_ref
        mu = mu if mu is not None and math.isfinite(mu) else None
        moved = ref is not None and abs(rate - ref) > drift * max(rate, ref)
        if mu is not None and mu_ref is not None and abs(mu - mu_ref) > drift * max(mu, mu_ref):
            self._mu_moved += 1  # the cost of a record changed, if it stays changed
            moved = moved or self._mu_moved >= 2
        else:
            self._mu_moved = 0
        if moved:
            self._mu_moved = 0
            self.search.forget()
            ref = mu_ref = None
        if ref is None:
            self._rate_ref = float(rate)
        if mu_ref is None:
            self._mu_ref = mu

    def _hold(
        self, m: Measurement, score: HealthScore, reason: str, kind: Bottleneck | None = None
    ) -> ScalingDecision:
        return self._decision(m, score, Action.HOLD, m.instances, reason, kind)

    def _change(
        self,
        now: float,
        m: Measurement,
        score: HealthScore,
        action: Action,
        target: int,
        reason: str,
        kind: Bottleneck | None = None,
    ) -> ScalingDecision:
        self.last_change = now
        if action is Action.MIGRATE or action is Action.SCALE_OUT:
            self._rate_ref = self._mu_ref = None
        return self._decision(m, score, action, target, reason, kind)

    def _decision(
        self,
        m: Measurement,
        score: HealthScore,
        action: Action,
        target: int,
        reason: str,
        kind: Bottleneck | None,
    ) -> ScalingDecision:
        return ScalingDecision(
            app=self.app,
            operator=self.operator,
            action=action,
            instances=m.instances,
            target=target,
            health=score.value,
            reason=reason,
            bottleneck=kind,
        )
