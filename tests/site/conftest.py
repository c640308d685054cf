"""One 6-peer site for every test here: metrics on every peer, the dashboard on
``edge-2`` (neither a source nor a sink of the apps), two long-running apps."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.processes import cli, free_port, poll
from support.site import APPS, DASHBOARD, PEERS, Site, SiteCluster


@pytest.fixture(scope="package")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    metrics_port, dashboard_port = free_port(), free_port()
    workdir: Path = tmp_path_factory.mktemp("site")
    cluster = SiteCluster(
        PEERS,
        port=free_port(),
        workdir=workdir,
        extra_args=["--metrics-port", str(metrics_port), "--workers", "1"],
    )
    cluster.per_peer = {DASHBOARD: ["--dashboard-port", str(dashboard_port)]}
    with cluster:
        asyncio.run(cluster.wait_formed())
        s = Site(cluster, metrics_port, dashboard_port, {})
        for name, overrides in APPS.items():
            args = [a for o in overrides for a in ("--set", o)]
            s.apps[name] = cli(cluster, "submit", name, *args, *s.via()).stdout.strip()
        for app_id in s.apps.values():
            poll(lambda a=app_id: s.status(a)["state"] == "running", what=f"{app_id} running")
        procs = list(cluster.procs)
        yield s
    for proc in procs:
        assert proc.poll() is not None
