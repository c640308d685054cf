"""Reading a trace directory into Spark, counting the lines that do not fit the schema.

Theory of operation: Spark's JSON source reads every trace file once (``.ndjson.gz``
through Hadoop's gzip codec; a gzip file cut short, as a killed peer leaves it, is read
up to the cut), skips blank lines and parses each line against the union of the record
schemas (:mod:`agiledart.analysis.schemas`; explicit, nothing inferred) in PERMISSIVE
mode, which keeps what it could parse and puts the text of a line that does not fit
into a corrupt-record column. (That is ``from_json`` over the text, done inside the
reader, where it measured twice as fast as ``from_json`` on ``spark.read.text``.) Each
line gets one verdict, kept as the integer column ``kind``:

* ``not_json`` (-1): not a JSON object (a truncated line, garbage, an array);
* ``unknown_type`` (-2): a JSON object whose ``type`` is missing or not a record type;
* ``unsupported_version`` (-3): ``v`` is not ``SCHEMA_VERSION``;
* ``bad_fields`` (-4): a field of the wrong type, or a field that may not be null missing;
* a valid record of the i-th record type (i >= 1).

Only ``kind``, ``ts``, ``peer`` and the analyzed fields, in their slots, are cached
(:data:`~agiledart.analysis.schemas.LAYOUT`), uncompressed (compressing costs more
time than the analysis saves), each partition sorted by ``kind``, so a job about one
record type skips the cached batches of the others by their statistics. A malformed
line also keeps its file and text, for the report. The first job counts lines per
verdict (and malformed lines per file) in one pass; malformed lines are counted,
reported and skipped, they never stop an analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from urllib.parse import unquote

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from agiledart.analysis.errors import AnalysisUsageError
from agiledart.analysis.schemas import (
    CORRUPT,
    LAYOUT,
    RECORD_TYPES,
    SCHEMA_VERSION,
    SLOTS,
    required_fields,
    union_schema,
)
from agiledart.traces.writer import trace_files

__all__ = ["REASONS", "Malformed", "Traces", "json_lines", "kind_code", "read_traces"]

#: verdicts of malformed lines, -1, -2, ... in the ``kind`` column
REASONS = ("not_json", "unknown_type", "unsupported_version", "bad_fields")
_EXAMPLES = 10
_EXAMPLE_CHARS = 200


def kind_code(kind: str) -> int:
    """The ``kind`` column's value for valid records of type ``kind``."""
    return RECORD_TYPES.index(kind) + 1


@dataclass(frozen=True)
class Malformed:
    """The lines that were skipped, by reason and by file, with a few examples."""

    counts: dict[str, int]
    by_file: list[tuple[str, str, int]]
    """(file, reason, lines)"""
    examples: list[tuple[str, str, str]]
    """(file, reason, the line's start)"""

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class Traces:
    """The valid records of one trace directory, cached in Spark."""

    spark: SparkSession
    directory: Path
    files: list[Path]
    frame: DataFrame
    """Valid records: ``kind``, ``ts``, ``peer`` and the slots of the layout."""
    counts: dict[str, int]
    """Valid records per type."""
    writer_peers: list[str]
    """The peers that wrote valid records."""
    malformed: Malformed
    t0_ms: float | None
    """The earliest ``ts`` of a valid record: time zero of every timeline."""
    t1_ms: float | None
    _cached: list[DataFrame] = field(default_factory=list, repr=False)

    @property
    def lines(self) -> int:
        """Non-blank lines read."""
        return sum(self.counts.values()) + self.malformed.total

    def has(self, kind: str) -> bool:
        return self.counts.get(kind, 0) > 0

    def records(self, kind: str) -> DataFrame:
        """The valid ``kind`` records: ``type``, ``ts``, ``peer`` and the analyzed fields."""
        own = [F.col(slot).alias(name) for name, slot in LAYOUT[kind].items()]
        return self.frame.where(F.col("kind") == kind_code(kind)).select(
            F.lit(kind).alias("type"), "ts", "peer", *own
        )

    def release(self) -> None:
        for frame in self._cached:
            frame.unpersist()
        self._cached.clear()


def _required_ok(code: Column) -> Column:
    """True when the line's record type has every field it may not leave null."""
    rule: Column | None = None
    for i, kind in enumerate(RECORD_TYPES, start=1):
        present = reduce(
            lambda a, b: a & b, (F.col(name).isNotNull() for name in required_fields(kind))
        )
        rule = F.when(code == i, present) if rule is None else rule.when(code == i, present)
    assert rule is not None
    return rule.otherwise(F.lit(True))


def _kind(code: Column) -> Column:
    """The line's verdict from its type's ``code`` (0 unknown): that code, or minus the
    number of a reason. A line Spark could not parse and got no ``type`` from is
    ``not_json`` here; :func:`_refined` tells the JSON objects among them apart later,
    on the malformed lines only (``from_json`` has no generated code, and would take
    the whole per-line projection out of Spark's whole-stage code generation)."""
    corrupt = F.col(CORRUPT).isNotNull()
    return (
        F.when(corrupt & F.col("type").isNull(), F.lit(-1))
        .when(code.isNull() | (code == 0), F.lit(-2))
        .when(F.col("v") != SCHEMA_VERSION, F.lit(-3))
        .when(corrupt | ~_required_ok(code), F.lit(-4))
        .otherwise(code)
    )


def _refined(kind: Column, line: Column) -> Column:
    """``not_json`` lines that are JSON objects after all: ``unknown_type``."""
    as_object = F.from_json(line, T.MapType(T.StringType(), T.StringType()))
    return F.when((kind == -1) & as_object.isNotNull(), F.lit(-2)).otherwise(kind)


def _slot(slot: str) -> Column:
    """The value of cached column ``slot``: the field of the line's type stored there
    (compared by the integer ``kind``, far cheaper per line than the type's name)."""
    value: Column | None = None
    for kind, fields in LAYOUT.items():
        for name, where in fields.items():
            if where == slot:
                is_kind = F.col("kind") == kind_code(kind)
                value = (
                    F.when(is_kind, F.col(name))
                    if value is None
                    else value.when(is_kind, F.col(name))
                )
    assert value is not None
    return value.alias(slot)


def _bad_line(names: list[str]) -> Column:
    """``file`` newline ``text`` of a malformed line (text rebuilt if Spark kept none)."""
    text = F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*names)))
    return F.concat(F.input_file_name(), F.lit("\n"), text)


def json_lines(spark: SparkSession, files: Sequence[Path]) -> DataFrame:
    """Every line of ``files`` parsed against the union schema (PERMISSIVE: a line that
    does not fit keeps its text in :data:`~agiledart.analysis.schemas.CORRUPT`)."""
    return (
        spark.read.schema(union_schema())
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("ignoreCorruptFiles", "true")
        .json([str(f) for f in files])
    )


def read_traces(spark: SparkSession, directory: Path) -> Traces:
    """Parse every trace file under ``directory`` (``<peer>/trace-NNNNNN.ndjson[.gz]``)."""
    directory = Path(directory)
    if not directory.is_dir():
        msg = f"{directory} is not a directory"
        raise AnalysisUsageError(msg)
    files = trace_files(directory)
    if not files:
        msg = f"no trace files (<peer>/trace-NNNNNN.ndjson[.gz]) under {directory}"
        raise AnalysisUsageError(msg)
    parsed = json_lines(spark, files)
    names = [name for name in parsed.columns if name != CORRUPT]
    code = F.array_position(F.array(*(F.lit(k) for k in RECORD_TYPES)), F.col("type"))
    judged = (
        parsed.select(code.cast("int").alias("code"), *names, CORRUPT)
        .select(_kind(F.col("code")).alias("kind"), *names, CORRUPT)
        .select(
            "kind",
            "ts",
            "peer",
            *(_slot(slot) for slot in SLOTS),
            F.when(F.col("kind") < 0, _bad_line(names)).alias("bad"),
        )
        .sortWithinPartitions("kind")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    tally = (
        judged.groupBy("kind", "peer")
        .agg(F.count(F.lit(1)).alias("n"), F.min("ts").alias("t0"), F.max("ts").alias("t1"))
        .collect()
    )
    counts: dict[str, int] = {}
    writers: set[str] = set()
    t0: float | None = None
    t1: float | None = None
    for row in tally:
        if row["kind"] > 0:
            kind = RECORD_TYPES[row["kind"] - 1]
            counts[kind] = counts.get(kind, 0) + row["n"]
            writers.add(row["peer"])
            t0 = row["t0"] if t0 is None else min(t0, row["t0"])
            t1 = row["t1"] if t1 is None else max(t1, row["t1"])
    bad = sum(row["n"] for row in tally if row["kind"] < 0)
    return Traces(
        spark=spark,
        directory=directory,
        files=files,
        frame=judged.where(F.col("kind") > 0).drop("bad"),
        counts=counts,
        writer_peers=sorted(writers),
        malformed=_malformed(judged, directory)
        if bad
        else Malformed(dict.fromkeys(REASONS, 0), [], []),
        t0_ms=t0,
        t1_ms=t1,
        _cached=[judged],
    )


def _malformed(judged: DataFrame, directory: Path) -> Malformed:
    """Count the malformed lines by reason and file, and keep a few (they are few: the
    cache's batches of valid records are skipped by their ``kind`` statistics)."""
    lines = judged.where(F.col("kind") < 0).select(
        F.split("bad", "\n", 2)[0].alias("file"),
        F.split("bad", "\n", 2)[1].alias("line"),
        "kind",
    )
    lines = lines.withColumn("kind", _refined(F.col("kind"), F.col("line")))
    counts = dict.fromkeys(REASONS, 0)
    by_file: list[tuple[str, str, int]] = []
    for row in lines.groupBy("kind", "file").count().collect():
        reason = REASONS[-row["kind"] - 1]
        counts[reason] += row["count"]
        by_file.append((_display(row["file"], directory), reason, row["count"]))
    examples: list[tuple[str, str, str]] = []
    for row in lines.limit(_EXAMPLES).collect():
        shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in row["line"])
        cut = shown[:_EXAMPLE_CHARS] + ("..." if len(shown) > _EXAMPLE_CHARS else "")
        examples.append((_display(row["file"], directory), REASONS[-row["kind"] - 1], cut))
    return Malformed(counts=counts, by_file=sorted(by_file), examples=examples)


def _display(uri: str, directory: Path) -> str:
    """A file's path relative to the trace directory (Spark gives ``file:`` URIs)."""
    path = unquote(uri.removeprefix("file://").removeprefix("file:"))
    try:
        return str(Path(path).resolve().relative_to(directory.resolve()))
    except ValueError:
        return path
