"""Where operators run (``placement``, the paper's Fig. 10) and zone schedulers
(``scheduler``).

Each app's latest ``placement`` record (largest ``ts``) is its placement. An operator
instance is one (app, operator, peer) entry of a placement's map; a peer's count is
the number of instances on it, over all apps. The peers counted are those named in a
placement and every peer that wrote a trace (so a peer that hosts nothing counts as
0). The normal-probability plot sets the sorted counts against the standard normal
quantiles at Blom's plotting positions (i - 3/8) / (n + 1/4).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from agiledart.analysis.columns import Source, floats, groups, join_items, ordered, sorted_rows
from agiledart.analysis.model import Section, Table

__all__ = ["placement_section", "scheduler_section"]


def _latest(source: Source) -> list[dict[str, Any]]:
    """Each app's latest ``placement`` record."""
    latest: dict[Any, dict[str, Any]] = {}
    for record in source.table("placement").to_pylist():
        seen = latest.get(record["app"])
        if seen is None or record["ts"] > seen["ts"]:
            latest[record["app"]] = record
    return list(latest.values())


def _per_peer(source: Source, latest: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    hosted: Counter[Any] = Counter()
    for record in latest:
        for _, peers in record["placement"] or []:
            hosted.update(p for p in peers or [] if p is not None)
    peers = set(source.writer_peers) | set(hosted)
    return ordered([(p, hosted.get(p, 0)) for p in peers], 1, 0, descending=(1,))


def placement_section(source: Source) -> Section:
    section = Section("placement", "Operator placement", ("placement",))
    if not source.has("placement"):
        return section
    latest = _latest(source)
    per_peer = _per_peer(source, latest)
    table = Table(
        "operators_per_peer", "Operator instances per peer", ["peer", "operators"], per_peer
    )
    placements = [
        (r["app"], r["name"], r["strategy"], operator, join_items(peers, " "))
        for r in latest
        for operator, peers in r["placement"] or []
    ]
    paths = [
        (r["app"], i, join_items(path, " > "))
        for r in latest
        for i, path in enumerate(r["paths"] or [])
    ]
    counts = table.column("operators")
    hist = sorted(Counter(counts).items())
    histogram = Table(
        "operators_per_peer_hist",
        "Peers by number of operator instances",
        ["operators", "peers"],
        [tuple(r) for r in hist],
    )
    section.tables += [
        table,
        histogram,
        Table(
            "placements",
            "Latest placement of each app",
            ["app", "name", "strategy", "operator", "peers"],
            ordered(placements, 0, 3),
        ),
        Table(
            "placement_paths",
            "Dataflow paths of each app (source to sink)",
            ["app", "i", "path"],
            ordered(paths, 0, 1),
        ),
    ]
    section.notes.append(
        f"{len(counts)} peers, {sum(counts)} operator instances "
        f"(latest placement of {len(latest)} apps)."
    )
    return section


def scheduler_section(source: Source) -> Section:
    section = Section("schedulers", "Zone schedulers", ("scheduler",))
    if not source.has("scheduler"):
        return section
    events = source.table("scheduler")
    by_zone = groups(events["zone"])
    ts = floats(events["ts"])
    names: dict[Any, set[Any]] = {}
    pairs = zip(events["zone"].to_pylist(), events["scheduler"].to_pylist(), strict=True)
    for zone, scheduler in pairs:
        if scheduler is not None:
            names.setdefault(zone, set()).add(scheduler)
    zones = [
        (zone, len(names.get(zone, ())), " ".join(sorted(names.get(zone, ()))), n, last, apps)
        for (zone,), n, last, apps in zip(
            by_zone.keys,
            by_zone.count().tolist(),
            by_zone.last(events["scheduler"], ts),
            by_zone.last(events["apps"], ts),
            strict=True,
        )
    ]
    log = events.select(["zone", "scheduler", "event", "apps"])
    log = log.add_column(0, "t_s", [source.seconds(events["ts"])])
    section.tables += [
        Table(
            "schedulers",
            "Schedulers per zone",
            ["zone", "schedulers", "names", "events", "latest", "latest_apps"],
            ordered(zones, 0),
        ),
        Table(
            "scheduler_events",
            "Scheduler events",
            ["t_s", "zone", "scheduler", "event", "apps"],
            sorted_rows(log, "t_s", "zone"),
        ),
    ]
    return section
