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

from agiledart.analysis.sketch import codes, group_starts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CURVE_POINTS",
    "FOLDED",
    "PARTIALS",
    "Folder",
    "Partial",
    "Windows",
    "curve_widths",
    "merged",
    "partial_frame",
]

#: record types whose sections read only partial aggregates (their records are not kept)
FOLDED = frozenset({"tuple", "shuffle", "delivery"})
#: the regret curve's points per series, at most (:func:`curve_widths`)
CURVE_POINTS = 1000
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
    compute: Callable[[pa.Table, Windows, int], pa.Table] = field(repr=False)
    finish: Callable[[pa.Table], pa.Table] | None = field(default=None, repr=False)
    """What a piece's merged rows become before they are written (default: as they are)."""
    stored: pa.Schema | None = None
    """The schema of the rows written (default :attr:`schema`)."""

    @property
    def written(self) -> pa.Schema:
        return self.schema if self.stored is None else self.stored


def _graph(table: pa.Table) -> pa.Array:
    return pc.fill_null(table["graph"], "")


def _latency(table: pa.Table, windows: Windows, run: int) -> pa.Table:
    window = _window(table["ts"].to_numpy(), windows)
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


def _latency_sinks(table: pa.Table, windows: Windows, run: int) -> pa.Table:
    latency = table["latency_ms"]
    keyed = pa.table(
        {
            "app": table["app"],
            "sink": table["sink"],
            "code": codes(latency.to_numpy()),
            "latency_ms": latency,
        }
    )
    out = keyed.group_by(["app", "sink", "code"], use_threads=False).aggregate(
        [("latency_ms", "count"), ("latency_ms", "sum"), ("latency_ms", "max")]
    )
    return out.rename_columns(
        {"latency_ms_count": "n", "latency_ms_sum": "sum", "latency_ms_max": "max"}
    )


def _histograms(rows: pa.Table) -> pa.Table:
    """A piece's ``latency`` rows (one per app, sink, window and bucket) as one row per
    app, sink and window, its histogram in two lists (``codes``, ascending, and their
    ``counts``) next to its count, sum and maximum: a 64 MB piece holds a few hundred
    latencies per window in about half as many buckets, and Spark moves a few hundred
    rows of lists faster than the hundred thousand rows they hold."""
    keys = ["app", "sink", "window"]
    if not rows.num_rows:
        return HISTOGRAMS.empty_table()
    ordered = rows.sort_by([(name, "ascending") for name in (*keys, "code")]).combine_chunks()
    bounds = group_starts(ordered, keys)
    starts = bounds[:-1]
    counts = ordered["n"].to_numpy()
    offsets = pa.array(bounds.astype(np.int32))
    return pa.table(
        {
            **{name: ordered[name].take(starts) for name in keys},
            "n": np.add.reduceat(counts, starts),
            "sum": np.add.reduceat(ordered["sum"].to_numpy(), starts),
            "max": np.maximum.reduceat(ordered["max"].to_numpy(), starts),
            **{
                name: pa.ListArray.from_arrays(
                    offsets, ordered[column].combine_chunks().cast(pa.int32())
                )
                for name, column in (("codes", "code"), ("counts", "n"))
            },
        },
        schema=HISTOGRAMS,
    )


def _delay(table: pa.Table, windows: Windows, run: int) -> pa.Table:
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


def _series(table: pa.Table, windows: Windows, run: int) -> pa.Table:
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


def curve_widths(k: np.ndarray) -> np.ndarray:
    """The width of the regret curve's bucket of each packet index ``k`` (int64): the
    smallest power of two ``w`` with ``ceil(k / w) <= CURVE_POINTS``. A series whose
    largest ``k`` is ``K`` is cut into buckets of ``curve_widths(K)`` (at most
    :data:`CURVE_POINTS` of them); a smaller ``k`` has a width that divides it, so its
    bucket lies whole in one of the series' buckets."""
    k = np.asarray(k, dtype=np.int64)
    need = np.maximum(k, 1)
    exponent = np.clip(np.ceil(np.log2(need / CURVE_POINTS)), 0, 62).astype(np.int64)
    # the float logarithm can be one off at the edges: settle it with integers
    lower = np.maximum(exponent - 1, 0)
    exponent = np.where((exponent > 0) & (need <= CURVE_POINTS * (1 << lower)), lower, exponent)
    exponent = np.where(need > CURVE_POINTS * (1 << exponent), exponent + 1, exponent)
    widths: np.ndarray = np.left_shift(np.int64(1), exponent)
    return widths


def _curve(table: pa.Table, windows: Windows, run: int) -> pa.Table:
    """Per series and bucket of ``k`` (:func:`curve_widths`; ``bucket = ceil(k / width)``):
    the packets that carry ``optimal_ms``, their sums of regret, delay and optimal delay,
    and their largest ``k``."""
    scored = table.filter(pc.is_valid(table["optimal_ms"]))
    if not scored.num_rows:
        return PARTIALS["curve"].schema.empty_table()
    k = scored["k"].to_numpy()
    width = curve_widths(k)
    keyed = pa.table(
        {
            **{name: scored[name] for name in SERIES if name != "graph"},
            "graph": _graph(scored),
            "width": width,
            "bucket": -((-k) // width),
            "k": k,
            "delay_ms": scored["delay_ms"],
            "optimal_ms": scored["optimal_ms"],
            "regret": pc.subtract(scored["delay_ms"], scored["optimal_ms"]),
        }
    )
    out = keyed.group_by([*SERIES, "width", "bucket"], use_threads=False).aggregate(
        [
            ("k", "count"),
            ("k", "max"),
            ("regret", "sum"),
            ("delay_ms", "sum"),
            ("optimal_ms", "sum"),
        ]
    )
    return out.rename_columns(
        {
            "k_count": "packets",
            "k_max": "k",
            "regret_sum": "regret_sum",
            "delay_ms_sum": "delay_sum",
            "optimal_ms_sum": "optimal_sum",
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


def _paths(table: pa.Table, windows: Windows, run: int) -> pa.Table:
    keyed = pa.table(
        {
            **{name: table[name] for name in SERIES if name != "graph"},
            "graph": _graph(table),
            "path": _path_text(table["path"]),
        }
    )
    out = keyed.group_by([*SERIES, "path"], use_threads=False).aggregate([([], "count_all")])
    return out.rename_columns({"count_all": "packets"})


def _attempts(table: pa.Table, windows: Windows, run: int) -> pa.Table:
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


INSTANCE = ("app", "operator", "peer")


def _window(ts: np.ndarray, windows: Windows) -> np.ndarray:
    return np.floor((ts - windows.t0_ms) / windows.window_ms).astype(np.int64)


def _samples(table: pa.Table) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """``opstats`` samples in order (per instance, by ``ts``; ties in the order read),
    whether each starts its instance's samples, and whether each ends them."""
    ordered = table.take(
        pc.sort_indices(table, sort_keys=[(name, "ascending") for name in (*INSTANCE, "ts")])
    ).combine_chunks()
    n = ordered.num_rows
    first = np.zeros(n, dtype=bool)
    first[group_starts(ordered, INSTANCE)[:-1]] = True
    last = np.ones(n, dtype=bool)
    last[:-1] = first[1:]
    return ordered, first, last


def _increase(counter: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each sample's increase of ``counter`` since the sample before it (0 for the
    first of its instance): the growth, or the new value where it went down."""
    before = np.concatenate([counter[:1], counter[:-1]])
    grown = np.where(counter >= before, counter - before, counter)
    return np.where(first, 0, grown)


def _rates(table: pa.Table, windows: Windows, run: int) -> pa.Table:
    """Per operator instance and window, the samples of this batch: their counter
    increases within the batch (a sample's increase since the instance's sample
    before it in the batch; the batch's first sample of an instance adds nothing here:
    its increase is the ``runs`` partial's), queue and utilization sums."""
    ordered, first, _ = _samples(table)
    counters = {name: ordered[name].to_numpy() for name in ("records_in", "records_out")}
    utilization = ordered["utilization"]
    keyed = pa.table(
        {
            **{name: ordered[name] for name in INSTANCE},
            "window": _window(ordered["ts"].to_numpy(), windows),
            "d_in": _increase(counters["records_in"], first),
            "d_out": _increase(counters["records_out"], first),
            "queue": ordered["queue"],
            "utilization": utilization,
        }
    )
    out = keyed.group_by([*INSTANCE, "window"], use_threads=False).aggregate(
        [
            ("d_in", "sum"),
            ("d_out", "sum"),
            ([], "count_all"),
            ("queue", "sum"),
            ("utilization", "sum", pc.ScalarAggregateOptions(min_count=0)),
            ("utilization", "count"),
        ]
    )
    return out.rename_columns(
        {
            "d_in_sum": "d_in",
            "d_out_sum": "d_out",
            "count_all": "samples",
            "queue_sum": "queue_sum",
            "utilization_sum": "utilization_sum",
            "utilization_count": "utilization_n",
        }
    )


def _runs(table: pa.Table, windows: Windows, run: int) -> pa.Table:
    """Per operator instance, the first and last of this batch's samples (a *run*:
    ``run`` numbers the batch), from which Spark adds the increase of each run's first
    sample since the run before it (:mod:`~agiledart.analysis.metrics`), and the
    counters' largest values."""
    ordered, first, last = _samples(table)
    heads, tails = ordered.filter(first), ordered.filter(last)
    return pa.table(
        {
            **{name: heads[name] for name in INSTANCE},
            "run": np.full(heads.num_rows, run, dtype=np.int64),
            "first_ts": heads["ts"],
            "first_window": _window(heads["ts"].to_numpy(), windows),
            "first_in": heads["records_in"],
            "first_out": heads["records_out"],
            "last_ts": tails["ts"],
            "last_in": tails["records_in"],
            "last_out": tails["records_out"],
            **_maxima(ordered, first),
        }
    )


def _maxima(ordered: pa.Table, first: np.ndarray) -> dict[str, np.ndarray]:
    """Each instance's largest counters (``ordered`` as :func:`_samples` gives it)."""
    starts = np.flatnonzero(first)
    return {
        f"max_{name[8:]}": np.maximum.reduceat(ordered[name].to_numpy(), starts)
        for name in ("records_in", "records_out")
    }


def _schema(**columns: pa.DataType) -> pa.Schema:
    return pa.schema(list(columns.items()))


_S, _L, _D = pa.string(), pa.int64(), pa.float64()

#: the ``latency`` partial as written: a row per app, sink and window (:func:`_histograms`)
HISTOGRAMS = _schema(
    app=_S,
    sink=_S,
    window=_L,
    n=_L,
    sum=_D,
    max=_D,
    codes=pa.list_(pa.int32()),
    counts=pa.list_(pa.int32()),
)

#: every partial aggregate, by name
PARTIALS: dict[str, Partial] = {
    "latency": Partial(
        "tuple",
        ("app", "sink", "window", "code"),
        {"n": "sum", "sum": "sum", "max": "max"},
        _schema(app=_S, sink=_S, window=_L, code=_L, n=_L, sum=_D, max=_D),
        _latency,
        finish=_histograms,
        stored=HISTOGRAMS,
    ),
    "latency_sinks": Partial(
        "tuple",
        ("app", "sink", "code"),
        {"n": "sum", "sum": "sum", "max": "max"},
        _schema(app=_S, sink=_S, code=_L, n=_L, sum=_D, max=_D),
        _latency_sinks,
    ),
    "rates": Partial(
        "opstats",
        (*INSTANCE, "window"),
        {
            "d_in": "sum",
            "d_out": "sum",
            "samples": "sum",
            "queue_sum": "sum",
            "utilization_sum": "sum",
            "utilization_n": "sum",
        },
        _schema(
            app=_S,
            operator=_S,
            peer=_S,
            window=_L,
            d_in=_L,
            d_out=_L,
            samples=_L,
            queue_sum=_L,
            utilization_sum=_D,
            utilization_n=_L,
        ),
        _rates,
    ),
    "runs": Partial(
        "opstats",
        (*INSTANCE, "run"),
        {
            "first_ts": "min",
            "first_window": "min",
            "first_in": "min",
            "first_out": "min",
            "last_ts": "max",
            "last_in": "max",
            "last_out": "max",
            "max_in": "max",
            "max_out": "max",
        },
        _schema(
            app=_S,
            operator=_S,
            peer=_S,
            run=_L,
            first_ts=_D,
            first_window=_L,
            first_in=_L,
            first_out=_L,
            last_ts=_D,
            last_in=_L,
            last_out=_L,
            max_in=_L,
            max_out=_L,
        ),
        _runs,
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
    "curve": Partial(
        "delivery",
        (*SERIES, "width", "bucket"),
        {
            "packets": "sum",
            "k": "max",
            "regret_sum": "sum",
            "delay_sum": "sum",
            "optimal_sum": "sum",
        },
        _schema(
            policy=_S,
            graph=_S,
            origin=_S,
            dest=_S,
            width=_L,
            bucket=_L,
            packets=_L,
            k=_L,
            regret_sum=_D,
            delay_sum=_D,
            optimal_sum=_D,
        ),
        _curve,
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


#: runs (batches of records) a piece can have, at most: run numbers are unique per piece
RUNS_PER_PIECE = 1 << 20


class Folder:
    """One piece's partial aggregates, batch by batch of records (a reader task's):
    piece ``index``'s batches are the runs ``index * RUNS_PER_PIECE + n``."""

    def __init__(self, windows: Windows, index: int = 0) -> None:
        self.windows = windows
        self._held: dict[str, list[pa.Table]] = {}
        self._run = index * RUNS_PER_PIECE

    def add(self, kind: str, records: pa.Table) -> None:
        if not records.num_rows:
            return
        self._run += 1
        for name, partial in PARTIALS.items():
            if partial.kind == kind:
                self._held.setdefault(name, []).append(
                    partial.compute(records, self.windows, self._run)
                )

    def write(self, parts: Path, index: int) -> None:
        """Write the piece's partials under ``parts/partials/<name>/``."""
        import pyarrow.parquet as pq

        for name, tables in self._held.items():
            folder = parts / FOLDER / name
            folder.mkdir(parents=True, exist_ok=True)
            partial = PARTIALS[name]
            rows = _combine(partial, tables)
            pq.write_table(
                rows if partial.finish is None else partial.finish(rows),
                folder / f"part-{index:06d}.parquet",
                compression="none",
                write_statistics=False,
            )
        self._held = {}


def _ddl(schema: pa.Schema) -> str:
    spark = {
        pa.string(): "string",
        pa.int64(): "bigint",
        pa.float64(): "double",
        pa.list_(pa.int32()): "array<int>",
    }
    return ", ".join(f"`{f.name}` {spark[f.type]}" for f in schema)


def partial_frame(spark: SparkSession, parts: Path, name: str) -> DataFrame:
    """The partial rows of ``name`` that every piece wrote (as they are, unmerged)."""
    return spark.read.schema(_ddl(PARTIALS[name].written)).parquet(str(parts / FOLDER / name))


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
