"""A peer's HTTP services: the Prometheus endpoint and the dashboard, started with it.

``Site.start(peer, group)`` serves, in the peer's task group:

* metrics on ``--metrics-port`` of the peer's ``--listen`` host, ``GET /metrics``, no
  token (Prometheus convention; put it behind a firewall where that matters);
* the dashboard on ``--dashboard-host:--dashboard-port`` (default host 127.0.0.1),
  behind the dashboard token.

It also answers the ``site`` control RPC (where the two are served), which
``agiledart dashboard-url`` asks before it prints the dashboard's URL with the token it
computes from its own copy of the cluster key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import TYPE_CHECKING, Any

from agiledart.overlay.tcp import ConnectionInfo
from agiledart.site.dashboard import Dashboard, PeerControl, dashboard_token
from agiledart.site.errors import SiteConfigError
from agiledart.site.http import HttpServer

if TYPE_CHECKING:
    from agiledart.peer import Peer

log = logging.getLogger(__name__)

__all__ = ["Site", "is_loopback", "url_host"]

WILDCARD = ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_host(bound: str, fallback: str) -> str:
    """The host for a URL to a server bound to ``bound``: ``fallback`` for a wildcard."""
    host = fallback if bound in WILDCARD else bound
    return f"[{host}]" if ":" in host else host


class Site:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.metrics: HttpServer | None = None
        self.dashboard: Dashboard | None = None
        self.dashboard_server: HttpServer | None = None
        self._unsubscribe: Any = None

    @classmethod
    async def start(cls, peer: Peer, group: asyncio.TaskGroup) -> Site:
        site = cls(peer)
        try:
            await site._start(group)
        except BaseException:
            await site.aclose()
            raise
        peer.frames.route("site", site._site_rpc)
        for line in site.banner():
            log.info("%s", line)
        return site

    async def _start(self, group: asyncio.TaskGroup) -> None:
        config = self.peer.config
        if config.metrics_port is not None:
            from agiledart.site.metrics import metrics_handler  # prometheus_client: on demand

            self.metrics = HttpServer(metrics_handler(self.peer), name="metrics endpoint")
            await self.metrics.start(group, config.listen[0], config.metrics_port)
        if config.dashboard_port is not None:
            host = config.dashboard_host
            if self.peer.key.insecure and not is_loopback(host):
                msg = (
                    f"an --insecure peer serves its dashboard on a loopback address only "
                    f"(its token is public), not on {host}: use a cluster key"
                )
                raise SiteConfigError(msg)
            self.dashboard = Dashboard(PeerControl(self.peer), dashboard_token(self.peer.key))
            self._unsubscribe = self.peer.overlay.subscribe(self.dashboard.on_membership)
            self.dashboard_server = HttpServer(self.dashboard.handle, name="dashboard")
            await self.dashboard_server.start(group, host, config.dashboard_port)
            self.dashboard.note(f"dashboard of {self.peer.name} started")

    def metrics_url(self) -> str | None:
        if self.metrics is None or self.metrics.address is None:
            return None
        host, port = self.metrics.address
        return f"http://{url_host(host, self.peer.address[0])}:{port}/metrics"

    def dashboard_url(self) -> str | None:
        if self.dashboard_server is None or self.dashboard_server.address is None:
            return None
        host, port = self.dashboard_server.address
        token = dashboard_token(self.peer.key)
        return f"http://{url_host(host, self.peer.address[0])}:{port}/?token={token}"

    def banner(self) -> list[str]:
        """What the peer prints at start-up (the dashboard URL holds the token)."""
        lines = []
        if (url := self.metrics_url()) is not None:
            lines.append(f"metrics of {self.peer.name}: {url}")
        if (url := self.dashboard_url()) is not None:
            lines.append(f"dashboard of {self.peer.name}: {url}")
            if self.peer.key.insecure:
                lines.append("(an --insecure peer's dashboard token is public)")
        return lines

    async def aclose(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for server in (self.dashboard_server, self.metrics):
            if server is not None:
                await server.aclose()

    async def _site_rpc(self, request: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        def where(server: HttpServer | None) -> dict[str, Any] | None:
            if server is None or server.address is None:
                return None
            return {"host": server.address[0], "port": server.address[1]}

        return {
            "peer": self.peer.name,
            "metrics": where(self.metrics),
            "dashboard": where(self.dashboard_server),
        }
