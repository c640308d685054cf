"""A peer's HTTP services: the Prometheus endpoint and the dashboard, started with it.

``Site.start(peer, group)`` serves, in the peer's task group:

* metrics on ``--metrics-host:--metrics-port``, ``GET /metrics``. The host defaults to
  a loopback address: the ``--listen`` host when that is one (a local cluster's peers
  on 127.0.0.2, 127.0.0.3...), else 127.0.0.1. Serving beyond loopback
  (``--metrics-host 0.0.0.0``, say) is an explicit choice and needs a token
  (``--metrics-token-file F`` or ``$AGILEDART_METRICS_TOKEN``, 16 characters or more),
  which scrapers send as ``Authorization: Bearer``; a token may guard a loopback
  endpoint too;
* the dashboard on ``--dashboard-host:--dashboard-port`` (default host 127.0.0.1),
  behind the dashboard token.

The peer logs where the two are served, never the dashboard token (it is a credential:
logs travel further than consoles): the URL with the token is printed once to the
console with ``agiledart peer --show-dashboard-url``, logged at DEBUG only, and given by
``agiledart dashboard-url``. That command asks the ``site`` control RPC where the two
are served and computes the token from its own copy of the cluster key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agiledart.overlay.tcp import ConnectionInfo
from agiledart.site.dashboard import Dashboard, PeerControl, dashboard_token
from agiledart.site.errors import SiteConfigError
from agiledart.site.http import HttpServer

if TYPE_CHECKING:
    from agiledart.peer import Peer

log = logging.getLogger(__name__)

__all__ = [
    "METRICS_TOKEN_ENV",
    "Site",
    "is_loopback",
    "metrics_host",
    "read_metrics_token",
    "url_host",
]

WILDCARD = ("", "0.0.0.0", "::")
METRICS_TOKEN_ENV = "AGILEDART_METRICS_TOKEN"
MIN_TOKEN = 16  #: characters of a metrics token, at least


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


def metrics_host(listen_host: str, asked: str | None) -> str:
    """Where the metrics endpoint listens: ``asked``, else a loopback address (the
    listen host when it is one, else 127.0.0.1)."""
    if asked is not None:
        return asked
    return listen_host if is_loopback(listen_host) and listen_host != "localhost" else "127.0.0.1"


def read_metrics_token(path: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The metrics token: the first line of ``path``, else ``$AGILEDART_METRICS_TOKEN``,
    else None. One too short, or with blanks in it, is refused."""
    env = os.environ if environ is None else environ
    if path is not None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"cannot read the metrics token file {os.fspath(path)!r}: {exc}"
            raise SiteConfigError(msg) from None
        token, where = (lines[0].strip() if lines else ""), os.fspath(path)
    elif env.get(METRICS_TOKEN_ENV):
        token, where = env[METRICS_TOKEN_ENV].strip(), f"${METRICS_TOKEN_ENV}"
    else:
        return None
    if len(token) < MIN_TOKEN or not token.isascii() or not token.isprintable() or " " in token:
        msg = (
            f"the metrics token in {where} must be {MIN_TOKEN} or more printable ASCII "
            "characters without blanks (make one with `openssl rand -hex 32`)"
        )
        raise SiteConfigError(msg)
    return token


class Site:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.metrics: HttpServer | None = None
        self.dashboard: Dashboard | None = None
        self.dashboard_server: HttpServer | None = None
        self.metrics_token: str | None = None
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
        if (url := site.dashboard_url()) is not None:
            log.debug("dashboard of %s with its token: %s", peer.name, url)
        return site

    async def _start(self, group: asyncio.TaskGroup) -> None:
        config = self.peer.config
        if config.metrics_port is not None:
            from agiledart.site.metrics import metrics_handler  # prometheus_client: on demand

            host = metrics_host(config.listen[0], config.metrics_host)
            self.metrics_token = read_metrics_token(config.metrics_token_file)
            if self.metrics_token is None and not is_loopback(host):
                msg = (
                    f"serving metrics beyond loopback (on {host}) needs a token: give "
                    f"--metrics-token-file F or ${METRICS_TOKEN_ENV} (scrapers send it as "
                    "Authorization: Bearer), or leave --metrics-host out to serve on loopback"
                )
                raise SiteConfigError(msg)
            handler = metrics_handler(self.peer, token=self.metrics_token)
            self.metrics = HttpServer(handler, name="metrics endpoint")
            await self.metrics.start(group, host, config.metrics_port)
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
            _, port = await self.dashboard_server.start(group, host, config.dashboard_port)
            self.dashboard.cookie = f"agiledart_dashboard_{port}"
            self.dashboard.note(f"dashboard of {self.peer.name} started")

    def metrics_url(self) -> str | None:
        if self.metrics is None or self.metrics.address is None:
            return None
        host, port = self.metrics.address
        return f"http://{url_host(host, self.peer.address[0])}:{port}/metrics"

    def dashboard_url(self, *, token: bool = True) -> str | None:
        """The dashboard's URL, with its token (a credential) unless ``token`` is false."""
        if self.dashboard_server is None or self.dashboard_server.address is None:
            return None
        host, port = self.dashboard_server.address
        url = f"http://{url_host(host, self.peer.address[0])}:{port}/"
        return f"{url}?token={dashboard_token(self.peer.key)}" if token else url

    def banner(self) -> list[str]:
        """What the peer logs at start-up: where it serves, never a token."""
        lines = []
        if (url := self.metrics_url()) is not None:
            guard = "Bearer token required" if self.metrics_token else "no token"
            lines.append(f"metrics of {self.peer.name}: {url} ({guard})")
        if (url := self.dashboard_url(token=False)) is not None:
            host, port = self.peer.address
            lines.append(
                f"dashboard of {self.peer.name}: {url} (its URL with the token: "
                f"`agiledart dashboard-url --via {host}:{port}`)"
            )
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
