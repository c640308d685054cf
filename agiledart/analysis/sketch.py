"""Mergeable percentiles: a log-bucket histogram with a relative accuracy of :data:`ALPHA`.

Theory of operation (DDSketch: Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable
quantile sketch with relative-error guarantees", VLDB 2019, §2): with
``gamma = (1 + ALPHA) / (1 - ALPHA)``, a positive value ``x`` falls in bucket
``i = ceil(log_gamma(x))``, which holds ``(gamma^(i-1), gamma^i]``; every value of the
bucket is within a relative ``ALPHA`` of its representative ``2 gamma^i / (gamma + 1)``.
A histogram is the count of values per bucket, so histograms merge by adding counts:
the reader's tasks count each piece's values per (group, bucket) in numpy
(:func:`codes`), Spark adds the counts over all pieces (a ``groupBy``), and the
``q``-quantile of a group is the representative of the bucket holding its value of rank
``max(1, ceil(q * n))`` (the smallest value with at least ``q * n`` values at or below
it): within ``ALPHA`` of that value, relatively, whatever ``n`` (:func:`quantiles`).

Buckets are numbered by one signed integer *code* that sorts as the values do: 0 for
``|x| <`` :data:`ZERO` (shown as 0), ``OFFSET + i`` for a positive value,
``-(OFFSET + i)`` for a negative one (a latency below zero: clocks of two peers apart).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["ALPHA", "MIN_SAMPLES", "ZERO", "codes", "quantiles", "rank", "spark_codes", "value"]

#: the relative accuracy of every percentile the analysis states
ALPHA = 0.01
GAMMA = (1.0 + ALPHA) / (1.0 - ALPHA)
_LOG_GAMMA = math.log(GAMMA)
#: values closer to zero than this count as 0
ZERO = 1e-9
#: how far the codes of positive values are from 0 (bucket indices stay far below it)
OFFSET = 1 << 20
#: a percentile of fewer samples than this is withheld (shown empty): the tail it would
#: describe is a handful of records
MIN_SAMPLES = 20


def codes(values: np.ndarray) -> np.ndarray:
    """The bucket code (int64) of each value (NaN counts as the largest value)."""
    x = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=np.inf)
    magnitude = np.abs(x)
    small = magnitude < ZERO
    with np.errstate(divide="ignore"):
        index = np.ceil(np.log(np.where(small, 1.0, magnitude)) / _LOG_GAMMA)
    index = np.clip(index, 1 - OFFSET, OFFSET - 1).astype(np.int64) + OFFSET
    return np.where(small, 0, np.where(x < 0, -index, index))


def value(code: int) -> float:
    """The representative value of a bucket code."""
    if code == 0:
        return 0.0
    shown = 2.0 * GAMMA ** (abs(code) - OFFSET) / (GAMMA + 1.0)
    return shown if code > 0 else -shown


def rank(q: float, n: int) -> int:
    """The rank (1-based) of the ``q``-quantile of ``n`` values."""
    return max(1, math.ceil(q * n - 1e-9))


def spark_codes(column: str) -> Column:
    """:func:`codes` as a Spark expression (for records read back from Parquet)."""
    from pyspark.sql import functions as F

    x = F.col(column).cast("double")
    magnitude = F.abs(x)
    # clipped before the ceiling (a double's infinity does not cast to a long)
    scaled = F.least(
        F.greatest(F.log(magnitude) / F.lit(_LOG_GAMMA), F.lit(1.0 - OFFSET)),
        F.lit(OFFSET - 1.0),
    )
    index = F.ceil(scaled).cast("long") + F.lit(OFFSET)
    return F.when(magnitude < ZERO, F.lit(0).cast("long")).when(x < 0, -index).otherwise(index)


def quantiles(
    histogram: DataFrame,
    keys: Sequence[str],
    qs: Sequence[float],
    names: Sequence[str],
    extra: Sequence[Column] = (),
) -> DataFrame:
    """Per group of ``keys``, from the rows (keys..., ``code``, ``n``, ...) of its
    histogram (one row per bucket, or several: counts of one bucket from several pieces
    need not be added first): ``count`` (the values), the ``qs``-quantiles as ``names``,
    each withheld (null) below :data:`MIN_SAMPLES` values, and the aggregates ``extra``
    over the group's rows. A group's buckets are sorted by Spark (a window)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    group = Window.partitionBy(*keys)
    running = group.orderBy("code").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = histogram.select(
        "*",
        F.sum("n").over(running).alias("_cum"),
        F.sum("n").over(group).alias("_total"),
    )
    found = [
        F.min(
            F.when(
                F.col("_cum") >= F.greatest(F.lit(1), F.ceil(F.col("_total") * q - 1e-9)),
                F.col("code"),
            )
        ).alias(f"_q{i}")
        for i, q in enumerate(qs)
    ]
    picked = ranked.groupBy(*keys).agg(F.max("_total").alias("count"), *found, *extra)
    enough = F.col("count") >= MIN_SAMPLES
    return picked.select(
        *keys,
        "count",
        *(
            F.when(enough, _spark_value(F.col(f"_q{i}"))).alias(name)
            for i, name in enumerate(names)
        ),
        *picked.columns[len(keys) + 1 + len(qs) :],
    )


def _spark_value(code: Column) -> Column:
    from pyspark.sql import functions as F

    shown = F.lit(2.0 / (GAMMA + 1.0)) * F.pow(F.lit(GAMMA), F.abs(code) - F.lit(OFFSET))
    return F.when(code == 0, F.lit(0.0)).otherwise(F.signum(code) * shown)
