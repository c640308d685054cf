"""agiledart.scaling: elastic scaling of operators (paper §IV-C, docs/scaling.md).

Pure: values in, decisions out; the time is passed in, nothing is read from a clock.

* :mod:`~agiledart.scaling.health`: the health score f(x) in (0, 1) of an operator
  running x instances, from its input rate, service rate and queue.
* :mod:`~agiledart.scaling.secant`: the secant rule that moves x toward f(x) = f*,
  with its guards (dead-band, equal f, rounding, bounded descent, bracket, clamp,
  cool-down), and :class:`SecantSearch`, its memory for one operator.
* :mod:`~agiledart.scaling.controller`: :class:`ScalingController`, one per hosted
  operator: cool-down, compute vs bandwidth bottleneck, and a typed
  :class:`ScalingDecision` (hold, up, down, scale-out, migrate) that serialises to the
  ``scaling`` trace record.

Exceptions (:mod:`~agiledart.scaling.errors`)::

    ScalingError(AgiledartError)
    └── ScalingUsageError    local misuse: bad target, max < 1, a bad measurement
"""

from agiledart.scaling.controller import (
    Action,
    Bottleneck,
    Measurement,
    ScalingController,
    ScalingDecision,
    ScalingPolicy,
)
from agiledart.scaling.errors import ScalingError, ScalingUsageError
from agiledart.scaling.health import (
    HEALTH_MAX,
    HEALTH_MIN,
    REFERENCE_HEALTH,
    HealthModel,
    HealthScore,
    health,
    health_from_headroom,
    service_rate,
)
from agiledart.scaling.secant import (
    DEFAULT_TARGET,
    Point,
    SecantRule,
    SecantSearch,
    secant_estimate,
)

__all__ = [
    "DEFAULT_TARGET",
    "HEALTH_MAX",
    "HEALTH_MIN",
    "REFERENCE_HEALTH",
    "Action",
    "Bottleneck",
    "HealthModel",
    "HealthScore",
    "Measurement",
    "Point",
    "ScalingController",
    "ScalingDecision",
    "ScalingError",
    "ScalingPolicy",
    "ScalingUsageError",
    "SecantRule",
    "SecantSearch",
    "health",
    "health_from_headroom",
    "secant_estimate",
    "service_rate",
]
