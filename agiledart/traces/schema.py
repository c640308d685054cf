"""The trace schema, version 1 (docs/traces.md is the user-facing description).

A trace directory holds one folder per peer; each folder holds newline-delimited JSON
files ``trace-NNNNNN.ndjson`` (or ``.ndjson.gz``), rotated by size. Every line is one
JSON object with the common fields ``v`` (schema version), ``type``, ``ts`` (wall-clock
milliseconds since the Unix epoch) and ``peer`` (the writer's name), plus the fields
of its type listed in :data:`FIELDS`. Readers ignore fields they do not know, so
later versions may add fields without a new version number; renaming or retyping one
takes a new version.

Field types are given as JSON-ish names: ``str``, ``int``, ``float`` (an int is
accepted), ``bool``, ``[str]`` (list of strings), ``[[str]]``, ``{str: [str]}`` and
``any``. A field may be ``null`` where :data:`NULLABLE` says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agiledart.traces.errors import TraceError

__all__ = [
    "COMMON",
    "FIELDS",
    "NULLABLE",
    "SCHEMA_VERSION",
    "TraceSchemaError",
    "check",
    "column_type",
]

SCHEMA_VERSION = 1

COMMON: dict[str, str] = {"v": "int", "type": "str", "ts": "float", "peer": "str"}

FIELDS: dict[str, dict[str, str]] = {
    # first line of every file
    "meta": {"schema": "int", "version": "str", "node_id": "str", "zone": "str"},
    # a peer joined, left, was suspected or declared dead (``subject`` is that peer)
    "peer": {"event": "str", "subject": "str", "node_id": "str", "zone": "str"},
    # a sampled tuple reached a sink: end-to-end latency (clocks assumed synchronised)
    "tuple": {
        "app": "str",
        "sink": "str",
        "trace_id": "int",
        "source_ts": "float",
        "sink_ts": "float",
        "latency_ms": "float",
    },
    # every second, per operator hosted on the writing peer (cumulative counters)
    "opstats": {
        "app": "str",
        "operator": "str",
        "records_in": "int",
        "records_out": "int",
        "rate_in": "float",
        "queue": "int",
        "utilization": "float",
        "service_us": "float",
    },
    # where an app's operators run, written by the peer that deployed it
    "placement": {
        "app": "str",
        "name": "str",
        "strategy": "str",
        "placement": "{str: [str]}",
        "paths": "[[str]]",
    },
    # one transmission attempt of a relayed batch over one link (node -> next)
    "shuffle": {
        "app": "str",
        "packet": "str",
        "origin": "str",
        "dest": "str",
        "hop": "int",
        "node": "str",
        "next": "str",
        "outcome": "str",  # ok | lost | late | refused
        "delay_ms": "float",
        "policy": "str",
        "graph": "str",
        "tau": "int",
        "omega": "float",
        "j": "float",
    },
    # a relayed batch arrived at its destination (written there)
    "delivery": {
        "app": "str",
        "packet": "str",
        "origin": "str",
        "dest": "str",
        "k": "int",  # 1-based index of the packet among those from origin to dest
        "path": "[str]",
        "attempts": "int",
        "delay_ms": "float",
        "optimal_ms": "float",
        "policy": "str",
        "graph": "str",
    },
    # a scaling decision for one operator
    "scaling": {
        "app": "str",
        "operator": "str",
        "health": "float",
        "instances": "int",
        "target": "int",
        "decision": "str",  # up | down | hold | scale-out | migrate
    },
    "checkpoint": {
        "app": "str",
        "epoch": "int",
        "bytes": "int",
        "duration_ms": "float",
        "m": "int",
        "k": "int",
        "committed": "bool",
    },
    "recovery": {
        "app": "str",
        "dead_peer": "str",
        "epoch": "int",
        "phase": "str",  # detected | restored | resumed
        "duration_ms": "float",
        "operators": "[str]",
    },
    # a zone scheduler was elected or adopted apps
    "scheduler": {"zone": "str", "scheduler": "str", "event": "str", "apps": "int"},
    # an mqtt source shed messages (its log was full): at most one a second, and at its end
    "ingest": {
        "source": "str",
        "broker": "str",
        "topic": "str",
        "received": "int",
        "shed": "int",
        "backlog": "int",
    },
}

#: fields that may be null (unknown or not applicable)
NULLABLE: dict[str, frozenset[str]] = {
    "opstats": frozenset({"utilization", "service_us"}),
    "shuffle": frozenset({"graph", "omega", "j"}),
    "delivery": frozenset({"optimal_ms", "graph"}),
    "placement": frozenset({"strategy"}),
    "recovery": frozenset({"epoch", "duration_ms"}),
    "peer": frozenset({"node_id", "zone"}),
    "meta": frozenset({"node_id", "zone"}),
}


class TraceSchemaError(TraceError, ValueError):
    """A trace record that does not follow the schema."""


_T = TypeVar("_T")


def column_type(
    kind: str,
    scalars: Mapping[str, Callable[[], _T]],
    list_of: Callable[[_T], _T],
    map_of: Callable[[_T, _T], _T],
) -> _T:
    """A field type (``int``, ``[str]``, ``{str: [str]}`` ...) as a column library's type:
    ``scalars`` makes each plain type, ``list_of`` and ``map_of`` the nested ones."""
    if kind.startswith("[") and kind.endswith("]"):
        return list_of(column_type(kind[1:-1], scalars, list_of, map_of))
    if kind.startswith("{str: ") and kind.endswith("}"):
        inner = column_type(kind[6:-1], scalars, list_of, map_of)
        return map_of(column_type("str", scalars, list_of, map_of), inner)
    if kind not in scalars:
        msg = f"no column type for trace field type {kind!r}"
        raise AssertionError(msg)
    return scalars[kind]()


def _is(kind: str, value: Any) -> bool:
    if kind == "any":
        return True
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "[str]":
        return isinstance(value, list) and all(isinstance(x, str) for x in value)
    if kind == "[[str]]":
        return isinstance(value, list) and all(_is("[str]", x) for x in value)
    if kind == "{str: [str]}":
        return isinstance(value, dict) and all(
            isinstance(k, str) and _is("[str]", v) for k, v in value.items()
        )
    msg = f"unknown field type {kind!r}"
    raise AssertionError(msg)


def check(record: Mapping[str, Any]) -> None:
    """Raise :class:`TraceSchemaError` unless ``record`` is a valid version-1 record."""
    for name, kind in COMMON.items():
        if not _is(kind, record.get(name)):
            msg = f"field {name!r} must be {kind}, got {record.get(name)!r}"
            raise TraceSchemaError(msg)
    kind_of = record["type"]
    fields = FIELDS.get(kind_of)
    if fields is None:
        msg = f"unknown record type {kind_of!r}"
        raise TraceSchemaError(msg)
    nullable = NULLABLE.get(kind_of, frozenset())
    for name, kind in fields.items():
        value = record.get(name)
        if value is None and name in nullable:
            continue
        if not _is(kind, value):
            msg = f"{kind_of}.{name} must be {kind}, got {value!r}"
            raise TraceSchemaError(msg)
