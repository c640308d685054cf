"""Operating a site: a peer's Prometheus metrics and its live web dashboard.

``agiledart peer --metrics-port P`` serves :mod:`agiledart.site.metrics` at
``/metrics``; ``--dashboard-port P`` (and ``--dashboard-host``, default 127.0.0.1)
serves :mod:`agiledart.site.dashboard`, behind a token derived from the cluster key
(``agiledart dashboard-url --via HOST:PORT`` prints its URL). Both run on the tiny
asyncio HTTP server of :mod:`agiledart.site.http` in the peer's task group. The
exceptions are in :mod:`agiledart.site.errors`.

``prometheus_client`` is imported only by a peer that serves metrics.
"""

from __future__ import annotations

from agiledart.site.dashboard import Dashboard, dashboard_token
from agiledart.site.errors import HttpError, NoSiteServices, SiteConfigError, SiteError
from agiledart.site.service import Site

__all__ = [
    "Dashboard",
    "HttpError",
    "NoSiteServices",
    "Site",
    "SiteConfigError",
    "SiteError",
    "dashboard_token",
]
