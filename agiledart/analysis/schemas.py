"""Spark schemas of the trace records, derived from :mod:`agiledart.traces.schema`.

One :class:`~pyspark.sql.types.StructType` per record type (the common fields, then
the type's own), and their union (what ``scripts/bench_analyze.py`` has Spark's JSON
source parse, as its anchor): a field name means the same thing, with the same type, in
every record type that has it, so the union is well defined (:func:`union_schema`
checks that).

JSON-ish field types map to Spark types as ``int`` -> long, ``float`` -> double,
``str`` -> string, ``bool`` -> boolean, ``[str]`` -> array<string>, ``[[str]]`` ->
array<array<string>>, ``{str: [str]}`` -> map<string, array<string>>, ``any`` ->
string (the value's JSON text).

The reader (:mod:`~agiledart.analysis.parse`) keeps, of each valid record, only ``ts``,
``peer`` and the fields the analysis reads (:data:`ANALYZED`).
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import types as T

from agiledart.traces.schema import COMMON, FIELDS, NULLABLE, SCHEMA_VERSION, column_type

__all__ = [
    "ANALYZED",
    "CORRUPT",
    "RECORD_TYPES",
    "SCHEMA_VERSION",
    "kept_schema",
    "record_schema",
    "required_fields",
    "union_schema",
]

#: the column Spark's JSON parser puts a line it could not parse into
CORRUPT = "_corrupt"
RECORD_TYPES: tuple[str, ...] = tuple(FIELDS)


#: the Spark type of each plain trace field type (docs/traces.md)
SPARK_SCALARS: dict[str, Callable[[], T.DataType]] = {
    "int": T.LongType,
    "float": T.DoubleType,
    "str": T.StringType,
    "any": T.StringType,
    "bool": T.BooleanType,
}


def _spark_type(kind: str) -> T.DataType:
    return column_type(kind, SPARK_SCALARS, T.ArrayType, T.MapType)


def record_schema(kind: str) -> T.StructType:
    """The common fields and those of record type ``kind``, in schema order."""
    fields = {**COMMON, **FIELDS[kind]}
    return T.StructType([T.StructField(name, _spark_type(t), True) for name, t in fields.items()])


def required_fields(kind: str) -> list[str]:
    """Fields a valid ``kind`` record must carry (not null)."""
    nullable = NULLABLE.get(kind, frozenset())
    return [name for name in {**COMMON, **FIELDS[kind]} if name not in nullable]


def union_schema() -> T.StructType:
    """Every field of every record type once, plus :data:`CORRUPT`."""
    seen: dict[str, T.StructField] = {}
    for kind in RECORD_TYPES:
        for field in record_schema(kind).fields:
            other = seen.setdefault(field.name, field)
            if other.dataType != field.dataType:
                msg = f"field {field.name!r} has two types in the trace schema"
                raise AssertionError(msg)
    return T.StructType([*seen.values(), T.StructField(CORRUPT, T.StringType(), True)])


#: the fields of each record type that the analysis reads (and the reader keeps)
ANALYZED: dict[str, tuple[str, ...]] = {
    "meta": (),
    "peer": ("event", "subject", "zone"),
    "tuple": ("app", "sink", "latency_ms"),
    "opstats": ("app", "operator", "records_in", "records_out", "queue", "utilization"),
    "placement": ("app", "name", "strategy", "placement", "paths"),
    "shuffle": ("policy", "graph", "hop", "node", "next", "outcome", "delay_ms"),
    "delivery": (
        "policy",
        "graph",
        "origin",
        "dest",
        "k",
        "path",
        "attempts",
        "delay_ms",
        "optimal_ms",
    ),
    "scaling": ("app", "operator", "health", "instances", "target", "decision"),
    "checkpoint": ("app", "epoch", "bytes", "duration_ms", "m", "k", "committed"),
    "recovery": ("app", "dead_peer", "epoch", "phase", "duration_ms", "operators"),
    "scheduler": ("zone", "scheduler", "event", "apps"),
    "ingest": (),  # an mqtt source's shedding: checked, not analysed yet
}


def kept_schema(kind: str) -> T.StructType:
    """The columns the reader keeps of a valid ``kind`` record: ``ts``, ``peer`` and
    :data:`ANALYZED`, in that order."""
    fields = {field.name: field for field in record_schema(kind).fields}
    return T.StructType([fields[name] for name in ("ts", "peer", *ANALYZED[kind])])
