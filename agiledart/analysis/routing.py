"""Shuffle path planning: regret, path choices, delays (``delivery``) and hop attempts
(``shuffle``); the paper's Figs. 14-17.

Regret (paper §V) per (policy, graph, origin, dest), packets ordered by ``k``::

    R(K) = Σ_{k <= K} delay_ms(k) - K · optimal_ms

computed as the running sum of ``delay_ms - optimal_ms`` (a Spark window: each series
sorted by ``k``, spilling to disk when it is large), over the deliveries that carry
``optimal_ms``: the one table read from the ``delivery`` records. The curve keeps at
most about :data:`CURVE_POINTS` points per series (every n-th packet, the first and the
last). The summary (with the exact final value), the path counts and the delay CDF (101
levels per (policy, graph), within a relative
:data:`~agiledart.analysis.sketch.ALPHA`, with the packets it counts) come from the
reader's partial aggregates (:mod:`~agiledart.analysis.partials`), and the shuffle
tables from its ``attempts``. A null ``graph`` is shown as ``""``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from agiledart.analysis.frames import Frames, collect, descending, of_arrow
from agiledart.analysis.model import Section
from agiledart.analysis.partials import SERIES
from agiledart.analysis.sketch import ALPHA, MIN_SAMPLES, quantiles

__all__ = ["CDF_POINTS", "CURVE_POINTS", "OUTCOMES", "routing_section", "shuffle_section"]

CURVE_POINTS = 1000
CDF_POINTS = 101
TOP_PATHS = 20
OUTCOMES = ("ok", "lost", "late", "refused")


def _deliveries(frames: Frames) -> DataFrame:
    return frames.records("delivery").withColumn("graph", F.coalesce("graph", F.lit("")))


def _curve(deliveries: DataFrame) -> DataFrame:
    scored = deliveries.where(F.col("optimal_ms").isNotNull())
    order = Window.partitionBy(*SERIES).orderBy("k", "ts")
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # packets per series from a small aggregation, so that the curve needs one window
    # (one sort of the deliveries), not a second over whole series
    sizes = scored.groupBy(*SERIES).agg(F.count(F.lit(1)).alias("n"))
    return (
        scored.join(F.broadcast(sizes), list(SERIES))
        .select(
            *SERIES,
            "k",
            "delay_ms",
            "optimal_ms",
            "n",
            F.row_number().over(order).alias("packets"),
            F.sum(F.col("delay_ms") - F.col("optimal_ms")).over(running).alias("regret_ms"),
        )
        .withColumn("step", F.greatest(F.lit(1), F.ceil(F.col("n") / CURVE_POINTS)))
        .where(
            (F.col("packets") % F.col("step") == 0)
            | (F.col("packets") == 1)
            | (F.col("packets") == F.col("n"))
        )
        .select(*SERIES, "k", "packets", "delay_ms", "optimal_ms", "regret_ms")
    )


def _summary(frames: Frames) -> DataFrame:
    """Per series, from the reader's partial sums (``series``)."""
    return frames.merged("series").select(
        *SERIES,
        "packets",
        (F.col("delay_sum") / F.col("packets")).alias("delay_ms_mean"),
        F.try_divide("optimal_sum", "optimal_n").alias("optimal_ms"),
        F.col("regret_sum").alias("regret_ms"),
        (F.col("packets") - F.col("optimal_n")).alias("without_optimal"),
        (F.col("attempts_sum") / F.col("packets")).alias("attempts_mean"),
    )


def _paths(frames: Frames) -> DataFrame:
    """The most used paths per series, from the reader's partial counts (``paths``:
    per path's text)."""
    counted = frames.merged("paths")
    series = Window.partitionBy(*SERIES)
    rank = Window.partitionBy(*SERIES).orderBy(F.desc("packets"), "path")
    return counted.select(
        *SERIES,
        "path",
        "packets",
        (F.col("packets") / F.sum("packets").over(series)).alias("share"),
        F.row_number().over(rank).alias("rank"),
    ).where(F.col("rank") <= TOP_PATHS)


def _cdf(frames: Frames) -> DataFrame:
    last = CDF_POINTS - 1
    levels = [i / last for i in range(CDF_POINTS)]
    names = [f"q{i}" for i in range(CDF_POINTS)]
    return (
        quantiles(frames.partials("delay"), ["policy", "graph"], levels, names)
        .select(
            "policy",
            "graph",
            F.col("count").alias("packets"),
            F.posexplode(F.array(*names)).alias("i", "delay_ms"),
        )
        .select("policy", "graph", (F.col("i") / last).alias("fraction"), "delay_ms", "packets")
    )


def routing_section(frames: Frames) -> Section:
    section = Section("routing", "Shuffle paths: regret, choices, delays", ("delivery",))
    if not frames.has("delivery"):
        return section
    regret = collect(
        _curve(_deliveries(frames)),
        "regret",
        "Regret R(K) per policy and graph",
        (*SERIES, "packets"),
    )
    cdf = collect(
        _cdf(frames),
        "delay_cdf",
        "Packet delay CDF per policy and graph",
        ("policy", "graph", "fraction"),
    )
    paths = collect(
        _paths(frames), "paths", f"Most used paths (top {TOP_PATHS})", (*SERIES, "rank")
    )
    section.tables += [
        collect(
            _summary(frames), "regret_summary", "Deliveries and final regret per series", SERIES
        ),
        regret,
        paths,
        cdf,
    ]
    section.notes += [
        "R(K) = Σ delay_ms(k) - K·optimal_ms over packets ordered by k, per (policy, "
        f"graph, origin, dest); curves keep about {CURVE_POINTS} points per series.",
        f"Delay CDF levels within {ALPHA:.0%} of the exact percentiles (mergeable "
        f"histograms), left empty below {MIN_SAMPLES} packets.",
    ]
    return section


def _attempts(frames: Frames) -> pa.Table:
    """Hop attempts counted per policy, graph, hop, link and outcome, with their delay
    sums: the reader's partials (``attempts``) merged by Spark, a few hundred rows from
    which every shuffle table adds up (in the driver: one Spark query, not three)."""
    merged = frames.merged("attempts").toArrow()
    outcomes = {
        o: pc.if_else(pc.equal(merged["outcome"], o), merged["attempts"], 0) for o in OUTCOMES
    }
    return pa.table({**{c: merged[c] for c in merged.column_names}, **outcomes})


def _added(attempts: pa.Table, keys: list[str], outcomes: bool) -> pa.Table:
    """``attempts`` added up per ``keys``: attempts (per outcome too), mean delay (and
    the success rate)."""
    counted = ["attempts", *(OUTCOMES if outcomes else ())]
    out = attempts.group_by(keys, use_threads=False).aggregate(
        [(c, "sum") for c in (*counted, "delay_sum", "delays")]
    )
    out = out.rename_columns({f"{c}_sum": c for c in (*counted, "delay_sum", "delays")})
    delays = out["delays"].cast(pa.float64())
    mean = pc.if_else(pc.equal(delays, 0.0), None, pc.divide(out["delay_sum"], delays))
    columns = {c: out[c] for c in (*keys, *counted)}
    if outcomes:
        ok = out["ok"].cast(pa.float64())
        columns["success_rate"] = pc.divide(ok, out["attempts"].cast(pa.float64()))
    return pa.table({**columns, "delay_ms_mean": mean})


def shuffle_section(frames: Frames) -> Section:
    section = Section("shuffle", "Shuffle hop attempts", ("shuffle",))
    if not frames.has("shuffle"):
        return section
    attempts = _attempts(frames)
    section.tables += [
        of_arrow(
            _added(attempts, ["policy", "graph", "outcome"], outcomes=False),
            "shuffle_outcomes",
            "Attempts per outcome",
            ("policy", "graph", "outcome"),
        ),
        of_arrow(
            _added(attempts, ["policy", "graph", "hop"], outcomes=True),
            "shuffle_hops",
            "Attempts per hop index",
            ("policy", "graph", "hop"),
        ),
        of_arrow(
            _added(attempts, ["policy", "graph", "node", "next"], outcomes=True),
            "shuffle_links",
            "Attempts per link (node -> next)",
            ("policy", "graph", descending("attempts"), "node", "next"),
        ),
    ]
    section.notes.append("One shuffle record per transmission attempt over one link.")
    return section
