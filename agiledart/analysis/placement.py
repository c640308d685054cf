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

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from agiledart.analysis.frames import Frames, collect, descending
from agiledart.analysis.model import Section, Table

__all__ = ["placement_section", "scheduler_section"]


def _latest(frames: Frames) -> DataFrame:
    """Each app's latest ``placement`` record."""
    newest = Window.partitionBy("app").orderBy(F.desc("ts"))
    return (
        frames.records("placement")
        .withColumn("n", F.row_number().over(newest))
        .where(F.col("n") == 1)
    )


def _per_peer(frames: Frames, latest: DataFrame) -> DataFrame:
    instances = latest.select("app", F.explode("placement").alias("operator", "peers")).select(
        "app", "operator", F.explode("peers").alias("peer")
    )
    writers = frames.spark.createDataFrame([(p,) for p in frames.writer_peers], "peer string")
    peers = writers.unionByName(instances.select("peer")).distinct()
    return peers.join(
        instances.groupBy("peer").agg(F.count(F.lit(1)).alias("operators")), "peer", "left"
    ).select("peer", F.coalesce("operators", F.lit(0)).alias("operators"))


def placement_section(frames: Frames) -> Section:
    section = Section("placement", "Operator placement", ("placement",))
    if not frames.has("placement"):
        return section
    latest = _latest(frames).persist()  # one row per app, read by every table below
    try:
        table = collect(
            _per_peer(frames, latest),
            "operators_per_peer",
            "Operator instances per peer",
            (descending("operators"), "peer"),
        )
        placements = collect(
            latest.select(
                "app",
                "name",
                "strategy",
                F.explode("placement").alias("operator", "peers"),
            ).select(
                "app", "name", "strategy", "operator", F.array_join("peers", " ").alias("peers")
            ),
            "placements",
            "Latest placement of each app",
            ("app", "operator"),
        )
        paths = collect(
            latest.select("app", F.posexplode("paths").alias("i", "path")).select(
                "app", "i", F.array_join("path", " > ").alias("path")
            ),
            "placement_paths",
            "Dataflow paths of each app (source to sink)",
            ("app", "i"),
        )
        apps = latest.count()
    finally:
        latest.unpersist()
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
        f"{len(counts)} peers, {sum(counts)} operator instances (latest placement of {apps} apps)."
    )
    return section


def scheduler_section(frames: Frames) -> Section:
    section = Section("schedulers", "Zone schedulers", ("scheduler",))
    if not frames.has("scheduler"):
        return section
    events = frames.records("scheduler")
    zones = events.groupBy("zone").agg(
        F.countDistinct("scheduler").alias("schedulers"),
        F.array_join(F.array_sort(F.collect_set("scheduler")), " ").alias("names"),
        F.count(F.lit(1)).alias("events"),
        F.max_by("scheduler", "ts").alias("latest"),
        F.max_by("apps", "ts").alias("latest_apps"),
    )
    per_zone = collect(zones, "schedulers", "Schedulers per zone", ("zone",))
    log = collect(
        events.select(frames.t_s(), "zone", "scheduler", "event", "apps"),
        "scheduler_events",
        "Scheduler events",
        ("t_s", "zone"),
    )
    section.tables += [per_zone, log]
    return section
