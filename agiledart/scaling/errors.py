"""Errors of :mod:`agiledart.scaling`.

::

    AgiledartError                   (agiledart.errors)
    └── ScalingError                 anything this package raises on purpose
        └── ScalingUsageError        local misuse: a target outside (0, 1], max < 1, a
                                     negative or NaN measurement, an unknown operator

Every input of this package comes from the local peer (its own meters and config);
there is no remote party to misbehave, so there is no remote error type.
"""

from __future__ import annotations

from agiledart.errors import AgiledartError

__all__ = ["ScalingError", "ScalingUsageError"]


class ScalingError(AgiledartError):
    """Base class of every error :mod:`agiledart.scaling` raises on purpose."""


class ScalingUsageError(ScalingError):
    """The caller misused the API: a parameter or a measurement out of range."""
