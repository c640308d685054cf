"""Final tables are put in order by the driver (:func:`~agiledart.analysis.frames.collect`),
in the order Spark's ``orderBy`` gives: ascending keys with nulls first, descending
ones with nulls last, later keys breaking ties."""

from __future__ import annotations

import random
from typing import Any

from agiledart.analysis.frames import collect, descending


def test_the_driver_orders_a_table_as_spark_orderby_does(spark: Any) -> None:
    from pyspark.sql import functions as F

    rng = random.Random(3)
    rows = [
        (
            rng.choice(["a", "b", "é", None]),
            rng.choice([1, 2, 3, None]),
            rng.choice([0.5, -1.0, None]),
            i,
        )
        for i in range(300)
    ]
    frame = spark.createDataFrame(rows, "s string, n long, x double, i long").repartition(3)
    got = collect(frame, "t", "t", ("s", descending("n"), "x", descending("i")))
    spark_order = frame.orderBy("s", F.desc("n"), "x", F.desc("i")).collect()
    assert got.columns == ["s", "n", "x", "i"]
    assert got.rows == [tuple(r) for r in spark_order]
