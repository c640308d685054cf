"""Partial aggregates of one piece's records, computed inside the reader's tasks.

Theory of operation: the largest record types are summed up where they are parsed. A
reader task (:func:`~agiledart.analysis.parse.write_piece`) hands every batch of valid
records it parsed to :meth:`Folder.add`, which aggregates them with Arrow's hash
``group_by`` per group key (counts, sums, maxima, and :mod:`~agiledart.analysis.sketch`
histograms: a count per bucket of values), and writes the result once per piece, a few
thousand rows where the piece held hundreds of thousands of records, as Parquet under
``<parts>/partials/<name>/``. Every aggregate is mergeable: the sections
(:mod:`~agiledart.analysis.metrics`, :mod:`~agiledart.analysis.routing`) add the
partial rows of all pieces up with a Spark ``groupBy`` (:func:`merged`), so no
section's records pass through one worker or the driver, and the records of
:data:`FOLDED` types are not written at all.

Windows are counted from the trace's first record, which no task knows while it reads;
the tasks use the reader's guess (:attr:`Windows.t0_ms`, the earliest record at the start
of each file) and the reader reads again with the true start in the rare trace whose
earliest record lies further in (:func:`~agiledart.analysis.reader.read_traces`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agiledart.analysis.sketch import codes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FOLDED", "PARTIALS", "Folder", "Partial", "Windows", "merged", "partial_frame"]

#: record types whose sections read only partial aggregates (their records are not kept)
FOLDED = frozenset({"tuple", "shuffle"})
#: where, under the reader's parts, the partial aggregates go
FOLDER = "partials"


@dataclass(frozen=True)
class Windows:
    """How the tasks number windows: ``floor((ts - t0_ms) / window_ms)``."""

    t0_ms: float
    window_ms: float


@dataclass(frozen=True)
class Partial:
    """One partial aggregate: of which record type, by which keys, and how its value
    columns merge (``sum`` or ``max``)."""

    kind: str
    keys: tuple[str, ...]
    values: dict[str, str]
    schema: pa.Schema
    compute: Callable[[pa.Table, Windows], pa.Table] = field(repr=False)


def _graph(table: pa.Table) -> pa.Array:
    return pc.fill_null(table["graph"], "")


def _latency(table: pa.Table, windows: Windows) -> pa.Table:
    ts = table["ts"].to_numpy()
    window = np.floor((ts - windows.t0_ms) / windows.window_ms).astype(np.int64)
    latency = table["latency_ms"]
    keyed = pa.table(
        {
            "app": table["app"],
            "sink": table["sink"],
            "window": window,
            "code": codes(latency.to_numpy()),
            "latency_ms": latency,
        }
    )
    out = keyed.group_by(["app", "sink", "window", "code"], use_threads=False).aggregate(
        [("latency_ms", "count"), ("latency_ms", "sum"), ("latency_ms", "max")]
    )
    return out.rename_columns(
        {"latency_ms_count": "n", "latency_ms_sum": "sum", "latency_ms_max": "max"}
    )


def _delay(table: pa.Table, windows: Windows) -> pa.Table:
    keyed = pa.table(
        {
            "policy": table["policy"],
            "graph": _graph(table),
            "code": codes(table["delay_ms"].to_numpy()),
            "delay_ms": table["delay_ms"],
        }
    )
    out = keyed.group_by(["policy", "graph", "code"], use_threads=False).aggregate(
        [("delay_ms", "count")]
    )
    return out.rename_columns({"delay_ms_count": "n"})


SERIES = ("policy", "graph", "origin", "dest")


def _series(table: pa.Table, windows: Windows) -> pa.Table:
    keyed = pa.table(
        {
            "policy": table["policy"],
            "graph": _graph(table),
            "origin": table["origin"],
            "dest": table["dest"],
            "delay_ms": table["delay_ms"],
            "optimal_ms": table["optimal_ms"],
            "regret": pc.subtract(table["delay_ms"], table["optimal_ms"]),
            "attempts": table["attempts"],
        }
    )
    out = keyed.group_by(list(SERIES), use_threads=False).aggregate(
        [
            ("delay_ms", "count"),
            ("delay_ms", "sum"),
            ("optimal_ms", "sum"),
            ("optimal_ms", "count"),
            ("regret", "sum"),
            ("attempts", "sum"),
        ]
    )
    return out.rename_columns(
        {
            "delay_ms_count": "packets",
            "delay_ms_sum": "delay_sum",
            "optimal_ms_sum": "optimal_sum",
            "optimal_ms_count": "optimal_n",
            "regret_sum": "regret_sum",
            "attempts_sum": "attempts_sum",
        }
    )


def _path_text(paths: pa.ChunkedArray) -> pa.Array:
    """Each path's nodes joined by `` > `` (null nodes skipped, as Spark's
    ``array_join`` skips them)."""
    joined = pc.binary_join(paths, " > ")
    if joined.null_count == 0:
        return joined
    texts = [
        " > ".join(n for n in nodes if n is not None) if nodes is not None else None
        for nodes in paths.to_pylist()
    ]
    return pa.array(texts, pa.string())


def _paths(table: pa.Table, windows: Windows) -> pa.Table:
    keyed = pa.table(
        {
            **{name: table[name] for name in SERIES if name != "graph"},
            "graph": _graph(table),
            "path": _path_text(table["path"]),
        }
    )
    out = keyed.group_by([*SERIES, "path"], use_threads=False).aggregate([([], "count_all")])
    return out.rename_columns({"count_all": "packets"})


def _attempts(table: pa.Table, windows: Windows) -> pa.Table:
    keyed = table.select(["policy", "hop", "node", "next", "outcome", "delay_ms"]).append_column(
        "graph", _graph(table)
    )
    keys = ["policy", "graph", "hop", "node", "next", "outcome"]
    out = keyed.group_by(keys, use_threads=False).aggregate(
        [([], "count_all"), ("delay_ms", "sum"), ("delay_ms", "count")]
    )
    return out.rename_columns(
        {"count_all": "attempts", "delay_ms_sum": "delay_sum", "delay_ms_count": "delays"}
    )


def _schema(**columns: pa.DataType) -> pa.Schema:
    return pa.schema(list(columns.items()))


_S, _L, _D = pa.string(), pa.int64(), pa.float64()

#: every partial aggregate, by name
PARTIALS: dict[str, Partial] = {
    "latency": Partial(
        "tuple",
        ("app", "sink", "window", "code"),
        {"n": "sum", "sum": "sum", "max": "max"},
        _schema(app=_S, sink=_S, window=_L, code=_L, n=_L, sum=_D, max=_D),
        _latency,
    ),
    "delay": Partial(
        "delivery",
        ("policy", "graph", "code"),
        {"n": "sum"},
        _schema(policy=_S, graph=_S, code=_L, n=_L),
        _delay,
    ),
    "series": Partial(
        "delivery",
        SERIES,
        {
            "packets": "sum",
            "delay_sum": "sum",
            "optimal_sum": "sum",
            "optimal_n": "sum",
            "regret_sum": "sum",
            "attempts_sum": "sum",
        },
        _schema(
            policy=_S,
            graph=_S,
            origin=_S,
            dest=_S,
            packets=_L,
            delay_sum=_D,
            optimal_sum=_D,
            optimal_n=_L,
            regret_sum=_D,
            attempts_sum=_L,
        ),
        _series,
    ),
    "paths": Partial(
        "delivery",
        (*SERIES, "path"),
        {"packets": "sum"},
        _schema(policy=_S, graph=_S, origin=_S, dest=_S, path=_S, packets=_L),
        _paths,
    ),
    "attempts": Partial(
        "shuffle",
        ("policy", "graph", "hop", "node", "next", "outcome"),
        {"attempts": "sum", "delay_sum": "sum", "delays": "sum"},
        _schema(
            policy=_S,
            graph=_S,
            hop=_L,
            node=_S,
            next=_S,
            outcome=_S,
            attempts=_L,
            delay_sum=_D,
            delays=_L,
        ),
        _attempts,
    ),
}


def _combine(partial: Partial, tables: list[pa.Table]) -> pa.Table:
    """One table of ``tables`` (partials of one piece), merged per key."""
    whole = pa.concat_tables([t.select(partial.schema.names).cast(partial.schema) for t in tables])
    if len(tables) == 1:
        return whole
    out = whole.group_by(list(partial.keys), use_threads=False).aggregate(
        [(name, how) for name, how in partial.values.items()]
    )
    names = {f"{name}_{how}": name for name, how in partial.values.items()}
    return out.rename_columns(names).select(partial.schema.names).cast(partial.schema)


class Folder:
    """One piece's partial aggregates, batch by batch of records (a reader task's)."""

    def __init__(self, windows: Windows) -> None:
        self.windows = windows
        self._held: dict[str, list[pa.Table]] = {}

    def add(self, kind: str, records: pa.Table) -> None:
        for name, partial in PARTIALS.items():
            if partial.kind == kind and records.num_rows:
                self._held.setdefault(name, []).append(partial.compute(records, self.windows))

    def write(self, parts: Path, index: int) -> None:
        """Write the piece's partials under ``parts/partials/<name>/``."""
        import pyarrow.parquet as pq

        for name, tables in self._held.items():
            folder = parts / FOLDER / name
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(
                _combine(PARTIALS[name], tables),
                folder / f"part-{index:06d}.parquet",
                compression="none",
                write_statistics=False,
            )
        self._held = {}


def _ddl(schema: pa.Schema) -> str:
    spark = {pa.string(): "string", pa.int64(): "bigint", pa.float64(): "double"}
    return ", ".join(f"`{f.name}` {spark[f.type]}" for f in schema)


def partial_frame(spark: SparkSession, parts: Path, name: str) -> DataFrame:
    """The partial rows of ``name`` that every piece wrote (as they are, unmerged)."""
    return spark.read.schema(_ddl(PARTIALS[name].schema)).parquet(str(parts / FOLDER / name))


def merged(
    spark: SparkSession, parts: Path, name: str, keys: tuple[str, ...] | None = None
) -> DataFrame:
    """The partial rows of ``name`` merged over all pieces per ``keys`` (default: its
    own keys), by Spark."""
    from pyspark.sql import functions as F

    partial = PARTIALS[name]
    how = {"sum": F.sum, "max": F.max}
    return (
        partial_frame(spark, parts, name)
        .groupBy(*(partial.keys if keys is None else keys))
        .agg(*(how[op](column).alias(column) for column, op in partial.values.items()))
    )
