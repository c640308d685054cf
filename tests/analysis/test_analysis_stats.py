"""The exact percentiles of sorted arrays are Spark's ``percentile`` (and numpy's)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

LEVELS = (0.0, 0.01, 0.25, 0.5, 0.95, 0.99, 1.0)


@pytest.fixture(scope="module")
def groups(spark: Any) -> Any:
    rng = random.Random(7)
    rows: list[tuple[str, float | None]] = []
    for g, n in (("one", 1), ("two", 2), ("ties", 40), ("many", 997)):
        pool = [1.5, 2.5, 2.5] if g == "ties" else None
        for _ in range(n):
            rows.append((g, rng.choice(pool) if pool else rng.lognormvariate(2.0, 1.0)))
    rows += [("nulls", None), ("many", None)]
    return spark.createDataFrame(rows, "g string, x double")


def test_percentile_of_equals_sparks_percentile(groups: Any) -> None:
    from pyspark.sql import functions as F

    from agiledart.analysis.stats import percentile_of, sorted_values

    ours = {
        r["g"]: r
        for r in groups.groupBy("g")
        .agg(sorted_values("x").alias("v"))
        .select("g", *(percentile_of(F.col("v"), q).alias(f"q{i}") for i, q in enumerate(LEVELS)))
        .collect()
    }
    spark_exact = {
        r["g"]: r["p"]
        for r in groups.groupBy("g")
        .agg(F.percentile("x", F.array(*(F.lit(q) for q in LEVELS))).alias("p"))
        .collect()
    }
    assert set(ours) == set(spark_exact) == {"one", "two", "ties", "many", "nulls"}
    for g, row in ours.items():
        got = [row[f"q{i}"] for i in range(len(LEVELS))]
        if g == "nulls":
            assert got == [None] * len(LEVELS)
            continue
        assert got == pytest.approx(list(spark_exact[g]), rel=1e-13, abs=0.0)
        values = [r["x"] for r in groups.where(F.col("g") == g).collect() if r["x"] is not None]
        assert got == pytest.approx([float(np.percentile(values, q * 100)) for q in LEVELS])
