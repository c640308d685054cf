"""Spark schemas of the trace records, derived from :mod:`agiledart.traces.schema`.

One :class:`~pyspark.sql.types.StructType` per record type (the common fields, then
the type's own), and their union, which the reader parses every line with once: a
field name means the same thing, with the same type, in every record type that has
it, so the union is well defined (:func:`union_schema` checks that).

JSON-ish field types map to Spark types as ``int`` -> long, ``float`` -> double,
``str`` -> string, ``bool`` -> boolean, ``[str]`` -> array<string>, ``[[str]]`` ->
array<array<string>>, ``{str: [str]}`` -> map<string, array<string>>, ``any`` ->
string (the value's JSON text). One leniency: Spark's JSON parser reads a number or
a boolean where a string belongs as its text, so only numeric, boolean and structured
fields are type-checked.

Every field is parsed and type-checked, but only the fields the analysis reads
(:data:`ANALYZED`) are cached, in a dense layout (:data:`LAYOUT`): ``ts``, ``peer``,
and each type's fields in shared *slots* (``s0``, ``s1``... strings, ``l0``... longs,
``d0``... doubles, and so on), since a record only fills its own type's fields. Spark's
in-memory columns spend four bytes on every null cell, so caching the 59-column union
would spend most of its memory on nulls; the slots are a dozen columns that most
records fill. A field has the same slot in every type that has it (``app`` is ``s0``).
"""

from __future__ import annotations

from pyspark.sql import types as T

from agiledart.traces.schema import COMMON, FIELDS, NULLABLE, SCHEMA_VERSION

__all__ = [
    "ANALYZED",
    "CORRUPT",
    "LAYOUT",
    "RECORD_TYPES",
    "SCHEMA_VERSION",
    "SLOTS",
    "record_schema",
    "required_fields",
    "union_schema",
]

#: the column Spark's JSON parser puts a line it could not parse into
CORRUPT = "_corrupt"
RECORD_TYPES: tuple[str, ...] = tuple(FIELDS)


def _spark_type(kind: str) -> T.DataType:
    if kind == "int":
        return T.LongType()
    if kind == "float":
        return T.DoubleType()
    if kind in ("str", "any"):
        return T.StringType()
    if kind == "bool":
        return T.BooleanType()
    if kind == "[str]":
        return T.ArrayType(T.StringType())
    if kind == "[[str]]":
        return T.ArrayType(T.ArrayType(T.StringType()))
    if kind == "{str: [str]}":
        return T.MapType(T.StringType(), T.ArrayType(T.StringType()))
    msg = f"no Spark type for trace field type {kind!r}"
    raise AssertionError(msg)


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


_FAMILY = {
    "int": "l",
    "float": "d",
    "str": "s",
    "any": "s",
    "bool": "b",
    "[str]": "a",
    "[[str]]": "aa",
    "{str: [str]}": "m",
}


#: the fields of each record type that the analysis reads (and the reader caches)
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
}


def _layout() -> dict[str, dict[str, str]]:
    """Record type -> analyzed field -> slot, greedily: fields most types share first."""
    kinds_of: dict[str, list[str]] = {}
    kind_of_field: dict[str, str] = {}
    for kind, names in ANALYZED.items():
        for name in names:
            kinds_of.setdefault(name, []).append(kind)
            kind_of_field[name] = FIELDS[kind][name]
    taken: dict[str, set[str]] = {kind: set() for kind in FIELDS}
    layout: dict[str, dict[str, str]] = {kind: {} for kind in FIELDS}
    for name in sorted(kinds_of, key=lambda n: (-len(kinds_of[n]), n)):
        family = _FAMILY[kind_of_field[name]]
        i = 0
        while any(f"{family}{i}" in taken[kind] for kind in kinds_of[name]):
            i += 1
        for kind in kinds_of[name]:
            taken[kind].add(f"{family}{i}")
            layout[kind][name] = f"{family}{i}"
    return layout


#: record type -> analyzed field -> the cached column holding it
LAYOUT: dict[str, dict[str, str]] = _layout()


def _slots() -> dict[str, T.DataType]:
    types: dict[str, T.DataType] = {}
    for kind, fields in LAYOUT.items():
        for name, slot in fields.items():
            types[slot] = _spark_type(FIELDS[kind][name])
    return dict(sorted(types.items()))


#: cached column -> its Spark type
SLOTS: dict[str, T.DataType] = _slots()
