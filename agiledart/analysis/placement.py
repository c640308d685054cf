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

import pyarrow as pa
from pyspark.sql import Window
from pyspark.sql import functions as F

from agiledart.analysis.frames import Frames, descending, of_arrow
from agiledart.analysis.model import Section, Table

__all__ = ["placement_section", "scheduler_section"]


def _latest(frames: Frames) -> list[dict[str, Any]]:
    """Each app's latest ``placement`` record (one query: a row per app, from which the
    driver makes every table of the section)."""
    newest = Window.partitionBy("app").orderBy(F.desc("ts"))
    rows = (
        frames.records("placement")
        .withColumn("n", F.row_number().over(newest))
        .where(F.col("n") == 1)
        .select("app", "name", "strategy", "placement", "paths")
        .toArrow()
        .to_pylist()
    )
    return [{**row, "placement": row["placement"] or []} for row in rows]


def _joined(items: list[str | None] | None, separator: str) -> str | None:
    """Spark's ``array_join``: null items skipped, a null array null."""
    return None if items is None else separator.join(x for x in items if x is not None)


def _per_peer(frames: Frames, latest: list[dict[str, Any]]) -> pa.Table:
    hosted = Counter(
        peer for row in latest for _, peers in row["placement"] for peer in peers or []
    )
    peers = set(frames.writer_peers) | set(hosted)
    return pa.table(
        {
            "peer": pa.array(list(peers), pa.string()),
            "operators": pa.array([hosted.get(p, 0) for p in peers], pa.int64()),
        }
    )


def placement_section(frames: Frames) -> Section:
    section = Section("placement", "Operator placement", ("placement",))
    if not frames.has("placement"):
        return section
    latest = _latest(frames)
    table = of_arrow(
        _per_peer(frames, latest),
        "operators_per_peer",
        "Operator instances per peer",
        (descending("operators"), "peer"),
    )
    placements = of_arrow(
        pa.Table.from_pylist(
            [
                {
                    "app": row["app"],
                    "name": row["name"],
                    "strategy": row["strategy"],
                    "operator": operator,
                    "peers": _joined(peers, " "),
                }
                for row in latest
                for operator, peers in row["placement"]
            ],
            schema=_PLACEMENTS,
        ),
        "placements",
        "Latest placement of each app",
        ("app", "operator"),
    )
    paths = of_arrow(
        pa.Table.from_pylist(
            [
                {"app": row["app"], "i": i, "path": _joined(path, " > ")}
                for row in latest
                for i, path in enumerate(row["paths"] or [])
            ],
            schema=_PATHS,
        ),
        "placement_paths",
        "Dataflow paths of each app (source to sink)",
        ("app", "i"),
    )
    counts = table.column("operators")
    hist = sorted({c: counts.count(c) for c in counts}.items())
    histogram = Table(
        "operators_per_peer_hist",
        "Peers by number of operator instances",
        ["operators", "peers"],
        [tuple(r) for r in hist],
    )
    section.tables += [table, histogram, placements, paths]
    section.notes.append(
        f"{len(counts)} peers, {sum(counts)} operator instances (latest placement of "
        f"{len(latest)} apps)."
    )
    return section


_S = pa.string()
_PLACEMENTS = pa.schema(
    [("app", _S), ("name", _S), ("strategy", _S), ("operator", _S), ("peers", _S)]
)
_PATHS = pa.schema([("app", _S), ("i", pa.int32()), ("path", _S)])


def scheduler_section(frames: Frames) -> Section:
    section = Section("schedulers", "Zone schedulers", ("scheduler",))
    if not frames.has("scheduler"):
        return section
    # one query, the log (every record, a final table); the summary adds up from it
    log = (
        frames.records("scheduler")
        .select(frames.t_s(), "zone", "scheduler", "event", "apps")
        .toArrow()
    )
    ordered = log.sort_by([("zone", "ascending"), ("t_s", "ascending")])
    zones = ordered.group_by(["zone"], use_threads=False).aggregate(
        [
            ("scheduler", "count_distinct"),
            ("scheduler", "distinct"),
            ([], "count_all"),
            ("scheduler", "last"),
            ("apps", "last"),
        ]
    )
    names = [
        " ".join(sorted(n for n in found if n is not None))
        for found in zones["scheduler_distinct"].to_pylist()
    ]
    per_zone = pa.table(
        {
            "zone": zones["zone"],
            "schedulers": zones["scheduler_count_distinct"],
            "names": pa.array(names, pa.string()),
            "events": zones["count_all"],
            "latest": zones["scheduler_last"],
            "latest_apps": zones["apps_last"],
        }
    )
    section.tables += [
        of_arrow(per_zone, "schedulers", "Schedulers per zone", ("zone",)),
        of_arrow(log, "scheduler_events", "Scheduler events", ("t_s", "zone")),
    ]
    return section
