"""Judging trace lines into columnar tables, one piece of a trace file at a time.

Theory of operation: this is the code Spark's Python workers run for the reader
(:mod:`~agiledart.analysis.reader`); it works on bytes and Arrow tables, not on
Spark's DataFrames, and can be tested without a Spark session. A trace file is cut
into *pieces* (:func:`pieces`): byte ranges of about :data:`PIECE_BYTES` of a plain
file, the whole of a gzip file. A piece holds the lines that *start* in its range (as
Hadoop's line reader splits files), so every line is read exactly once whatever the cut.
:func:`read_piece` reads it a *chunk* (:data:`CHUNK_BYTES`) at a time and sorts the
chunk's lines by record type on the way the trace writer starts every line,
``{"v":1,"type":"<type>",``. Arrow's JSON reader then parses the lines of each type
against that type's own schema (:func:`arrow_schema`: its :data:`CHECKED` fields),
which costs a third of parsing every line against the union of all types' fields (most
of them null in any one line), and a few vectorised comparisons give each line one
verdict, the same verdict as the record-by-record rules of :func:`judge_line`:

* ``not_json``: not a JSON object (a truncated line, garbage, an array);
* ``unknown_type``: a JSON object whose ``type`` is missing or not a record type;
* ``unsupported_version``: ``v`` is not ``SCHEMA_VERSION``;
* ``bad_fields``: a field of the record's type of the wrong type, or a field that may
  not be null missing (a field that is not one of its type's is ignored, as
  :func:`agiledart.traces.check` does);
* else a valid record of its type.

Arrow refuses a whole block over one line that does not fit the schema, and does not
keep the lines' text; so the lines of a type that Arrow refuses, or among which it finds
a malformed one, are judged again line by line with :func:`judge_line`, as are lines
that do not start the writer's way (a killed peer's last line costs the slow judging of
its type's lines in one chunk, not of a file). The rules are Spark's JSON reader's,
which the analysis used before: a number or a boolean where a string belongs is read as
its text; an integer where a float belongs is a float, but not the other way round.

The valid records of each type come out as one Arrow table per type with ``ts``,
``peer`` and the fields the analysis reads (:data:`~agiledart.analysis.schemas.ANALYZED`),
which the reader writes out for the analysis's jobs.
"""

from __future__ import annotations

import contextlib
import io
import json
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pj

from agiledart.analysis.partials import FOLDED, Folder, Windows
from agiledart.analysis.schemas import ANALYZED, required_fields
from agiledart.traces.schema import COMMON, FIELDS, SCHEMA_VERSION, column_type

__all__ = [
    "CHUNK_BYTES",
    "FLUSH_BYTES",
    "PIECE_BYTES",
    "REASONS",
    "Piece",
    "PieceResult",
    "arrow_schema",
    "earliest_ts",
    "judge_line",
    "kind_schema",
    "pieces",
    "read_piece",
    "write_piece",
]

#: verdicts of malformed lines, in report order
REASONS = ("not_json", "unknown_type", "unsupported_version", "bad_fields")
#: bytes of a plain trace file per piece (one Spark task)
PIECE_BYTES = 64 << 20
#: bytes Arrow's JSON reader parses at once
CHUNK_BYTES = 8 << 20
#: bytes of parsed records a task holds before writing them out
FLUSH_BYTES = 128 << 20
#: malformed lines kept as examples, per piece
EXAMPLES = 10
RECORD_TYPES: tuple[str, ...] = tuple(FIELDS)


#: the Arrow type of each plain trace field type (docs/traces.md)
ARROW_SCALARS: dict[str, Callable[[], pa.DataType]] = {
    "int": pa.int64,
    "float": pa.float64,
    "str": pa.string,
    "any": pa.string,
    "bool": pa.bool_,
}


def _arrow_type(kind: str) -> pa.DataType:
    return column_type(kind, ARROW_SCALARS, pa.list_, pa.map_)


def _field_types() -> dict[str, str]:
    types: dict[str, str] = dict(COMMON)
    for fields in FIELDS.values():
        for name, kind in fields.items():
            if types.setdefault(name, kind) != kind:
                msg = f"field {name!r} has two types in the trace schema"
                raise AssertionError(msg)
    return types


#: every field of every record type -> its trace field type
FIELD_TYPES: dict[str, str] = _field_types()
_MAPS = frozenset(name for name, kind in FIELD_TYPES.items() if kind.startswith("{"))


def _checked() -> frozenset[str]:
    names = set(COMMON)
    for kind in FIELDS:
        names.update(ANALYZED[kind], required_fields(kind))
    return frozenset(names)


#: the fields whose type is checked: those a valid record of some type must carry and
#: those the analysis reads (the rest, optional and unread, need only be valid JSON)
CHECKED: frozenset[str] = _checked()


#: the fields of each record type's own (the common ones and its type's)
_OWN: dict[str, frozenset[str]] = {kind: frozenset({*COMMON, *FIELDS[kind]}) for kind in FIELDS}


def arrow_schema(kind: str) -> pa.Schema:
    """The schema Arrow's JSON reader parses the ``kind`` lines with (those that start
    the writer's way, whose ``v`` and ``type`` are known): the :data:`CHECKED` fields of
    the type's own but the maps, which it cannot read as maps (their lines are judged one
    by one, :func:`judge_line`)."""
    return pa.schema(
        [
            (name, _arrow_type(FIELD_TYPES[name]))
            for name in {**COMMON, **FIELDS[kind]}
            if name in CHECKED and name not in _MAPS and name not in ("v", "type")
        ]
    )


def kind_schema(kind: str) -> pa.Schema:
    """The columns of the valid ``kind`` records the reader keeps."""
    names = ("ts", "peer", *ANALYZED[kind])
    return pa.schema([(name, _arrow_type(FIELD_TYPES[name])) for name in names])


_REQUIRED = {kind: required_fields(kind) for kind in RECORD_TYPES}
_PARSE = {
    kind: pj.ParseOptions(explicit_schema=arrow_schema(kind), unexpected_field_behavior="ignore")
    for kind in RECORD_TYPES
}
#: how the trace writer starts every line, the type's name next
_PREFIX = b'{"v":%d,"type":"' % SCHEMA_VERSION
_KIND_NAMES = {kind.encode(): kind for kind in RECORD_TYPES}


# -- one line at a time: the rules ---------------------------------------------------


def _fits(kind: str, value: Any) -> bool:
    """Whether Spark's JSON reader reads ``value`` (not null) as a field of ``kind``."""
    if kind in ("str", "any"):
        return True  # scalars as their text, structures as their JSON text
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "[str]":
        return isinstance(value, list)
    if kind == "[[str]]":
        return isinstance(value, list) and all(x is None or isinstance(x, list) for x in value)
    if kind == "{str: [str]}":
        return isinstance(value, dict) and all(
            x is None or isinstance(x, list) for x in value.values()
        )
    msg = f"unknown field type {kind!r}"
    raise AssertionError(msg)


def _text(value: Any) -> Any:
    """A value where a string belongs, as Spark keeps it: scalars and structures as text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def _strings(value: Any) -> Any:
    if isinstance(value, list):
        return [_strings(x) for x in value]
    return _text(value)


def judge_line(line: str) -> tuple[str, dict[str, Any]]:
    """The verdict on one (non-blank) line: a record type and the record, or a reason
    from :data:`REASONS` and an empty dict."""
    try:
        record = json.loads(line)
    except ValueError:
        return "not_json", {}
    if not isinstance(record, dict):
        return "not_json", {}
    kind = _text(record.get("type"))
    if kind not in FIELDS:
        return "unknown_type", {}
    version = record.get("v")
    if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
        return "unsupported_version", {}
    own = _OWN[kind]
    for name, value in record.items():
        if value is None or name not in CHECKED or name not in own:
            continue
        if not _fits(FIELD_TYPES[name], value):
            return "bad_fields", {}
    if any(record.get(name) is None for name in _REQUIRED[kind]):
        return "bad_fields", {}
    return kind, record


def _row(kind: str, record: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name in schema.names:
        value = record.get(name)
        expected = FIELD_TYPES[name]
        if expected in ("str", "any"):
            value = _text(value)
        elif expected.startswith("[") and value is not None:
            value = _strings(value)
        elif expected.startswith("{") and value is not None:
            value = [(k, _strings(v)) for k, v in value.items()]
        elif expected == "float" and value is not None:
            value = float(value)
        row[name] = value
    return row


# -- pieces and chunks ---------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """Lines of ``path`` that start in ``[start, end)`` (``end`` -1: to the end)."""

    path: str
    start: int
    end: int


def pieces(files: list[Path], piece_bytes: int = PIECE_BYTES) -> list[Piece]:
    """The pieces of ``files``: ranges of plain files, gzip files whole."""
    out: list[Piece] = []
    for path in files:
        size = path.stat().st_size
        if path.name.endswith(".gz") or size <= piece_bytes:
            out.append(Piece(str(path), 0, -1))
            continue
        out += [
            Piece(str(path), start, min(start + piece_bytes, size))
            for start in range(0, size, piece_bytes)
        ]
    return out


def _plain_chunks(piece: Piece, chunk_bytes: int) -> Generator[bytes, None, None]:
    """Whole lines that start in the piece's range, about ``chunk_bytes`` at a time."""
    with open(piece.path, "rb") as fh:
        position = piece.start
        if position > 0:
            # the line under way at ``start`` belongs to the piece before
            fh.seek(position - 1)
            skipped = fh.readline()
            position += len(skipped) - 1
        carry = b""
        while piece.end < 0 or position < piece.end:
            want = chunk_bytes if piece.end < 0 else min(chunk_bytes, piece.end - position)
            block = fh.read(want)
            if not block:
                break
            position += len(block)
            data = carry + block
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                yield data[:cut]
        if carry:
            # the last line starting in the range runs past it, or the file has no
            # final newline
            rest = carry if piece.end < 0 else carry + fh.readline()
            yield rest


def _gzip_chunks(path: str, chunk_bytes: int) -> Generator[bytes, None, None]:
    """The decompressed lines of a gzip file (members one after another), about
    ``chunk_bytes`` at a time, up to where it was cut short if it was: what a killed
    peer flushed is still read."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending: list[bytes] = []
    held = 0
    broken = False
    with open(path, "rb") as fh:
        # compressed input a little at a time: a megabyte can inflate to tens
        while not broken and (raw := fh.read(1 << 20)):
            try:
                while raw:
                    out = inflater.decompress(raw)
                    pending.append(out)
                    held += len(out)
                    raw = b""
                    if inflater.eof and inflater.unused_data:
                        raw = inflater.unused_data
                        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            except zlib.error:
                broken = True  # garbage after the last good byte: keep what came before
            if held >= chunk_bytes or broken:
                data = b"".join(pending)
                cut = data.rfind(b"\n") + 1
                pending, held = [data[cut:]], len(data) - cut
                if cut:
                    yield data[:cut]
    rest = b"".join(pending)
    if rest:
        yield rest


def _chunks(piece: Piece, chunk_bytes: int) -> Generator[bytes, None, None]:
    if piece.path.endswith(".gz"):
        return _gzip_chunks(piece.path, chunk_bytes)
    return _plain_chunks(piece, chunk_bytes)


# -- a piece's result ----------------------------------------------------------------


@dataclass
class PieceResult:
    """What one piece held: valid records per type, tallies, malformed lines."""

    tables: dict[str, list[pa.Table]] = field(default_factory=dict)
    tally: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    """(record type, peer) -> [records, earliest ts, latest ts]"""
    malformed: dict[str, int] = field(default_factory=dict)
    """reason -> lines"""
    examples: list[tuple[str, str]] = field(default_factory=list)
    """(reason, the line)"""

    buffered: int = 0
    """Bytes of the tables held."""

    def add(self, kind: str, table: pa.Table) -> None:
        if table.num_rows:
            self.tables.setdefault(kind, []).append(table)
            self.buffered += table.nbytes

    def drain(self) -> dict[str, pa.Table]:
        """The tables held, one per type; they are counted into :attr:`tally` and let go."""
        drained = {kind: pa.concat_tables(tables) for kind, tables in self.tables.items()}
        for kind, table in drained.items():
            grouped = table.group_by("peer").aggregate(
                [("ts", "count"), ("ts", "min"), ("ts", "max")]
            )
            for peer, n, t0, t1 in zip(
                grouped["peer"].to_pylist(),
                grouped["ts_count"].to_pylist(),
                grouped["ts_min"].to_pylist(),
                grouped["ts_max"].to_pylist(),
                strict=True,
            ):
                seen = self.tally.setdefault((kind, peer), [0, t0, t1])
                seen[0] += n
                seen[1] = min(seen[1], t0)
                seen[2] = max(seen[2], t1)
        self.tables = {}
        self.buffered = 0
        return drained

    def bad(self, reason: str, line: str) -> None:
        self.malformed[reason] = self.malformed.get(reason, 0) + 1
        if len(self.examples) < EXAMPLES:
            self.examples.append((reason, line))


def _by_kind(data: bytes) -> tuple[dict[str, list[bytes]], list[bytes]]:
    """The non-blank lines of ``data``: those that start the writer's way, by record
    type, and the others."""
    kinds: dict[bytes, list[bytes]] = {}
    others: list[bytes] = []
    n = len(_PREFIX)
    for line in data.split(b"\n"):
        if line.startswith(_PREFIX):
            kinds.setdefault(line[n : line.find(b'"', n)], []).append(line)
        elif line.strip():
            others.append(line)
    found: dict[str, list[bytes]] = {}
    for name, lines in kinds.items():
        kind = _KIND_NAMES.get(name)
        if kind is None:
            others += lines  # an unknown type, or a name spelt with escapes
        else:
            found[kind] = lines
    return found, others


def _judge(data: bytes, result: PieceResult) -> None:
    """Judge the lines of ``data``: each type's with Arrow where it can, the rest line
    by line."""
    kinds, others = _by_kind(data)
    for kind, lines in kinds.items():
        block = b"\n".join(lines)
        if not _fast(kind, block, result):
            others.append(block)
    if others:
        _slow(b"\n".join(others), result)


def _fast(kind: str, data: bytes, result: PieceResult) -> bool:
    """Judge ``data``, lines of record type ``kind`` that start the writer's way, with
    Arrow; False (and nothing added) if it cannot be done so."""
    schema = kind_schema(kind)
    if any(name in _MAPS for name in schema.names):
        # Arrow reads an object as a struct: these few lines are judged one by one
        judged = [judge_line(line.decode("utf-8", errors="replace")) for line in data.split(b"\n")]
        if any(verdict != kind for verdict, _ in judged):
            return False
        rows = [_row(kind, record, schema) for _, record in judged]
        result.add(kind, pa.Table.from_pylist(rows, schema=schema))
        return True
    try:
        table = pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=_PARSE[kind],
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    if any(table[name].null_count for name in _REQUIRED[kind] if name not in ("v", "type")):
        return False
    result.add(kind, table.select(schema.names))
    return True


def _slow(data: bytes, result: PieceResult) -> None:
    """Judge ``data`` line by line (:func:`judge_line`), keeping malformed examples."""
    records: dict[str, list[dict[str, Any]]] = {}
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        verdict, record = judge_line(line)
        if verdict in FIELDS:
            records.setdefault(verdict, []).append(record)
        else:
            result.bad(verdict, line)
    for kind, found in records.items():
        schema = kind_schema(kind)
        rows = [_row(kind, record, schema) for record in found]
        result.add(kind, pa.Table.from_pylist(rows, schema=schema))


def read_piece(
    piece: Piece,
    chunk_bytes: int = CHUNK_BYTES,
    flush: Callable[[dict[str, pa.Table]], None] | None = None,
    flush_bytes: int = FLUSH_BYTES,
) -> PieceResult:
    """Every line of ``piece``, judged. With ``flush``, the valid records are handed to
    it whenever ``flush_bytes`` of them are held, and at the end (memory stays bounded
    whatever the piece's size: a gzip file is one piece); without, they stay in the
    result's :attr:`~PieceResult.tables`, one table per type."""
    result = PieceResult()
    for data in _chunks(piece, chunk_bytes):
        _judge(data, result)
        if flush is not None and result.buffered >= flush_bytes:
            flush(result.drain())
    drained = result.drain()
    if flush is not None:
        flush(drained)
    else:
        result.tables = {kind: [table] for kind, table in drained.items()}
    return result


def earliest_ts(path: str, limit: int) -> float | None:
    """The earliest ``ts`` of a valid record among the first ``limit`` bytes (of lines)
    of the trace file ``path``; None if none (or unreadable)."""
    result = PieceResult()
    chunks = _chunks(Piece(path, 0, -1), limit)
    try:
        data = next(chunks, b"")
    except OSError:
        return None
    finally:
        chunks.close()
    _judge(data, result)
    result.drain()
    return min((first for _, first, _ in result.tally.values()), default=None)


def _within_limit() -> tuple[int, int]:
    """The chunk and flush sizes for this process: the defaults, or, when its address
    space is limited (Spark's ``spark.executor.pyspark.memory``), sizes that fit the
    room left (an eighth of it for the records held, a 32nd for a chunk of lines)."""
    import resource

    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return CHUNK_BYTES, FLUSH_BYTES
    used = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) << 10
    room = max(0, limit - used)
    return (
        min(CHUNK_BYTES, max(1 << 20, room // 32)),
        min(FLUSH_BYTES, max(4 << 20, room // 8)),
    )


def write_piece(index: int, piece: Piece, parts: str, windows: Windows) -> dict[str, Any]:
    """Judge ``piece``, fold its valid records into partial aggregates
    (:class:`~agiledart.analysis.partials.Folder`, windows numbered by ``windows``) and
    write those and the records of the types not :data:`~agiledart.analysis.partials.FOLDED`
    as Parquet files under ``parts``; return its tallies and malformed lines (the Spark task)."""
    import pyarrow.parquet as pq

    writers: dict[str, pq.ParquetWriter] = {}
    folded = Folder(windows, index)

    def write(tables: dict[str, pa.Table]) -> None:
        for kind, table in tables.items():
            folded.add(kind, table)
            if kind in FOLDED:
                continue
            if kind not in writers:
                folder = Path(parts) / kind
                folder.mkdir(parents=True, exist_ok=True)
                # plain columns without statistics: a third of the writing's cost, and
                # the queries neither filter on ranges nor read small dictionaries faster
                writers[kind] = pq.ParquetWriter(
                    folder / f"part-{index:06d}.parquet",
                    table.schema,
                    compression="none",
                    use_dictionary=False,
                    write_statistics=False,
                )
            writers[kind].write_table(table)

    chunk_bytes, flush_bytes = _within_limit()
    try:
        result = read_piece(piece, chunk_bytes, flush=write, flush_bytes=flush_bytes)
        folded.write(Path(parts), index)
    except OSError as exc:
        # unreadable (permissions, removed since it was listed): the driver says which
        return {"path": piece.path, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        for writer in writers.values():
            writer.close()
    return {
        "path": piece.path,
        "tally": result.tally,
        "malformed": result.malformed,
        "examples": result.examples,
    }
