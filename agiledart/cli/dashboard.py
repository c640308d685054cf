"""``agiledart dashboard-url``: where a peer serves its dashboard (and metrics), with the
token, which the command computes from its own copy of the cluster key: the token never
crosses the network."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["add_parser"]

Call = Callable[[argparse.Namespace, str, dict[str, Any]], Awaitable[Any]]


def add_parser(
    sub: Any,
    add_via: Callable[[argparse.ArgumentParser], None],
    call: Call,
    run: Callable[[Any], Any],
) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "dashboard-url",
        help="print a peer's dashboard URL, with its token",
        description="Ask the --via peer where it serves its dashboard and metrics, and print "
        "the dashboard's URL with the token (derived from the cluster key this command "
        "reads, as the peer does). The peer must run with --dashboard-port.",
    )
    add_via(p)
    p.add_argument("--json", action="store_true", help="print JSON (dashboard and metrics URLs)")
    p.set_defaults(func=lambda a: _dashboard_url(a, call, run))


def _dashboard_url(args: argparse.Namespace, call: Call, run: Callable[[Any], Any]) -> int:
    from agiledart.overlay.address import parse_address
    from agiledart.overlay.auth import load_cluster_key
    from agiledart.overlay.errors import UnknownRequest
    from agiledart.site.dashboard import dashboard_token
    from agiledart.site.errors import NoSiteServices
    from agiledart.site.service import url_host

    try:
        where = run(call(args, "site", {}))
    except UnknownRequest:  # the peer runs no site services
        where = {"dashboard": None, "metrics": None}
    via_host = parse_address(args.via)[0] if args.via else "127.0.0.1"
    dashboard, metrics = where.get("dashboard"), where.get("metrics")
    token = dashboard_token(load_cluster_key(args.cluster_key_file, insecure=args.insecure))
    urls = {
        "dashboard": None
        if dashboard is None
        else f"http://{url_host(dashboard['host'], via_host)}:{dashboard['port']}/?token={token}",
        "metrics": None
        if metrics is None
        else f"http://{url_host(metrics['host'], via_host)}:{metrics['port']}/metrics",
    }
    if args.json:
        print(json.dumps(urls))
        return 0
    if urls["dashboard"] is None:
        msg = f"{args.via} serves no dashboard: start it with --dashboard-port P"
        raise NoSiteServices(msg)
    print(urls["dashboard"])
    return 0
