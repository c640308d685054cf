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
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "ALPHA",
    "MIN_SAMPLES",
    "ZERO",
    "codes",
    "group_starts",
    "quantiles",
    "rank",
    "value",
]

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


def quantiles(
    histogram: DataFrame,
    keys: Sequence[str],
    qs: Sequence[float],
    names: Sequence[str],
    stats: Mapping[str, tuple[str, str]] | None = None,
) -> DataFrame:
    """Per group of ``keys``, from the rows of its histogram: ``count`` (the values),
    the ``qs``-quantiles as ``names``, each withheld (null) below :data:`MIN_SAMPLES`
    values, and ``stats``: per output name, ``("mean", column)`` (the column's sum over
    the group's rows divided by ``count``) or ``("max", column)``. A row holds one
    bucket (``code``, ``n``) or a histogram (``codes`` and their ``counts``, two
    lists); a group may have any number of rows (a bucket any number of times: the
    histograms of several pieces need not be added first).

    Spark puts each group's rows together (a shuffle by ``keys``, each partition sorted
    by them, spilling when large) and the Python workers merge them a group at a time,
    vectorised over the groups of a batch (:func:`_merge`): memory holds a batch and
    one group, whatever the number of groups."""
    from pyspark.sql import functions as F

    stats = dict(stats or {})
    if "code" in histogram.columns:
        histogram = histogram.withColumns(
            {"codes": F.array(F.col("code").cast("int")), "counts": F.array(F.col("n").cast("int"))}
        )
    columns = {*keys, "codes", "counts", *(column for _, column in stats.values())}
    fields = {f.name: f.dataType.simpleString() for f in histogram.schema.fields}
    schema = ", ".join(
        [
            *(f"`{k}` {fields[k]}" for k in keys),
            "`count` bigint",
            *(f"`{name}` double" for name in (*names, *stats)),
        ]
    )
    merge = _Merge(list(keys), list(qs), list(names), stats)
    grouped = histogram.select(*sorted(columns)).repartition(*keys).sortWithinPartitions(*keys)
    with warnings.catch_warnings():
        # pyspark 4.x checks pandas for every Python function it is given, and warns
        # about pandas >= 3, which this one does not use
        warnings.filterwarnings(
            "ignore", "PySpark does not yet fully support pandas", FutureWarning
        )
        return grouped.mapInArrow(merge, schema)


class _Merge:
    """The function :func:`quantiles` runs over each partition's batches (picklable)."""

    def __init__(
        self, keys: list[str], qs: list[float], names: list[str], stats: dict[str, tuple[str, str]]
    ) -> None:
        self.keys, self.qs, self.names, self.stats = keys, qs, names, stats

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        held: pa.Table | None = None
        for batch in batches:
            table = pa.Table.from_batches([batch])
            table = table.set_column(
                table.schema.get_field_index("counts"),
                "counts",
                table["counts"].cast(pa.list_(pa.int64())),
            )
            if held is not None:
                table = pa.concat_tables([held, table])
            starts = group_starts(table, self.keys)
            # the last group can go on in the next batch: held until then, as one row
            done, held = table.slice(0, starts[-2]), self._compacted(table.slice(starts[-2]))
            if done.num_rows:
                yield from self._merged(done, starts[:-2]).to_batches()
        if held is not None and held.num_rows:
            yield from self._merged(held, np.zeros(1, dtype=np.int64)).to_batches()

    def _compacted(self, group: pa.Table) -> pa.Table:
        """The rows of one group as one (its histogram's buckets added up): what is
        held of a group stays one histogram's size however many batches it spans."""
        if group.num_rows <= 1:
            return group
        codes = pc.list_flatten(group["codes"]).to_numpy()
        buckets, where = np.unique(codes, return_inverse=True)
        counts = np.bincount(
            where, weights=pc.list_flatten(group["counts"]).to_numpy(), minlength=len(buckets)
        )
        row: dict[str, Any] = {name: group[name][:1] for name in group.column_names}
        row["codes"] = pa.array([buckets.astype(np.int32)], group.schema.field("codes").type)
        row["counts"] = pa.array([counts.astype(np.int64)], pa.list_(pa.int64()))
        for how, column in self.stats.values():
            values = group[column].to_numpy()
            total = values.sum() if how == "mean" else values.max()
            row[column] = pa.array([total], group.schema.field(column).type)
        return pa.table(row, schema=group.schema)

    def _merged(self, table: pa.Table, starts: np.ndarray) -> pa.Table:
        lengths = pc.list_value_length(table["codes"]).to_numpy()
        rows = np.diff(np.append(starts, table.num_rows))
        group = np.repeat(np.repeat(np.arange(len(starts)), rows), lengths)
        counts = pc.list_flatten(table["counts"]).to_numpy().astype(np.int64)
        found, n = _merge(group, pc.list_flatten(table["codes"]).to_numpy(), counts, self.qs)
        enough = n >= MIN_SAMPLES
        columns: dict[str, Any] = {k: table[k].take(starts) for k in self.keys}
        columns["count"] = pa.array(n, pa.int64())
        for name, codes_of_q in zip(self.names, found, strict=True):
            shown = _values(codes_of_q)
            columns[name] = pa.array(shown, pa.float64(), mask=~enough)
        for name, (how, column) in self.stats.items():
            values = table[column].to_numpy().astype(np.float64)
            if how == "mean":
                total = np.add.reduceat(values, starts)
                columns[name] = pa.array(total / np.maximum(n, 1), pa.float64(), mask=n == 0)
            else:
                columns[name] = pa.array(np.maximum.reduceat(values, starts), pa.float64())
        return pa.table(columns)


def group_starts(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """The first row of each group of ``keys`` (rows sorted by them; a null equals a
    null), and the row count last."""
    size = table.num_rows
    first = np.zeros(size, dtype=bool)
    first[:1] = True
    for key in keys:
        column = table[key].combine_chunks()
        a, b = column[1:], column[:-1]
        differ = pc.fill_null(pc.not_equal(a, b), False)
        differ = pc.or_(differ, pc.xor(pc.is_null(a), pc.is_null(b)))
        first[1:] |= differ.to_numpy(zero_copy_only=False)
    return np.append(np.flatnonzero(first), size)


def _merge(
    group: np.ndarray, codes: np.ndarray, counts: np.ndarray, qs: Sequence[float]
) -> tuple[list[np.ndarray], np.ndarray]:
    """Quantiles of many histograms at once: ``group`` numbers (0, 1, ...) the
    histogram each (bucket ``code``, ``count``) belongs to. Returns, per ``q``, the
    bucket code of each group's value of rank :func:`rank`, and each group's count."""
    groups = int(group[-1]) + 1 if len(group) else 0
    order = np.lexsort((codes, group))
    cumulative = np.cumsum(counts[order])
    n = np.bincount(group, weights=counts, minlength=groups).astype(np.int64)
    before = np.concatenate([[0], np.cumsum(n)[:-1]])
    found = []
    for q in qs:
        wanted = np.maximum(1, np.ceil(q * n - 1e-9)).astype(np.int64)
        at = np.searchsorted(cumulative, before + wanted)
        at = np.minimum(at, max(len(order) - 1, 0))
        found.append(codes[order][at] if len(order) else np.zeros(groups, dtype=np.int64))
    return found, n


def _values(found: np.ndarray) -> np.ndarray:
    """:func:`value` of many codes."""
    magnitude = np.abs(found.astype(np.int64)) - OFFSET
    shown = 2.0 * np.power(GAMMA, magnitude.astype(np.float64)) / (GAMMA + 1.0)
    return np.where(found == 0, 0.0, np.where(found > 0, shown, -shown))
