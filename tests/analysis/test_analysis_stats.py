"""The percentiles the analysis states: Spark's ``percentile_approx`` within its stated
rank accuracy (also over more values than the sketch keeps exactly), withheld below the
sample threshold, nulls skipped as SQL's aggregates skip them."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agiledart.analysis.frames import ACCURACY, MIN_SAMPLES, percentiles

from .traces import percentile_fits

LEVELS = (0.0, 0.01, 0.25, 0.5, 0.95, 0.99, 1.0)


@pytest.fixture(scope="module")
def rows() -> list[tuple[str, float | None]]:
    rng = random.Random(7)
    out: list[tuple[str, float | None]] = []
    sizes = (("one", 1), ("few", MIN_SAMPLES - 1), ("ties", 40), ("many", 3 * ACCURACY))
    for g, n in sizes:
        pool = [1.5, 2.5, 2.5] if g == "ties" else None
        for _ in range(n):
            out.append((g, rng.choice(pool) if pool else rng.lognormvariate(2.0, 1.0)))
    out += [("nulls", None), ("many", None)]
    rng.shuffle(out)
    return out


def test_percentiles_are_within_the_stated_accuracy_and_withheld_when_few(
    spark: Any, rows: list[tuple[str, float | None]]
) -> None:
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(rows, "g string, x double").repartition(3)
    got = {
        r["g"]: r["p"]
        for r in frame.groupBy("g").agg(F.array(*percentiles("x", LEVELS)).alias("p")).collect()
    }
    values: dict[str, list[float]] = {}
    for g, x in rows:
        values.setdefault(g, [])
        if x is not None:
            values[g].append(x)
    assert set(got) == set(values)
    assert got["one"] == [None] * len(LEVELS)
    assert got["few"] == [None] * len(LEVELS)
    assert got["nulls"] == [None] * len(LEVELS)
    for g in ("ties", "many"):
        for q, shown in zip(LEVELS, got[g], strict=True):
            assert percentile_fits(shown, values[g], q), (g, q, shown)
