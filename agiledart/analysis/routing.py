"""Shuffle path planning: regret, path choices, delays (``delivery``) and hop attempts
(``shuffle``); the paper's Figs. 14-17.

Regret (paper §V) per (policy, graph, origin, dest), packets ordered by ``k``::

    R(K) = Σ_{k <= K} delay_ms(k) - K · optimal_ms

over the deliveries that carry ``optimal_ms``, as the running sum of
``delay_ms - optimal_ms``. The curve has a point per *bucket* of ``k``: a series whose
largest ``k`` is ``K`` is cut into buckets of ``W`` consecutive values of ``k``
(``bucket = ceil(k / W)``), ``W`` the smallest power of two that makes at most
:data:`CURVE_POINTS` of them (1 up to 1000 packets: a point per ``k``). A point is
``R`` after the bucket's last packet: ``k`` its largest ``k``, ``packets`` the packets
up to it, ``regret_ms`` exact, and ``delay_ms`` / ``optimal_ms`` the means over the
bucket's packets. The reader's tasks sum each piece's deliveries up per bucket of its
own ``k`` (:func:`~agiledart.analysis.partials.curve_widths`), Spark merges them into
the series' buckets, and the driver adds the merged rows (the table's) up along each
series: no job sorts the deliveries. The summary (with the exact final value), the
path counts and the delay CDF (101 levels per (policy, graph), within a relative
:data:`~agiledart.analysis.sketch.ALPHA`, with the packets it counts) come from the
reader's partial aggregates (:mod:`~agiledart.analysis.partials`), and the shuffle
tables from its ``attempts``. A null ``graph`` is shown as ``""``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from agiledart.analysis.frames import Frames, collect, descending, of_arrow
from agiledart.analysis.model import Section
from agiledart.analysis.partials import CURVE_POINTS, SERIES
from agiledart.analysis.sketch import ALPHA, MIN_SAMPLES, group_starts, quantiles

__all__ = ["CDF_POINTS", "CURVE_POINTS", "OUTCOMES", "routing_section", "shuffle_section"]

CDF_POINTS = 101
TOP_PATHS = 20
OUTCOMES = ("ok", "lost", "late", "refused")


def _curve(frames: Frames) -> pa.Table:
    """The regret curve: the reader's partial sums per bucket of ``k`` (``curve``)
    merged by Spark into the buckets of each series' widest width (a point per bucket,
    at most :data:`CURVE_POINTS` per series), then added up along each series in the
    driver (the merged rows are the table's rows)."""
    widest = F.max("width").over(Window.partitionBy(*SERIES))
    merged = (
        frames.partials("curve")
        .select(
            *SERIES,
            # a bucket of width w lies whole in the series' bucket ceil(bucket / (W / w))
            F.ceil(F.col("bucket") / (widest / F.col("width"))).alias("bucket"),
            "packets",
            "k",
            "regret_sum",
            "delay_sum",
            "optimal_sum",
        )
        .groupBy(*SERIES, "bucket")
        .agg(
            F.sum("packets").alias("packets"),
            F.max("k").alias("k"),
            F.sum("regret_sum").alias("regret_sum"),
            F.sum("delay_sum").alias("delay_sum"),
            F.sum("optimal_sum").alias("optimal_sum"),
        )
        .toArrow()
    )
    merged = merged.take(
        pc.sort_indices(merged, sort_keys=[(name, "ascending") for name in (*SERIES, "bucket")])
    )
    packets = merged["packets"].to_numpy()
    regret = merged["regret_sum"].to_numpy()
    cum_packets, cum_regret = np.empty_like(packets), np.empty_like(regret)
    bounds = group_starts(merged, SERIES)
    for start, end in itertools.pairwise(bounds):
        cum_packets[start:end] = np.cumsum(packets[start:end])
        cum_regret[start:end] = np.cumsum(regret[start:end])
    n = merged["packets"].cast(pa.float64())
    return pa.table(
        {
            **{name: merged[name] for name in SERIES},
            "k": merged["k"],
            "packets": cum_packets,
            "delay_ms": pc.divide(merged["delay_sum"], n),
            "optimal_ms": pc.divide(merged["optimal_sum"], n),
            "regret_ms": cum_regret,
        }
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


def _cdf(frames: Frames) -> pa.Table:
    """The delay CDF: :data:`CDF_POINTS` quantiles per (policy, graph) from the merged
    ``delay`` histograms (one Spark query, a row per (policy, graph)), a row per level."""
    last = CDF_POINTS - 1
    names = [f"q{i}" for i in range(CDF_POINTS)]
    wide = quantiles(
        frames.partials("delay"), ["policy", "graph"], [i / last for i in range(CDF_POINTS)], names
    ).toArrow()
    return pa.concat_tables(
        pa.table(
            {
                "policy": wide["policy"],
                "graph": wide["graph"],
                "fraction": pa.array([i / last] * wide.num_rows, pa.float64()),
                "delay_ms": wide[name],
                "packets": wide["count"],
            }
        )
        for i, name in enumerate(names)
    )


def routing_section(frames: Frames) -> Section:
    section = Section("routing", "Shuffle paths: regret, choices, delays", ("delivery",))
    if not frames.has("delivery"):
        return section
    regret = of_arrow(
        _curve(frames),
        "regret",
        "Regret R(K) per policy and graph",
        (*SERIES, "packets"),
    )
    cdf = of_arrow(
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
        f"graph, origin, dest); a point per bucket of k (at most {CURVE_POINTS} per series, "
        "buckets of a power of two of consecutive k; delay_ms and optimal_ms are the "
        "bucket's means).",
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
