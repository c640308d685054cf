"""The health score f(x) of an operator running x instances (paper §IV-C).

The paper asks for a score in (0, 1), 1 best, "based on the input rate and the queue
size", that rises with capacity; the secant rule then looks for the instance count x
with f(x) = f*. Here it is computed from three measurements of the operator and two
settings:

* λ, the arrival rate at the operator's inbox (records/s offered, not processed);
* μ, the service rate of one instance (records/s, 1 / service time), None until the
  first record has been executed;
* q, the records waiting in the inbox;
* ρ̂, the reference utilisation (default 0.7) and L, the target latency (default 1 s).

Theory of operation. x instances serve C = x·μ records/s. Over the next L seconds the
operator must serve the λ·L records that will arrive and the q already waiting, so its
*demand* is D = λ + q/L records/s and its *load* is

    ρ_L = D / C = ρ + q / (x·μ·L),   ρ = λ / (x·μ) the plain utilisation.

ρ_L folds the queue's drain time into the utilisation: when x·μ > λ the backlog drains
in q / (x·μ − λ) seconds, and that is at most L exactly when ρ_L <= 1. Unlike the drain
time itself ρ_L stays finite in overload, so one number covers both regimes. The
*headroom* h = ρ̂ / ρ_L = ρ̂·x·μ / D is 1 at the reference utilisation, 2 with twice the
capacity needed there, and it is linear in x. The score is

    f = f_ref · h                              for h <= 1  (under-provisioned)
    f = 1 − (1 − f_ref) · 10^−(h − 1)          for h >  1  (spare capacity)

with f_ref = 0.9, clipped to [1e-9, 1 − 1e-9] so that it stays in the open interval in
floating point. Why this shape:

* f = 0.9, the default target f*, exactly at the reference utilisation with no
  backlog, so the target has an operational meaning (ρ̂ is the knob, f* rarely is).
* Below the reference f is proportional to the capacity, so the secant line through
  two under-provisioned points is exact: from a deep overload the rule lands on the
  right count in one secant step, as DS2's rate model does (OSDI 2018, the paper's
  [36]). Measurement noise in λ and μ is relative, so the slope stays reliable.
* Above the reference, each further unit of headroom (another x* instances, x* the
  count at the reference) adds a nine (h = 2 -> 0.99, h = 3 -> 0.999), so
  over-provisioning is penalised gently: the default dead-band 0.9 ± 0.05 accepts
  h in [0.94, 1.30], i.e. 6 % too little to 30 % too much capacity. f is continuous
  and strictly increasing in x, concave, with a kink at h = 1; the secant rule needs no
  derivative. It saturates for large h: :mod:`agiledart.scaling.secant` bounds a
  step down for that reason.
* Cheap: a few float operations, no history.

Special cases: no demand (λ = 0, q = 0) is the best score whatever μ is; μ unknown with
demand is the reference score 0.9 with ``load`` None ("no evidence either way": the
controller holds until μ is measured); μ = 0 with demand is the worst score.

λ must be the offered rate. Under credit backpressure an overloaded operator's
arrivals are throttled to what it processes; its full inbox (q) then carries the
excess, which is why the queue is part of the score.

Pure functions over values: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agiledart.scaling.errors import ScalingUsageError

__all__ = [
    "HEALTH_MAX",
    "HEALTH_MIN",
    "REFERENCE_HEALTH",
    "HealthModel",
    "HealthScore",
    "health",
    "health_from_headroom",
    "service_rate",
]

#: f at the reference utilisation with no backlog (h = 1); also the default target f*
REFERENCE_HEALTH = 0.9
#: bounds of f: the open interval (0, 1), kept open in floating point
HEALTH_MIN = 1e-9
HEALTH_MAX = 1.0 - 1e-9


def _finite_non_negative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        msg = f"{name} must be a number, got {value!r}"
        raise ScalingUsageError(msg)
    if not math.isfinite(value) or value < 0:
        msg = f"{name} must be a finite number >= 0, got {value!r}"
        raise ScalingUsageError(msg)
    return float(value)


def check_instances(instances: int, name: str = "instances") -> int:
    """``instances`` if it is an int >= 1, else :class:`ScalingUsageError`."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        msg = f"{name} must be an int >= 1, got {instances!r}"
        raise ScalingUsageError(msg)
    return instances


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthModel:
    """The two settings of the score: ρ̂ and L (see the module docstring)."""

    reference_utilization: float = 0.7
    """ρ̂ in (0, 1]: the utilisation scored 0.9, the default target."""
    target_latency_s: float = 1.0
    """L > 0: the backlog should drain within this many seconds."""

    def __post_init__(self) -> None:
        rho = self.reference_utilization
        if not (isinstance(rho, int | float) and 0 < rho <= 1):
            msg = f"reference_utilization must be in (0, 1], got {rho!r}"
            raise ScalingUsageError(msg)
        lat = self.target_latency_s
        if not (isinstance(lat, int | float) and 0 < lat < math.inf):
            msg = f"target_latency_s must be a finite number > 0, got {lat!r}"
            raise ScalingUsageError(msg)


DEFAULT_MODEL = HealthModel()


@dataclass(frozen=True, slots=True)
class HealthScore:
    """f, with the load ρ_L it came from (0 without demand; None when μ is unknown)."""

    value: float
    load: float | None

    @property
    def known(self) -> bool:
        """Whether the score reflects a measured service rate (or no demand at all)."""
        return self.load is not None


def health_from_headroom(headroom: float) -> float:
    """f as a function of the headroom h = ρ̂ / ρ_L >= 0 (+inf allowed)."""
    if math.isnan(headroom) or headroom < 0:
        msg = f"headroom must be >= 0, got {headroom!r}"
        raise ScalingUsageError(msg)
    if headroom <= 1.0:
        f = REFERENCE_HEALTH * headroom
    else:
        f = 1.0 - (1.0 - REFERENCE_HEALTH) * 10.0 ** -(headroom - 1.0)
    return min(HEALTH_MAX, max(HEALTH_MIN, f))


def health(
    instances: int,
    *,
    rate: float,
    service_rate: float | None,
    queue: float,
    model: HealthModel = DEFAULT_MODEL,
) -> HealthScore:
    """The health of an operator running ``instances`` instances.

    ``rate`` λ (records/s offered), ``service_rate`` μ (records/s per instance, None if
    not measured yet, +inf allowed), ``queue`` q (records waiting).
    """
    x = check_instances(instances)
    lam = _finite_non_negative("rate", rate)
    q = _finite_non_negative("queue", queue)
    demand = lam + q / model.target_latency_s
    if demand == 0:
        return HealthScore(HEALTH_MAX, 0.0)
    if service_rate is None:
        return HealthScore(REFERENCE_HEALTH, None)
    if isinstance(service_rate, bool) or math.isnan(service_rate) or service_rate < 0:
        msg = f"service_rate must be None or a number >= 0, got {service_rate!r}"
        raise ScalingUsageError(msg)
    capacity = x * float(service_rate)
    load = demand / capacity if capacity > 0 else math.inf
    headroom = model.reference_utilization * capacity / demand  # = ρ̂ / load, or inf
    return HealthScore(health_from_headroom(headroom), load)


def service_rate(service_us: float | None) -> float | None:
    """μ in records/s from a measured service time per record in µs (None stays None;
    a service time of 0 is an unmeasurably fast operator: +inf)."""
    if service_us is None:
        return None
    s = _finite_non_negative("service_us", service_us)
    return 1e6 / s if s > 0 else math.inf
