"""Errors of :mod:`agiledart.traces`.

::

    AgiledartError                  (agiledart.errors)
    └── TraceError                  anything this package raises on purpose
        └── TraceSchemaError        a trace record that does not follow the schema
                                    (also a ValueError, as callers have long caught it)
"""

from __future__ import annotations

from agiledart.errors import AgiledartError

__all__ = ["TraceError"]


class TraceError(AgiledartError):
    """Base class of every error :mod:`agiledart.traces` raises on purpose."""
