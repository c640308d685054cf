"""Latency per app (``tuple`` records) and throughput per operator (``opstats``).

Time is cut into windows of ``window_ms`` from the trace's first record
(:attr:`Frames.t0_ms`): window ``w`` holds the records with
``w = floor((ts - t0) / window_ms)`` and starts ``w * window_ms / 1000`` seconds into
the trace. Latency comes from the reader's partial aggregates (``latency``,
:mod:`~agiledart.analysis.partials`): percentiles within a relative
:data:`~agiledart.analysis.sketch.ALPHA` of the exact ones, next to the count of samples
they describe, and withheld below :data:`~agiledart.analysis.sketch.MIN_SAMPLES`.

``opstats`` counters are cumulative per operator instance (``app``, ``operator``,
``peer``); an operator's throughput in a window is the sum over its instances of the
counter increase since each instance's previous sample, divided by the window length.
An instance's first sample has no previous one and adds nothing; a counter that went
down (the instance restarted) adds its new value.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from agiledart.analysis.frames import Frames, collect, of_arrow
from agiledart.analysis.model import Section
from agiledart.analysis.sketch import ALPHA, MIN_SAMPLES, quantiles

__all__ = ["PERCENTILES", "latency_section", "throughput_section"]

PERCENTILES = (0.5, 0.95, 0.99)
_LATENCY = ["count", *(f"p{round(q * 100)}_ms" for q in PERCENTILES), "mean_ms", "max_ms"]


def latency_section(frames: Frames) -> Section:
    section = Section("latency", "End-to-end latency", ("tuple",))
    if not frames.has("tuple"):
        return section
    # both tables from one aggregation of the reader's partials (one row per app, sink,
    # window and latency bucket of each piece): a row per (app, sink) and a row per
    # (app, window), told apart by which set grouped it
    both = (
        frames.partials("latency")
        .groupingSets(
            [("app", "sink", "code"), ("app", "window", "code")], "app", "sink", "window", "code"
        )
        .agg(
            F.grouping("window").alias("per_sink"),
            F.sum("n").alias("n"),
            F.sum("sum").alias("sum"),
            F.max("max").alias("max"),
        )
    )
    names = [f"p{round(q * 100)}_ms" for q in PERCENTILES]
    stats = (F.sum("sum") / F.sum("n")).alias("mean_ms"), F.max("max").alias("max_ms")
    found = quantiles(
        both, ["per_sink", "app", "sink", "window"], PERCENTILES, names, stats
    ).toArrow()
    per_sink = pc.equal(found["per_sink"], 1)
    summary = found.filter(per_sink).select(["app", "sink", *_LATENCY])
    windows = found.filter(pc.invert(per_sink))
    t_s = pc.multiply(windows["window"].cast(pa.float64()), frames.window_ms / 1000.0)
    windows = windows.select(["app", "window", *_LATENCY]).add_column(2, "t_s", t_s)
    section.tables += [
        of_arrow(summary, "latency_summary", "Latency per app and sink", ("app", "sink")),
        of_arrow(
            windows,
            "latency_windows",
            f"Latency per app per {frames.window_ms:g} ms window",
            ("app", "window"),
        ),
    ]
    section.notes.append(
        "Sampled tuples at their sinks (about 5% of source records; count: how many); "
        f"windows of {frames.window_ms:g} ms from the trace's start; percentiles "
        f"within {ALPHA:.0%} of the exact value (mergeable histograms), left empty below "
        f"{MIN_SAMPLES} samples; mean and max exact."
    )
    return section


def _increases(frames: Frames) -> DataFrame:
    """``opstats`` samples with their window and counter increases (``d_in``, ``d_out``)."""
    instance = Window.partitionBy("app", "operator", "peer").orderBy("ts")

    def increase(counter: str) -> Column:
        before = F.lag(counter).over(instance)
        return F.when(F.col(counter) >= before, F.col(counter) - before).when(
            before.isNotNull(), F.col(counter)
        )

    return frames.records("opstats").select(
        "app",
        "operator",
        "peer",
        "queue",
        "utilization",
        frames.window().alias("window"),
        increase("records_in").alias("d_in"),
        increase("records_out").alias("d_out"),
    )


def _per_window(samples: DataFrame, seconds: float) -> DataFrame:
    return (
        samples.groupBy("app", "operator", "window")
        .agg(
            (F.coalesce(F.sum("d_in"), F.lit(0)) / seconds).alias("in_per_s"),
            (F.coalesce(F.sum("d_out"), F.lit(0)) / seconds).alias("out_per_s"),
            F.count_distinct("peer").alias("instances"),
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


def _per_operator(frames: Frames, windows: DataFrame) -> DataFrame:
    """Counter totals (each instance's largest value, summed) and the window rates."""
    last = (
        frames.records("opstats")
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
    return totals.join(rates, ["app", "operator"])


def throughput_section(frames: Frames) -> Section:
    section = Section("throughput", "Operator throughput", ("opstats",))
    if not frames.has("opstats"):
        return section
    # a few rows per operator and window, kept for the summary (which would otherwise
    # sort every instance's samples a second time)
    windows = _per_window(_increases(frames), frames.window_ms / 1000.0).persist()
    try:
        by_window = collect(
            windows,
            "throughput_windows",
            f"Throughput per {frames.window_ms:g} ms window",
            ("app", "operator", "window"),
        )
        summary = collect(
            _per_operator(frames, windows),
            "throughput_summary",
            "Throughput per operator",
            ("app", "operator"),
        )
    finally:
        windows.unpersist()
    section.tables += [summary, by_window]
    section.notes += [
        "Records out per second per operator, summed over its instances (counter "
        "increases between an instance's samples).",
        "records_in and records_out are each instance's last sampled counters (peers "
        "sample every second), summed: records an operator handled after its last sample "
        "(at most about a second's worth, more for an instance that was killed) are not "
        "in them, so they can fall short of what the sources emitted.",
    ]
    return section
