"""A local site for the tests of the metrics endpoint and the dashboard (tests/site)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

from support.processes import cli_json

from agiledart.emulation import LocalCluster
from agiledart.site import dashboard_token

PEERS = 6
DASHBOARD = 5  #: edge-2, 127.0.0.7
#: generators slow enough for two cores, long enough never to finish during the tests
APPS = {
    "urban-sensing": ["params.rate=100", "params.count=100000000", "params.window_ms=1000"],
    "word-count": ["params.rate=50", "params.count=100000000"],
}


class SiteCluster(LocalCluster):
    """A local cluster with per-peer extra arguments (the dashboard on one peer)."""

    per_peer: dict[int, list[str]]

    def start(self, i: int) -> subprocess.Popen[bytes]:
        shared = self.extra_args
        self.extra_args = [*shared, *self.per_peer.get(i, [])]
        try:
            return super().start(i)
        finally:
            self.extra_args = shared


@dataclass
class Site:
    cluster: SiteCluster
    metrics_port: int
    dashboard_port: int
    apps: dict[str, str]  #: bundled app name -> app id

    def via(self, i: int = DASHBOARD) -> list[str]:
        return ["--via", "{}:{}".format(*self.cluster.address(i))]

    def index(self, name: str) -> int:
        return next(i for i in range(self.cluster.peers) if self.cluster.name(i) == name)

    def metrics_url(self, i: int) -> str:
        return f"http://{self.cluster.address(i)[0]}:{self.metrics_port}/metrics"

    def dashboard_url(self, *, token: bool = True, path: str = "/") -> str:
        url = f"http://127.0.0.1:{self.dashboard_port}{path}"
        return f"{url}?token={dashboard_token(self.cluster.key)}" if token else url

    def status(self, app_id: str) -> dict[str, Any]:
        status: dict[str, Any] = cli_json(self.cluster, "status", app_id, *self.via())
        return status
