"""Shuffle path planning: regret, path choices, delays (``delivery``) and hop attempts
(``shuffle``); the paper's Figs. 14-17.

Regret (DESIGN.md §4) per (policy, graph, origin, dest), packets ordered by ``k``::

    R(K) = Σ_{k <= K} delay_ms(k) - K · optimal_ms

computed as the running sum of ``delay_ms - optimal_ms`` (a Spark window), over the
deliveries that carry ``optimal_ms``. The curve keeps at most about
:data:`CURVE_POINTS` points per series (every n-th packet, the first and the last), the
summary has the exact final value. A null ``graph`` is shown as ``""``.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from agiledart.analysis import plots
from agiledart.analysis.model import Section, collect
from agiledart.analysis.reader import Traces

__all__ = ["CDF_POINTS", "CURVE_POINTS", "OUTCOMES", "routing_section", "shuffle_section"]

CURVE_POINTS = 1000
CDF_POINTS = 101
TOP_PATHS = 20
OUTCOMES = ("ok", "lost", "late", "refused")
SERIES = ["policy", "graph", "origin", "dest"]


def _deliveries(traces: Traces) -> DataFrame:
    return traces.records("delivery").withColumn("graph", F.coalesce("graph", F.lit("")))


def _regret(deliveries: DataFrame) -> tuple[DataFrame, DataFrame]:
    scored = deliveries.where(F.col("optimal_ms").isNotNull())
    order = Window.partitionBy(*SERIES).orderBy("k", "ts")
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    everything = Window.partitionBy(*SERIES)
    curve = (
        scored.select(
            *SERIES,
            "k",
            "delay_ms",
            "optimal_ms",
            F.row_number().over(order).alias("packets"),
            F.count(F.lit(1)).over(everything).alias("n"),
            F.sum(F.col("delay_ms") - F.col("optimal_ms")).over(running).alias("regret_ms"),
        )
        .withColumn("step", F.greatest(F.lit(1), F.ceil(F.col("n") / CURVE_POINTS)))
        .where(
            (F.col("packets") % F.col("step") == 0)
            | (F.col("packets") == 1)
            | (F.col("packets") == F.col("n"))
        )
        .select(*SERIES, "k", "packets", "delay_ms", "optimal_ms", "regret_ms")
        .orderBy(*SERIES, "packets")
    )
    summary = (
        deliveries.groupBy(*SERIES)
        .agg(
            F.count(F.lit(1)).alias("packets"),
            F.mean("delay_ms").alias("delay_ms_mean"),
            F.mean("optimal_ms").alias("optimal_ms"),
            F.sum(F.col("delay_ms") - F.col("optimal_ms")).alias("regret_ms"),
            F.count_if(F.col("optimal_ms").isNull()).alias("without_optimal"),
            F.mean("attempts").alias("attempts_mean"),
        )
        .orderBy(*SERIES)
    )
    return curve, summary


def _paths(deliveries: DataFrame) -> DataFrame:
    counted = deliveries.groupBy(*SERIES, F.array_join("path", " > ").alias("path")).agg(
        F.count(F.lit(1)).alias("packets")
    )
    series = Window.partitionBy(*SERIES)
    rank = Window.partitionBy(*SERIES).orderBy(F.desc("packets"), "path")
    return (
        counted.select(
            *SERIES,
            "path",
            "packets",
            (F.col("packets") / F.sum("packets").over(series)).alias("share"),
            F.row_number().over(rank).alias("rank"),
        )
        .where(F.col("rank") <= TOP_PATHS)
        .orderBy(*SERIES, "rank")
    )


def _cdf(deliveries: DataFrame) -> DataFrame:
    levels = [i / (CDF_POINTS - 1) for i in range(CDF_POINTS)]
    q = F.percentile(F.col("delay_ms"), F.array(*(F.lit(x) for x in levels)))
    return (
        deliveries.groupBy("policy", "graph")
        .agg(q.alias("q"))
        .select("policy", "graph", F.posexplode("q").alias("i", "delay_ms"))
        .select("policy", "graph", (F.col("i") / (CDF_POINTS - 1)).alias("fraction"), "delay_ms")
        .orderBy("policy", "graph", "fraction")
    )


def routing_section(traces: Traces) -> Section:
    section = Section("routing", "Shuffle paths: regret, choices, delays", ("delivery",))
    if not traces.has("delivery"):
        return section
    deliveries = _deliveries(traces)
    curve, summary = _regret(deliveries)
    regret = collect(curve, "regret", "Regret R(K) per policy and graph")
    cdf = collect(_cdf(deliveries), "delay_cdf", "Packet delay CDF per policy and graph")
    paths = collect(_paths(deliveries), "paths", f"Most used paths (top {TOP_PATHS})")
    section.tables += [
        collect(summary, "regret_summary", "Deliveries and final regret per series"),
        regret,
        paths,
        cdf,
    ]
    section.notes.append(
        "R(K) = Σ delay_ms(k) - K·optimal_ms over packets ordered by k, per (policy, "
        f"graph, origin, dest); curves keep about {CURVE_POINTS} points per series."
    )
    if regret.rows:
        section.plots.append(plots.regret(regret))
    section.plots += [plots.path_shares(paths), plots.delay_cdf(cdf)]
    return section


def shuffle_section(traces: Traces) -> Section:
    section = Section("shuffle", "Shuffle hop attempts", ("shuffle",))
    if not traces.has("shuffle"):
        return section
    attempts = traces.records("shuffle").withColumn("graph", F.coalesce("graph", F.lit("")))
    counts = [F.count(F.lit(1)).alias("attempts")] + [
        F.count_if(F.col("outcome") == o).alias(o) for o in OUTCOMES
    ]
    rate = (F.col("ok") / F.col("attempts")).alias("success_rate")
    outcomes = (
        attempts.groupBy("policy", "graph", "outcome")
        .agg(F.count(F.lit(1)).alias("attempts"), F.mean("delay_ms").alias("delay_ms_mean"))
        .orderBy("policy", "graph", "outcome")
    )
    hops = (
        attempts.groupBy("policy", "graph", "hop")
        .agg(*counts, F.mean("delay_ms").alias("delay_ms_mean"))
        .select("policy", "graph", "hop", "attempts", *OUTCOMES, rate, "delay_ms_mean")
        .orderBy("policy", "graph", "hop")
    )
    links = (
        attempts.groupBy("policy", "graph", "node", "next")
        .agg(*counts, F.mean("delay_ms").alias("delay_ms_mean"))
        .select("policy", "graph", "node", "next", "attempts", *OUTCOMES, rate, "delay_ms_mean")
        .orderBy("policy", "graph", F.desc("attempts"), "node", "next")
    )
    by_outcome = collect(outcomes, "shuffle_outcomes", "Attempts per outcome")
    section.tables += [
        by_outcome,
        collect(hops, "shuffle_hops", "Attempts per hop index"),
        collect(links, "shuffle_links", "Attempts per link (node -> next)"),
    ]
    section.notes.append("One shuffle record per transmission attempt over one link.")
    section.plots.append(plots.outcomes(by_outcome))
    return section
