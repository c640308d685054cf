"""Reading a trace directory in Spark, counting the lines that do not fit the schema.

Theory of operation: one Spark job reads every trace file once (after a small one that
reads the first lines of each, where the trace's start nearly always is: the tasks
number time windows from it). Its tasks are the *pieces* of the files (byte ranges of
about 64 MB of a plain ``.ndjson`` file, a whole ``.ndjson.gz``; a gzip file cut short,
as a killed peer leaves it, is read up to the cut), and each task, in Spark's Python
worker, parses its lines with Arrow's JSON reader against the explicit schema of each
record type (:mod:`~agiledart.analysis.parse`, where the rules are), gives each line one
verdict, and writes the valid records of each type as Parquet files: ``ts``, ``peer``
and the fields the analysis reads (:data:`~agiledart.analysis.schemas.ANALYZED`), under
``<parts>/<type>/`` (in the output directory, which every executor reaches), but for the
types whose sections need only partial aggregates, which the task computes from the
records it parsed and writes instead (:mod:`~agiledart.analysis.partials`). Arrow judges
a whole block of lines with a few vectorised comparisons, and these files are what the
sections' queries scan in parallel partitions
(:class:`~agiledart.analysis.frames.Frames`).

A task returns what it counted: valid records per type and peer (with the earliest and
latest ``ts``), malformed lines per reason and a few of them as examples. Malformed
lines are counted, reported and skipped; they never stop an analysis.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from agiledart.analysis.errors import AnalysisUsageError
from agiledart.analysis.frames import Frames
from agiledart.analysis.parse import REASONS, earliest_ts, pieces, write_piece
from agiledart.analysis.partials import Windows
from agiledart.analysis.schemas import CORRUPT, RECORD_TYPES, union_schema
from agiledart.traces.writer import trace_files

__all__ = ["REASONS", "Malformed", "Traces", "json_lines", "read_traces"]

log = logging.getLogger("agiledart.analysis")

_EXAMPLES = 10
#: bytes of lines at the start of each file that the start of the trace is looked for in
GUESS_BYTES = 1 << 20
#: tasks per core that look for the start of the trace
GUESS_TASKS_PER_CORE = 2
_EXAMPLE_CHARS = 200


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
    """The valid records of one trace directory, as Parquet files under :attr:`parts`."""

    spark: SparkSession
    directory: Path
    files: list[Path]
    parts: Path
    """``<type>/part-NNNNNN.parquet``: the valid records of each type."""
    counts: dict[str, int]
    """Valid records per type."""
    writer_peers: list[str]
    """The peers that wrote valid records."""
    malformed: Malformed
    t0_ms: float | None
    """The earliest ``ts`` of a valid record: time zero of every timeline."""
    t1_ms: float | None

    @property
    def lines(self) -> int:
        """Non-blank lines read."""
        return sum(self.counts.values()) + self.malformed.total

    def has(self, kind: str) -> bool:
        return self.counts.get(kind, 0) > 0

    def frames(self, window_ms: float) -> Frames:
        """What the sections' queries read, with windows of ``window_ms``."""
        return Frames(
            spark=self.spark,
            parts=self.parts,
            counts=dict(self.counts),
            writer_peers=list(self.writer_peers),
            t0_ms=self.t0_ms,
            t1_ms=self.t1_ms,
            window_ms=window_ms,
        )

    def release(self) -> None:
        """Remove the records' files."""
        shutil.rmtree(self.parts, ignore_errors=True)


def json_lines(spark: SparkSession, files: Sequence[Path]) -> DataFrame:
    """Every line of ``files`` parsed by Spark's JSON source against the union schema
    (PERMISSIVE: a line that does not fit keeps its text in
    :data:`~agiledart.analysis.schemas.CORRUPT`); the benchmark's parsing anchor."""
    return (
        spark.read.schema(union_schema())
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("ignoreCorruptFiles", "true")
        .json([str(f) for f in files])
    )


def read_traces(
    spark: SparkSession, directory: Path, parts: Path, window_ms: float = 1000.0
) -> Traces:
    """Parse every trace file under ``directory`` (``<peer>/trace-NNNNNN.ndjson[.gz]``)
    and write its valid records and partial aggregates (windows of ``window_ms``) under
    ``parts`` (emptied first), in one Spark job after a small one that looks for the
    trace's start (:func:`_t0_guess`: the windows are counted from it); in two where
    the earliest record is not where that one looks."""
    directory = Path(directory)
    if not directory.is_dir():
        msg = f"{directory} is not a directory"
        raise AnalysisUsageError(msg)
    files = trace_files(directory)
    if not files:
        msg = f"no trace files (<peer>/trace-NNNNNN.ndjson[.gz]) under {directory}"
        raise AnalysisUsageError(msg)
    parts = Path(parts).resolve()
    guess = _t0_guess(spark, files)
    done = _read(spark, files, directory, parts, Windows(guess or 0.0, window_ms))
    start = min((first for d in done for _, first, _ in d["tally"].values()), default=None)
    if start is not None and start != guess:
        log.info("the trace's earliest record is not at the start of a file: reading again")
        done = _read(spark, files, directory, parts, Windows(start, window_ms))
    counts: dict[str, int] = {}
    writers: set[str] = set()
    t0: float | None = None
    t1: float | None = None
    malformed = dict.fromkeys(REASONS, 0)
    by_file: dict[tuple[str, str], int] = {}
    examples: list[tuple[str, str, str]] = []
    for piece in sorted(done, key=lambda d: d["path"]):
        for (kind, peer), (n, first, last) in piece["tally"].items():
            counts[kind] = counts.get(kind, 0) + int(n)
            writers.add(peer)
            t0 = first if t0 is None else min(t0, first)
            t1 = last if t1 is None else max(t1, last)
        shown = _display(piece["path"], directory)
        for reason, n in piece["malformed"].items():
            malformed[reason] += n
            by_file[(shown, reason)] = by_file.get((shown, reason), 0) + n
        for reason, line in piece["examples"]:
            if len(examples) < _EXAMPLES:
                examples.append((shown, reason, _shown(line)))
    return Traces(
        spark=spark,
        directory=directory,
        files=files,
        parts=parts,
        counts={kind: counts[kind] for kind in RECORD_TYPES if kind in counts},
        writer_peers=sorted(writers),
        malformed=Malformed(
            counts=malformed,
            by_file=sorted((f, r, n) for (f, r), n in by_file.items()),
            examples=examples,
        ),
        t0_ms=t0,
        t1_ms=t1,
    )


def _read(
    spark: SparkSession, files: list[Path], directory: Path, parts: Path, windows: Windows
) -> list[dict[str, Any]]:
    """The reader's Spark job: every piece of ``files`` written under ``parts``
    (emptied first); what each piece counted."""
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    work = sorted(pieces(files), key=lambda p: -_size(p))
    target = str(parts)
    try:
        done: list[dict[str, Any]] = (
            spark.sparkContext.parallelize(list(enumerate(work)), len(work))
            .map(lambda job: write_piece(job[0], job[1], target, windows))
            .collect()
        )
        failed = sorted({(d["path"], d["error"]) for d in done if "error" in d})
        if failed:
            shown = "; ".join(f"{_display(path, directory)}: {error}" for path, error in failed)
            msg = f"cannot read {len(failed)} trace file(s): {shown}"
            raise AnalysisUsageError(msg)
    except BaseException:
        shutil.rmtree(parts, ignore_errors=True)
        raise
    return done


def _t0_guess(spark: SparkSession, files: list[Path]) -> float | None:
    """The earliest valid record among the first :data:`GUESS_BYTES` of every file:
    where a trace's first record nearly always is (each peer writes in time order).
    Spark's tasks read them, a few per core, so that a site's thousands of files are
    not parsed one after the other in the driver."""
    limit = GUESS_BYTES
    tasks = min(len(files), GUESS_TASKS_PER_CORE * spark.sparkContext.defaultParallelism)
    found: list[float | None] = (
        spark.sparkContext.parallelize([str(path) for path in files], max(1, tasks))
        .mapPartitions(lambda paths: [_earliest(earliest_ts(p, limit) for p in paths)])
        .collect()
    )
    return _earliest(found)


def _earliest(found: Iterable[float | None]) -> float | None:
    return min((t for t in found if t is not None), default=None)


def _size(piece: Any) -> int:
    return piece.end - piece.start if piece.end >= 0 else Path(piece.path).stat().st_size


def _shown(line: str) -> str:
    """The start of a malformed line, printable."""
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in line)
    return shown[:_EXAMPLE_CHARS] + ("..." if len(shown) > _EXAMPLE_CHARS else "")


def _display(path: str, directory: Path) -> str:
    """A file's path relative to the trace directory."""
    try:
        return str(Path(path).resolve().relative_to(directory.resolve()))
    except ValueError:
        return path
