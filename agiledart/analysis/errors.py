"""Exceptions of :mod:`agiledart.analysis`.

::

    AgiledartError
    └── AnalysisError                anything this package raises on purpose
        ├── AnalysisUsageError       local misuse: no trace files, a bad option
        └── SparkUnavailableError    pyspark (or Java, or matplotlib) missing or failing

Malformed trace lines are not errors: they are counted, reported and skipped.
"""

from __future__ import annotations

from agiledart.errors import AgiledartError

__all__ = ["AnalysisError", "AnalysisUsageError", "SparkUnavailableError"]


class AnalysisError(AgiledartError):
    """Base class of every error :mod:`agiledart.analysis` raises on purpose."""


class AnalysisUsageError(AnalysisError):
    """The caller got it wrong: a directory without traces, an option out of range."""


class SparkUnavailableError(AnalysisError):
    """Spark cannot run here: pyspark or matplotlib is not installed, or Java failed."""
