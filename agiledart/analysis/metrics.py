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
down (the instance restarted) adds its new value. The reader's tasks compute the
increases within each *run* of an instance's samples (a batch of records, sorted by
``ts``: the ``rates`` partial) and keep each run's first and last sample (``runs``);
Spark adds the increase of each run's first sample since the run before it (a window
over the runs of each instance, a few per piece). An instance two of whose runs
overlap in time is computed from its ``opstats`` records instead (a window over them).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from agiledart.analysis.frames import Frames, of_arrow
from agiledart.analysis.model import Section
from agiledart.analysis.partials import INSTANCE as _INSTANCE
from agiledart.analysis.sketch import ALPHA, MIN_SAMPLES, quantiles

__all__ = ["PERCENTILES", "latency_section", "throughput_section"]

PERCENTILES = (0.5, 0.95, 0.99)
_LATENCY = ["count", *(f"p{round(q * 100)}_ms" for q in PERCENTILES), "mean_ms", "max_ms"]


_NAMES = [f"p{round(q * 100)}_ms" for q in PERCENTILES]
_STATS = {"mean_ms": ("mean", "sum"), "max_ms": ("max", "max")}


def latency_section(frames: Frames) -> Section:
    section = Section("latency", "End-to-end latency", ("tuple",))
    if not frames.has("tuple"):
        return section
    # per app and window: each piece's histogram of a window is one row (two lists);
    # per app and sink: a row per piece and bucket
    windows = quantiles(
        frames.partials("latency"), ["app", "window"], PERCENTILES, _NAMES, _STATS
    ).toArrow()
    summary = quantiles(
        frames.partials("latency_sinks"), ["app", "sink"], PERCENTILES, _NAMES, _STATS
    ).toArrow()
    t_s = pc.multiply(windows["window"].cast(pa.float64()), frames.window_ms / 1000.0)
    windows = windows.select(["app", "window", *_LATENCY]).add_column(2, "t_s", t_s)
    section.tables += [
        of_arrow(
            summary.select(["app", "sink", *_LATENCY]),
            "latency_summary",
            "Latency per app and sink",
            ("app", "sink"),
        ),
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


#: an operator instance, as the reader's ``runs`` and ``rates`` partials key it
INSTANCE = list(_INSTANCE)


def _grown(counter: str, before: Column) -> Column:
    """A counter's increase since ``before`` (its previous sample's value; null: none)."""
    return F.when(F.col(counter) >= before, F.col(counter) - before).when(
        before.isNotNull(), F.col(counter)
    )


def _joins(frames: Frames) -> DataFrame:
    """Per *run* of an instance's samples (a batch of a reader task: ``runs``), the
    increase of its first sample since the last sample of the instance's run before it
    (by time), and whether the two runs overlap in time (then the runs' order is not the
    samples' order, and the instance is computed from its records: :func:`_from_records`)."""
    runs = Window.partitionBy(*INSTANCE).orderBy("first_ts", "run")
    return frames.partials("runs").select(
        *INSTANCE,
        F.col("first_window").alias("window"),
        _grown("first_in", F.lag("last_in").over(runs)).alias("d_in"),
        _grown("first_out", F.lag("last_out").over(runs)).alias("d_out"),
        (F.col("first_ts") <= F.lag("last_ts").over(runs)).alias("overlaps"),
        "max_in",
        "max_out",
    )


def _from_records(frames: Frames, chosen: DataFrame) -> DataFrame:
    """The ``rates`` rows of the ``chosen`` instances computed from their records (a
    window per instance, by ``ts``)."""
    instance = Window.partitionBy(*INSTANCE).orderBy("ts")
    return (
        frames.records("opstats")
        .join(F.broadcast(chosen), INSTANCE)
        .select(
            *INSTANCE,
            frames.window().alias("window"),
            _grown("records_in", F.lag("records_in").over(instance)).alias("d_in"),
            _grown("records_out", F.lag("records_out").over(instance)).alias("d_out"),
            F.lit(1).cast("long").alias("samples"),
            F.col("queue").alias("queue_sum"),
            F.coalesce("utilization", F.lit(0.0)).alias("utilization_sum"),
            F.col("utilization").isNotNull().cast("long").alias("utilization_n"),
        )
    )


def _per_window(frames: Frames, overlapping: pa.Table) -> DataFrame:
    """Throughput per operator and window: the reader's ``rates`` (increases within each
    run) and the increases between runs (:func:`_joins`), added up per window; the
    instances whose runs overlap from their records instead."""
    seconds = frames.window_ms / 1000.0
    joins = _joins(frames).select(
        *INSTANCE,
        "window",
        "d_in",
        "d_out",
        *(F.lit(0).cast(t).alias(c) for c, t in _ZEROS.items()),
    )
    rows = frames.partials("rates").unionByName(joins)
    if overlapping.num_rows:
        chosen = frames.spark.createDataFrame(
            overlapping.to_pylist(), "app string, operator string, peer string"
        )
        rows = rows.join(F.broadcast(chosen), INSTANCE, "left_anti").unionByName(
            _from_records(frames, chosen)
        )
    return (
        rows.groupBy("app", "operator", "window")
        .agg(
            (F.coalesce(F.sum("d_in"), F.lit(0)) / seconds).alias("in_per_s"),
            (F.coalesce(F.sum("d_out"), F.lit(0)) / seconds).alias("out_per_s"),
            F.count_distinct(F.when(F.col("samples") > 0, F.col("peer"))).alias("instances"),
            F.try_divide(F.sum("queue_sum"), F.sum("samples")).alias("queue_mean"),
            F.try_divide(F.sum("utilization_sum"), F.sum("utilization_n")).alias(
                "utilization_mean"
            ),
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


_ZEROS = {
    "samples": "long",
    "queue_sum": "long",
    "utilization_sum": "double",
    "utilization_n": "long",
}


def _instances(frames: Frames) -> pa.Table:
    """Per operator instance: its counters' largest values and whether any two of its
    runs overlap in time (one Spark query over the ``runs`` partials)."""
    return (
        _joins(frames)
        .groupBy(*INSTANCE)
        .agg(
            F.max("max_in").alias("records_in"),
            F.max("max_out").alias("records_out"),
            F.coalesce(F.max("overlaps"), F.lit(False)).alias("overlaps"),
        )
        .toArrow()
    )


def _per_operator(instances: pa.Table, windows: pa.Table) -> pa.Table:
    """Counter totals (each instance's largest value, summed) and the window rates,
    added up in the driver from the instances (a row each) and the windows table."""
    totals = instances.group_by(["app", "operator"], use_threads=False).aggregate(
        [([], "count_all"), ("records_in", "sum"), ("records_out", "sum")]
    )
    totals = totals.rename_columns(
        {"count_all": "instances", "records_in_sum": "records_in", "records_out_sum": "records_out"}
    )
    rates = windows.group_by(["app", "operator"], use_threads=False).aggregate(
        [
            ("out_per_s", "mean"),
            ("out_per_s", "max"),
            ("queue_mean", "max"),
            ("utilization_mean", "mean"),
        ]
    )
    rates = rates.rename_columns(
        {
            "out_per_s_mean": "out_per_s_mean",
            "out_per_s_max": "out_per_s_max",
            "queue_mean_max": "queue_max",
            "utilization_mean_mean": "utilization_mean",
        }
    )
    joined = totals.join(rates, ["app", "operator"], join_type="inner")
    return joined.select(
        [
            "app",
            "operator",
            "instances",
            "records_in",
            "records_out",
            "out_per_s_mean",
            "out_per_s_max",
            "queue_max",
            "utilization_mean",
        ]
    )


def throughput_section(frames: Frames) -> Section:
    section = Section("throughput", "Operator throughput", ("opstats",))
    if not frames.has("opstats"):
        return section
    instances = _instances(frames)
    overlapping = instances.filter(instances["overlaps"]).select(INSTANCE)
    windows = _per_window(frames, overlapping).toArrow()
    by_window = of_arrow(
        windows,
        "throughput_windows",
        f"Throughput per {frames.window_ms:g} ms window",
        ("app", "operator", "window"),
    )
    summary = of_arrow(
        _per_operator(instances, windows),
        "throughput_summary",
        "Throughput per operator",
        ("app", "operator"),
    )
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
