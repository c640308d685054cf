"""Latency per app (``tuple`` records) and throughput per operator (``opstats``).

Time is cut into windows of ``window_ms`` from the trace's first record
(:attr:`Traces.t0_ms`): window ``w`` holds the records with
``w = floor((ts - t0) / window_ms)`` and starts ``w * window_ms / 1000`` seconds into
the trace. Percentiles are exact (linear interpolation between the closest ranks,
numpy's default ``method="linear"``; :mod:`~agiledart.analysis.stats`).

``opstats`` counters are cumulative per operator instance (``app``, ``operator``,
``peer``); an operator's throughput in a window is the sum over its instances of the
counter increase since each instance's previous sample, divided by the window length.
An instance's first sample has no previous one and adds nothing; a counter that went
down (the instance restarted) adds its new value.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from agiledart.analysis import plots
from agiledart.analysis.model import Section, collect
from agiledart.analysis.reader import Traces
from agiledart.analysis.stats import percentile_of, sorted_values

__all__ = ["PERCENTILES", "latency_section", "throughput_section", "window_of"]

PERCENTILES = (0.5, 0.95, 0.99)


def window_of(traces: Traces, window_ms: float) -> Column:
    """The window index of a record (its ``ts``), counted from the trace's start."""
    t0 = traces.t0_ms or 0.0
    return F.floor((F.col("ts") - F.lit(t0)) / F.lit(window_ms))


def _latency_stats() -> list[Column]:
    return [
        F.count(F.lit(1)).alias("count"),
        sorted_values("latency_ms").alias("values"),
        F.mean("latency_ms").alias("mean_ms"),
        F.max("latency_ms").alias("max_ms"),
    ]


def _spread(frame: DataFrame, *keys: str) -> DataFrame:
    return frame.select(
        *keys,
        "count",
        *(percentile_of(F.col("values"), q).alias(f"p{round(q * 100)}_ms") for q in PERCENTILES),
        "mean_ms",
        "max_ms",
    )


def latency_section(traces: Traces, window_ms: float) -> Section:
    section = Section("latency", "End-to-end latency", ("tuple",))
    if not traces.has("tuple"):
        return section
    tuples = traces.records("tuple")
    windows = (
        tuples.groupBy("app", window_of(traces, window_ms).alias("window"))
        .agg(*_latency_stats())
        .withColumn("t_s", F.col("window") * F.lit(window_ms / 1000.0))
    )
    windows = _spread(windows, "app", "window", "t_s").orderBy("app", "window")
    summary = _spread(tuples.groupBy("app", "sink").agg(*_latency_stats()), "app", "sink")
    by_window = collect(windows, "latency_windows", f"Latency per app per {window_ms:g} ms window")
    section.tables += [
        collect(summary.orderBy("app", "sink"), "latency_summary", "Latency per app and sink"),
        by_window,
    ]
    section.notes.append(
        f"Sampled tuples at their sinks; windows of {window_ms:g} ms from the trace's "
        "start; exact percentiles (linear interpolation)."
    )
    section.plots.append(plots.latency(by_window))
    return section


def _increases(traces: Traces, window_ms: float) -> DataFrame:
    """``opstats`` samples with their window and counter increases (``d_in``, ``d_out``)."""
    instance = Window.partitionBy("app", "operator", "peer").orderBy("ts")

    def increase(counter: str) -> Column:
        before = F.lag(counter).over(instance)
        return F.when(F.col(counter) >= before, F.col(counter) - before).when(
            before.isNotNull(), F.col(counter)
        )

    return traces.records("opstats").select(
        "app",
        "operator",
        "peer",
        "queue",
        "utilization",
        window_of(traces, window_ms).alias("window"),
        increase("records_in").alias("d_in"),
        increase("records_out").alias("d_out"),
    )


def _per_window(samples: DataFrame, seconds: float) -> DataFrame:
    return (
        samples.groupBy("app", "operator", "window")
        .agg(
            (F.coalesce(F.sum("d_in"), F.lit(0)) / seconds).alias("in_per_s"),
            (F.coalesce(F.sum("d_out"), F.lit(0)) / seconds).alias("out_per_s"),
            # the distinct peers of a few samples: a set per group, one aggregation
            # (countDistinct would add a second one and an expansion of every row)
            F.size(F.collect_set("peer")).alias("instances"),
            F.mean("queue").alias("queue_mean"),
            F.mean("utilization").alias("utilization_mean"),
        )
        .select(
            "app",
            "operator",
            "window",
            (F.col("window") * F.lit(seconds)).alias("t_s"),
            "in_per_s",
            "out_per_s",
            "instances",
            "queue_mean",
            "utilization_mean",
        )
    )


def _per_operator(traces: Traces, windows: DataFrame) -> DataFrame:
    """Counter totals (each instance's largest value, summed) and the window rates."""
    last = (
        traces.records("opstats")
        .groupBy("app", "operator", "peer")
        .agg(F.max("records_in").alias("records_in"), F.max("records_out").alias("records_out"))
    )
    totals = last.groupBy("app", "operator").agg(
        F.count(F.lit(1)).alias("instances"),
        F.sum("records_in").alias("records_in"),
        F.sum("records_out").alias("records_out"),
    )
    rates = windows.groupBy("app", "operator").agg(
        F.mean("out_per_s").alias("out_per_s_mean"),
        F.max("out_per_s").alias("out_per_s_max"),
        F.max("queue_mean").alias("queue_max"),
        F.mean("utilization_mean").alias("utilization_mean"),
    )
    return totals.join(rates, ["app", "operator"]).orderBy("app", "operator")


def throughput_section(traces: Traces, window_ms: float) -> Section:
    section = Section("throughput", "Operator throughput", ("opstats",))
    if not traces.has("opstats"):
        return section
    # a few rows per operator and window: kept, so the summary does not sort the
    # samples of every instance a second time
    windows = _per_window(_increases(traces, window_ms), window_ms / 1000.0).persist()
    try:
        by_window = collect(
            windows.orderBy("app", "operator", "window"),
            "throughput_windows",
            f"Throughput per {window_ms:g} ms window",
        )
        summary = collect(
            _per_operator(traces, windows), "throughput_summary", "Throughput per operator"
        )
    finally:
        windows.unpersist()
    section.tables += [summary, by_window]
    section.notes.append(
        "Records out per second per operator, summed over its instances (counter "
        "increases between an instance's samples)."
    )
    section.plots.append(plots.throughput(by_window))
    return section
