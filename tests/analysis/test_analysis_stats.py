"""Exact percentiles of each group's sorted values are Spark's ``percentile`` (and
numpy's); groups by several keys, nulls among them, as SQL's ``GROUP BY``."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from agiledart.analysis.columns import groups, ordered, percentile

LEVELS = (0.0, 0.01, 0.25, 0.5, 0.95, 0.99, 1.0)


@pytest.fixture(scope="module")
def rows() -> list[tuple[str, float | None]]:
    rng = random.Random(7)
    out: list[tuple[str, float | None]] = []
    for g, n in (("one", 1), ("two", 2), ("ties", 40), ("many", 997)):
        pool = [1.5, 2.5, 2.5] if g == "ties" else None
        for _ in range(n):
            out.append((g, rng.choice(pool) if pool else rng.lognormvariate(2.0, 1.0)))
    out += [("nulls", None), ("many", None)]
    rng.shuffle(out)
    return out


def _ours(rows: list[tuple[str, float | None]]) -> dict[str, list[float | None]]:
    by = groups(pa.array([g for g, _ in rows]))
    values = np.array([np.nan if x is None else x for _, x in rows])
    kept, offsets = by.sorted_values(values)
    return {
        key[0]: [percentile(kept, int(offsets[i]), int(offsets[i + 1]), q) for q in LEVELS]
        for i, key in enumerate(by.keys)
    }


def test_percentiles_equal_sparks_percentile(spark: Any, rows: list[Any]) -> None:
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(rows, "g string, x double")
    spark_exact = {
        r["g"]: r["p"]
        for r in frame.groupBy("g")
        .agg(F.percentile("x", F.array(*(F.lit(q) for q in LEVELS))).alias("p"))
        .collect()
    }
    ours = _ours(rows)
    assert set(ours) == set(spark_exact) == {"one", "two", "ties", "many", "nulls"}
    for g, got in ours.items():
        if g == "nulls":
            assert got == [None] * len(LEVELS)
            continue
        assert got == pytest.approx(list(spark_exact[g]), rel=1e-13, abs=0.0)
        values = [x for h, x in rows if h == g and x is not None]
        assert got == pytest.approx([float(np.percentile(values, q * 100)) for q in LEVELS])


def test_groups_by_several_keys_with_nulls_and_their_aggregates() -> None:
    a = pa.array(["x", None, "x", "y", None, "x"])
    b = np.array([2, 1, 2, 7, 1, 3])
    v = np.array([1.0, 5.0, np.nan, 4.0, 6.0, 8.0])
    by = groups(a, b)
    assert sorted(by.keys, key=str) == sorted([("x", 2), (None, 1), ("y", 7), ("x", 3)], key=str)
    of = {key: i for i, key in enumerate(by.keys)}
    counts = by.count()
    assert counts[of[("x", 2)]] == 2
    assert counts[of[(None, 1)]] == 2
    mean = by.mean(v)
    assert mean[of[("x", 2)]] == 1.0  # the null skipped
    assert mean[of[(None, 1)]] == 5.5
    assert by.extreme(v, np.maximum)[of[("x", 3)]] == 8.0
    assert by.last(pa.array(list("abcdef")), np.array([9.0, 1, 3, 0, 2, 0]))[of[("x", 2)]] == "a"
    empty = groups(pa.array(["z", "z"]))
    assert empty.mean(np.array([np.nan, np.nan])) == [None]
    assert empty.extreme(np.array([np.nan, np.nan]), np.minimum) == [None]


def test_rows_are_ordered_as_spark_orders() -> None:
    rows = [("b", 1), (None, 5), ("a", None), ("a", 3)]
    assert ordered(rows, 0, 1) == [(None, 5), ("a", None), ("a", 3), ("b", 1)]
    assert ordered(rows, 1, 0, descending=(1,)) == [(None, 5), ("a", 3), ("b", 1), ("a", None)]


def test_lists_are_joined_as_sparks_array_join() -> None:
    from agiledart.analysis.columns import joined

    plain = pa.array([["a", "b"], [], None], pa.list_(pa.string()))
    assert joined(plain, " > ").to_pylist() == ["a > b", "", None]
    holes = pa.array([["a", None, "c"], None, [None]], pa.list_(pa.string()))
    assert joined(holes, " ").to_pylist() == ["a c", None, ""]
