"""The parsed records as Spark DataFrames: what every section's queries run on.

Theory of operation: the reader's tasks write the valid records of each type as
Parquet files under ``<parts>/<type>/`` (one or a few per piece of a trace file, in the
output directory, which every executor reaches), and for the largest types partial
aggregates instead (:mod:`~agiledart.analysis.partials`, :meth:`Frames.partials`). A
section is a few Spark queries over those partials and :meth:`Frames.records`: the
files are scanned in parallel partitions, the aggregations (and the partials) are
merged after a shuffle, and percentiles come from mergeable histograms merged a group
at a time in the Python workers (:mod:`~agiledart.analysis.sketch`); no query sorts
records.
No section's records ever have to fit in one executor or in the driver; only the final
tables come back, through Arrow (:func:`collect`), and the driver puts them in order:
a final table is in the driver whole anyway, and Spark's global sort would cost every
table a sampling job and a second pass over what it sorts (for a log of records, a
second scan of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from agiledart.analysis.model import Table
from agiledart.analysis.partials import merged, partial_frame
from agiledart.analysis.schemas import kept_schema

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Frames", "collect", "descending", "of_arrow"]


@dataclass(frozen=True)
class Frames:
    """Where one analysis's records are, and what the reader learned of them."""

    spark: SparkSession
    parts: Path
    """``<type>/part-NNNNNN-NNN.parquet``: the valid records of each type."""
    counts: dict[str, int]
    writer_peers: list[str]
    t0_ms: float | None
    t1_ms: float | None
    window_ms: float

    def has(self, kind: str) -> bool:
        return self.counts.get(kind, 0) > 0

    def records(self, kind: str) -> DataFrame:
        """Every valid ``kind`` record (there must be some: :meth:`has`), read with
        the columns' schema given (no file's footer read to infer it, query by query)."""
        return self.spark.read.schema(kept_schema(kind)).parquet(str(self.parts / kind))

    def partials(self, name: str) -> DataFrame:
        """The partial aggregates ``name`` (:data:`~agiledart.analysis.partials.PARTIALS`)
        of every piece, unmerged."""
        return partial_frame(self.spark, self.parts, name)

    def merged(self, name: str) -> DataFrame:
        """The partial aggregates ``name`` merged over all pieces, per its keys."""
        return merged(self.spark, self.parts, name)

    def t_s(self) -> Column:
        """``ts`` in seconds since the trace's first record, as ``t_s``."""
        return ((F.col("ts") - F.lit(self.t0_ms or 0.0)) / 1000.0).alias("t_s")

    def window(self) -> Column:
        """The window index of a record (its ``ts``), counted from the trace's start."""
        start = F.lit(self.t0_ms or 0.0)
        return F.floor((F.col("ts") - start) / F.lit(self.window_ms)).cast("long")


#: a sort key of :func:`collect`: a column (ascending), or ``(column, "descending")``
SortKey = str | tuple[str, str]


def descending(column: str) -> SortKey:
    """A sort key: ``column`` descending (nulls last, as Spark's ``desc``)."""
    return (column, "descending")


def collect(frame: DataFrame, name: str, title: str, order: Sequence[SortKey] = ()) -> Table:
    """Run ``frame`` and keep its rows as a :class:`Table` (through Arrow: a log table
    of every record of a type can have hundreds of thousands of rows), sorted by
    ``order`` in the driver as Spark's ``orderBy`` would: ascending keys with nulls
    first, :func:`descending` ones with nulls last."""
    return of_arrow(frame.toArrow(), name, title, order)


def of_arrow(table: pa.Table, name: str, title: str, order: Sequence[SortKey] = ()) -> Table:
    """The rows of ``table`` (come back from Spark) as a :class:`Table`, sorted as
    :func:`collect` sorts."""
    if order:
        keys = [
            (key, "ascending", "at_start") if isinstance(key, str) else (*key, "at_end")
            for key in order
        ]
        table = table.take(pc.sort_indices(table, sort_keys=keys))
    columns = [column.to_pylist() for column in table.columns]
    rows = list(zip(*columns, strict=True)) if columns else []
    return Table(name=name, title=title, columns=list(table.column_names), rows=rows)
