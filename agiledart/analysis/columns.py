"""Group-by over Arrow columns with numpy: what the analysis's tables are computed with.

Theory of operation: a table groups rows by key columns and aggregates value columns
per group. :func:`groups` numbers the distinct keys (:class:`Groups`): every key column
is dictionary-encoded (a null is a key value of its own, as in SQL's ``GROUP BY``), the
codes are combined into one integer per row and the integers present are numbered
densely. Aggregates are then numpy reductions over the group numbers: ``bincount`` for
counts, sums and means, ``reduceat`` over the rows partitioned by group for extremes,
and each group's values sorted for exact percentiles (:func:`percentile`). A partition
by group sorts one 64-bit integer per row (the group number above the row's index), which
numpy does several times faster than an argsort or a lexsort of the rows.

Aggregates skip null values, as SQL's do: a group whose values are all null has a null
mean, extreme or percentile (``None`` in the rows). Results come out as Python values
(``int``, ``float``, ``str``, ``None``), in rows ordered by :func:`ordered`: ascending
with nulls first, as Spark orders.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from agiledart.analysis.parse import kind_schema

__all__ = [
    "Groups",
    "Source",
    "floats",
    "groups",
    "join_items",
    "joined",
    "ordered",
    "partition",
    "percentile",
    "sorted_rows",
]

#: an Arrow array (chunked or not) or a numpy array (pyarrow has no type hints)
Column: TypeAlias = Any
Rows: TypeAlias = list[tuple[Any, ...]]

#: above this many possible key combinations the present ones are found by sorting
_DENSE = 1 << 24


@dataclass(frozen=True)
class Source:
    """Where one analysis's records are and what the reader learned of them: what a
    section's job needs (it is sent to Spark's Python workers, so it is small)."""

    parts: str
    """``<type>/part-NNNNNN.arrow``: the valid records of each type (Arrow IPC files)."""
    counts: dict[str, int]
    writer_peers: list[str]
    t0_ms: float | None
    t1_ms: float | None
    window_ms: float

    def has(self, kind: str) -> bool:
        return self.counts.get(kind, 0) > 0

    def table(self, kind: str) -> pa.Table:
        """Every valid ``kind`` record, memory-mapped, with the columns the reader keeps
        (:func:`~agiledart.analysis.parse.kind_schema`), none when there are none."""
        files = sorted(Path(self.parts, kind).glob("part-*.arrow"))
        tables = [ipc.open_file(pa.memory_map(str(f))).read_all() for f in files]
        return pa.concat_tables(tables) if tables else kind_schema(kind).empty_table()

    def seconds(self, ts: Column) -> np.ndarray:
        """Seconds since the trace's first record."""
        return (floats(ts) - (self.t0_ms or 0.0)) / 1000.0

    def windows(self, ts: Column) -> np.ndarray:
        """The window index of each ``ts``, counted from the trace's first record."""
        return np.floor((floats(ts) - (self.t0_ms or 0.0)) / self.window_ms).astype(np.int64)


# -- columns -------------------------------------------------------------------------


def floats(column: Column) -> np.ndarray:
    """A numeric column as float64, NaN for null."""
    if isinstance(column, np.ndarray):
        return column.astype(np.float64, copy=False)
    values = _array(column).cast(pa.float64()).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float64)


def _array(column: Column) -> pa.Array:
    """An Arrow column as one array (a chunked one's chunks combined)."""
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def joined(column: Column, separator: str) -> pa.Array:
    """A list-of-strings column as a string column, the items joined by ``separator``
    (null items skipped, as Spark's ``array_join``; a null list stays null)."""
    array = _array(column)
    if array.flatten().null_count:  # rare: Arrow would make the whole row null
        texts = [join_items(items, separator) for items in array.to_pylist()]
        return pa.array(texts, pa.string())
    return pc.binary_join(array, separator)


def join_items(items: list[Any] | None, separator: str) -> str | None:
    """One list joined as :func:`joined` joins a column's (null items skipped)."""
    return None if items is None else separator.join(x for x in items if x is not None)


def _py(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


# -- groups --------------------------------------------------------------------------


def _codes(column: Column) -> tuple[np.ndarray, list[Any]]:
    """Each row's code and the value of each code (null a value of its own)."""
    if isinstance(column, np.ndarray):
        if column.dtype.kind in "iu" and column.size:
            low, high = int(column.min()), int(column.max())
            if high - low < _DENSE:
                present = np.zeros(high - low + 1, dtype=bool)
                present[column - low] = True
                values = np.flatnonzero(present)
                renumber = np.cumsum(present) - 1
                return renumber[column - low], (values + low).tolist()
        values, inverse = np.unique(column, return_inverse=True)
        return inverse.astype(np.int64), values.tolist()
    encoded = pc.dictionary_encode(_array(column), null_encoding="encode")
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    return codes, encoded.dictionary.to_pylist()


@dataclass(frozen=True)
class Groups:
    """The groups of rows with equal keys: ``ids`` numbers each row's group (0 ..
    ``n`` - 1) and ``keys[i]`` is group ``i``'s key, a tuple of Python values."""

    ids: np.ndarray
    keys: list[tuple[Any, ...]]

    @property
    def n(self) -> int:
        return len(self.keys)

    def count(self, where: np.ndarray | None = None) -> np.ndarray:
        """Rows per group (those where ``where`` holds)."""
        ids = self.ids if where is None else self.ids[where]
        return np.bincount(ids, minlength=self.n)

    def sum(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group, the sum of the non-null values and how many there were."""
        valid = ~np.isnan(values)
        ids = self.ids[valid]
        return (
            np.bincount(ids, weights=values[valid], minlength=self.n),
            np.bincount(ids, minlength=self.n),
        )

    def mean(self, values: np.ndarray) -> list[float | None]:
        total, n = self.sum(values)
        return [float(t / c) if c else None for t, c in zip(total, n, strict=True)]

    def extreme(self, values: np.ndarray, ufunc: np.ufunc) -> list[Any]:
        """Per group, ``ufunc.reduce`` (``np.maximum``, ``np.minimum``) of the non-null
        values; None for a group without any."""
        valid = ~np.isnan(values)
        ids, kept = self.ids[valid], values[valid]
        out: list[Any] = [None] * self.n
        if not kept.size:
            return out
        order = partition(ids)
        ids, kept = ids[order], kept[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        for i, v in zip(ids[starts].tolist(), ufunc.reduceat(kept, starts).tolist(), strict=True):
            out[i] = v
        return out

    def last(self, values: Column, ts: np.ndarray) -> list[Any]:
        """Per group, the value at the row with the largest ``ts`` (Spark's ``max_by``)."""
        order = partition(self.ids, np.argsort(ts, kind="stable"))
        ids = self.ids[order]
        ends = np.flatnonzero(np.r_[ids[1:] != ids[:-1], True])
        picked = order[ends]
        got = _take(values, picked)
        out: list[Any] = [None] * self.n
        for i, v in zip(ids[ends].tolist(), got, strict=True):
            out[i] = v
        return out

    def sorted_values(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The non-null values sorted within each group, and where each group's values
        start in them (``n`` + 1 offsets)."""
        valid = ~np.isnan(values)
        ids, kept = self.ids[valid], values[valid]
        kept = kept[partition(ids)]
        sizes = np.bincount(ids, minlength=self.n)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            if end - start > 1:
                kept[start:end].sort()
        return kept, offsets


def groups(*columns: Column) -> Groups:
    """The groups of the rows by the values of ``columns`` (equally long)."""
    coded = [_codes(c) for c in columns]
    if not coded:
        msg = "groups need at least one key column"
        raise ValueError(msg)
    combined = np.zeros(len(coded[0][0]), dtype=np.int64)
    sizes: list[int] = []
    for codes, values in coded:
        size = max(1, len(values))
        combined = combined * size + codes
        sizes.append(size)
    total = math.prod(sizes)
    if total <= _DENSE:
        present = np.zeros(total, dtype=bool)
        present[combined] = True
        found = np.flatnonzero(present)
        ids = (np.cumsum(present) - 1)[combined]
    else:
        found, inverse = np.unique(combined, return_inverse=True)
        ids = inverse.astype(np.int64)
    keys: list[list[Any]] = [[] for _ in found]
    rest = found.copy()
    for (_, values), size in zip(reversed(coded), reversed(sizes), strict=True):
        rest, code = np.divmod(rest, size)
        for k, c in zip(keys, code.tolist(), strict=True):
            k.append(values[c])
    return Groups(ids=np.asarray(ids, dtype=np.int64), keys=[tuple(reversed(k)) for k in keys])


def partition(ids: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Row indices grouped by ``ids``, in row order within a group (or in ``order``, a
    permutation of the rows)."""
    if order is None:
        index = np.arange(len(ids), dtype=np.int64)
    else:
        index = np.asarray(order, dtype=np.int64)
        ids = ids[index]
    if len(ids) >= 1 << 32:
        return index[np.argsort(ids, kind="stable")]
    key = (ids.astype(np.int64) << 32) | np.arange(len(ids), dtype=np.int64)
    rows: np.ndarray = np.sort(key) & 0xFFFFFFFF
    return np.asarray(index[rows], dtype=np.int64)


def _take(values: Column, rows: np.ndarray) -> list[Any]:
    if isinstance(values, np.ndarray):
        return [_py(v) for v in values[rows].tolist()]
    return list(values.take(pa.array(rows)).to_pylist())


# -- percentiles and order -----------------------------------------------------------


def percentile(values: np.ndarray, start: int, end: int, q: float) -> float | None:
    """The exact ``q``-quantile of ``values[start:end]`` (sorted): the value at position
    ``q * (n - 1)``, interpolated linearly between the two closest ranks, as Spark's
    ``percentile`` and numpy's default method compute it; None when there are none."""
    n = end - start
    if n <= 0:
        return None
    position = (n - 1) * q
    lower, higher = math.floor(position), math.ceil(position)
    low, high = float(values[start + lower]), float(values[start + higher])
    if higher == lower or high == low:
        return low
    return (higher - position) * low + (position - lower) * high


def ordered(rows: Iterable[tuple[Any, ...]], *columns: int, descending: Sequence[int] = ()) -> Rows:
    """``rows`` sorted by the values at ``columns``: ascending with nulls first, or
    descending with nulls last for the columns in ``descending`` (numbers only)."""

    def key(row: tuple[Any, ...]) -> tuple[Any, ...]:
        out: list[Any] = []
        for c in columns:
            value = row[c]
            if c in descending:
                out.append((value is None, -value if value is not None else 0))
            else:
                out.append((value is not None, value if value is not None else 0))
        return tuple(out)

    return sorted(rows, key=key)


def sorted_rows(table: pa.Table, *keys: str) -> Rows:
    """The rows of ``table``, ascending by ``keys`` with nulls first (Arrow's sort: for
    the long logs, where sorting tuples in Python would cost seconds)."""
    if table.num_rows > 1 and keys:
        # nulls first: each key after whether it is null (false before true), which
        # every Arrow version sorts the same way
        by = pa.table({f"{i}{j}": c for i, k in enumerate(keys) for j, c in _null_first(table[k])})
        order = pc.sort_indices(by, sort_keys=[(name, "ascending") for name in by.column_names])
        table = table.take(order)
    columns = [[_py(v) for v in c.to_pylist()] for c in table.columns]
    return list(zip(*columns, strict=True)) if columns else []


def _null_first(column: pa.ChunkedArray) -> list[tuple[str, pa.ChunkedArray]]:
    if not column.null_count:
        return [("v", column)]
    return [("n", pc.is_valid(column)), ("v", column)]
