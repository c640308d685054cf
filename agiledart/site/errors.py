"""Exceptions of the site services (the metrics endpoint and the dashboard).

::

    AgiledartError
    └── SiteError
        ├── SiteConfigError    local misuse: a port that cannot be bound, a dashboard of
        │                      an --insecure peer on a non-loopback address
        ├── NoSiteServices     the peer asked serves neither metrics nor a dashboard
        └── HttpError          what an HTTP client sent is unusable; carries the 4xx
                               status the server answers with (remote misbehaviour)
"""

from __future__ import annotations

from agiledart.errors import AgiledartError

__all__ = ["HttpError", "NoSiteServices", "SiteConfigError", "SiteError"]


class SiteError(AgiledartError):
    """Base class of the site services' errors."""


class SiteConfigError(SiteError):
    """The site services were configured wrongly (a local mistake)."""


class NoSiteServices(SiteError):
    """A peer was asked for its dashboard or metrics but serves neither."""


class HttpError(SiteError):
    """An HTTP client sent something we refuse; answered with ``status`` and closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
