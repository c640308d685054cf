"""Parameter schemas of operators, connectors and datasets, as data.

Each :class:`Param` says what one ``params`` entry may hold; :func:`check_params`
checks a mapping against a schema, reports every problem with its field path and
fills in defaults. Cross-parameter rules (``slide_ms <= size_ms``, ``field`` unless
``count``) live with the parser.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agiledart.app.errors import Problem
from agiledart.app.spec import AGGREGATES, CHECKPOINT_MODES, DATASETS
from agiledart.app.topics import filter_problem, template_problem

__all__ = [
    "CHECKPOINT_PARAMS",
    "DATASET_PARAMS",
    "OPERATOR_PARAMS",
    "SCALING_PARAMS",
    "SINK_PARAMS",
    "SOURCE_PARAMS",
    "Param",
    "check_params",
    "check_plain",
    "did_you_mean",
]


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _strs(v: Any) -> bool:
    if isinstance(v, str):
        return bool(v)
    return isinstance(v, list | tuple) and bool(v) and all(isinstance(s, str) and s for s in v)


#: kind -> (test, description used in messages)
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "posint": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "nonnegint": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "int": (_is_int, "an integer"),
    "posnum": (lambda v: _is_num(v) and v > 0, "a positive number"),
    "fraction": (lambda v: _is_num(v) and 0 <= v < 1, "a number in [0, 1)"),
    "str": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "strs": (_strs, "a field name or a list of field names"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "port": (lambda v: _is_int(v) and 0 < v < 65536, "a port in 1-65535"),
    "fieldmap": (
        lambda v: (
            isinstance(v, Mapping)
            and bool(v)
            and all(isinstance(k, str) and k and isinstance(x, str) and x for k, x in v.items())
        ),
        "a mapping of record field to payload key, e.g. {value: v, ts: time}",
    ),
}


def _hostport_problem(v: str) -> str | None:
    host, sep, port = v.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return "give the host and a port in 1-65535"
    return None


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: a column's SQL type: a name, maybe with a size (``VARCHAR(20)``, ``NUMERIC(10, 2)``)
_SQL_TYPE = re.compile(r"^[A-Za-z][A-Za-z ]*(\(\d+(, ?\d+)?\))?$")


def _identifier_problem(v: str) -> str | None:
    return None if _IDENTIFIER.match(v) else "not first a digit, no other characters"


def _db_url_problem(v: str) -> str | None:
    if v.startswith("sqlite:///") and len(v) > len("sqlite:///"):
        return None
    if v.startswith(("postgresql://", "postgres://")):
        return None
    return "an unknown kind of database"


def _http_url_problem(v: str) -> str | None:
    scheme, sep, rest = v.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or rest.startswith("/"):
        return "an http:// or https:// URL with a host"
    return None


def _http_path_problem(v: str) -> str | None:
    return None if v.startswith("/") and " " not in v else "starts with /, no spaces"


def _headers(v: Any) -> bool:
    return (
        isinstance(v, Mapping)
        and bool(v)
        and all(
            isinstance(k, str) and bool(re.match(r"^[A-Za-z0-9-]+$", k)) and isinstance(x, str)
            for k, x in v.items()
        )
    )


def _columns(v: Any) -> bool:
    return (
        isinstance(v, Mapping)
        and bool(v)
        and all(
            isinstance(k, str)
            and bool(_IDENTIFIER.match(k))
            and isinstance(t, str)
            and bool(_SQL_TYPE.match(t))
            for k, t in v.items()
        )
    )


_KINDS["headers"] = (_headers, "a mapping of header name to text, e.g. {X-Site: plant-3}")
_KINDS["columns"] = (
    _columns,
    "a mapping of column name to SQL type, e.g. {key: TEXT, mean: DOUBLE PRECISION}",
)

#: kind -> (what is wrong with a string, or None; description used in messages)
_STRING_KINDS: dict[str, tuple[Callable[[str], str | None], str]] = {
    "hostport": (_hostport_problem, "HOST:PORT, e.g. localhost:1883"),
    "topic_filter": (filter_problem, "an MQTT topic filter, e.g. sensors/+/pollution"),
    "identifier": (_identifier_problem, "an SQL name: letters, digits and _"),
    "db_url": (_db_url_problem, "sqlite:///FILE or postgresql://USER@HOST:PORT/DB"),
    "http_url": (_http_url_problem, "an http:// or https:// URL, e.g. http://host:8080/in"),
    "http_path": (_http_path_problem, "a URL path, e.g. /readings"),
    "topic_template": (template_problem, "an MQTT topic with {field} placeholders, e.g. out/{key}"),
}


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    kind: str  # a key of _KINDS, or "enum" (one of ``choices``)
    required: bool = False
    default: Any = None
    choices: tuple[Any, ...] = ()
    unit: str = ""

    def describe(self) -> str:
        if self.kind == "enum":
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.kind in _STRING_KINDS:
            return _STRING_KINDS[self.kind][1]
        what = _KINDS[self.kind][1]
        return f"{what} ({self.unit})" if self.unit else what

    def check(self, value: Any) -> str | None:
        """None if ``value`` is acceptable, else what is wrong with it."""
        if self.kind in _STRING_KINDS:
            if not isinstance(value, str):
                return f"must be {self.describe()}, got {value!r}"
            bad = _STRING_KINDS[self.kind][0](value)
            return None if bad is None else f"must be {self.describe()}: {bad}, got {value!r}"
        ok = value in self.choices if self.kind == "enum" else _KINDS[self.kind][0](value)
        if ok:
            return None
        return f"must be {self.describe()}, got {value!r}"


def _p(name: str, kind: str, **kw: Any) -> Param:
    return Param(name, kind, **kw)


_MS = {"unit": "milliseconds"}
OPERATOR_PARAMS: Mapping[str, tuple[Param, ...]] = {
    "window": (
        _p("size_ms", "posint", required=True, **_MS),
        _p("slide_ms", "posint", **_MS),
        _p("key", "str"),
        _p("aggregate", "enum", required=True, choices=AGGREGATES),
        _p("field", "str"),
    ),
    "aggregate": (
        _p("key", "str"),
        _p("aggregate", "enum", required=True, choices=AGGREGATES),
        _p("field", "str"),
    ),
    "join": (_p("key", "str", required=True), _p("window_ms", "posint", required=True, **_MS)),
    "top_k": (
        _p("k", "posint", required=True),
        _p("by", "str", required=True),
        _p("window_ms", "posint", required=True, **_MS),
    ),
    "dedupe": (_p("key", "str", required=True), _p("ttl_ms", "posint", required=True, **_MS)),
    "key_by": (_p("key", "strs"),),
    "union": (),
}

_GENERATOR_COMMON = (
    _p("dataset", "enum", required=True, choices=DATASETS),
    _p("rate", "posnum", required=True, unit="records per second of event time"),
    _p("count", "nonnegint"),
    _p("seed", "int", default=0),
    _p("start_ts", "int", default=0, **_MS),
    _p("disorder_ms", "nonnegint", default=0, **_MS),
    _p("out_of_order_ms", "nonnegint", **_MS),
    _p("speedup", "posnum", unit="times faster than event time, when replayed by a peer"),
    _p("overload", "enum", choices=("block", "shed")),
)
#: Extra generator parameters per dataset (see agiledart.datasets).
DATASET_PARAMS: Mapping[str, tuple[Param, ...]] = {
    "urban": (_p("sensors", "posint", default=10), _p("dup_ratio", "fraction", default=0.0)),
    "taxi": (
        _p("cells", "posint", default=300),
        _p("taxis", "posint", default=1000),
        _p("invalid_ratio", "fraction", default=0.01),
    ),
    "words": (),
    "counter": (_p("keys", "posint", default=16),),
}
_FORMATS = ("jsonl", "csv")
_MQTT_FORMATS = ("json", "msgpack")
#: Broker connection and payload parameters of mqtt sources and sinks. Secrets: prefer
#: ``password_env`` (an environment variable of the peer) to ``password`` in the spec.
_MQTT = (
    _p("broker", "hostport", default="localhost:1883"),
    _p("qos", "enum", default=0, choices=(0, 1)),
    _p("format", "enum", default="json", choices=_MQTT_FORMATS),
    _p("tls", "bool", default=False),
    _p("ca_file", "str"),
    _p("username", "str"),
    _p("password", "str"),
    _p("password_env", "str"),
)
SOURCE_PARAMS: Mapping[str, tuple[Param, ...]] = {
    "generator": _GENERATOR_COMMON,
    "file": (
        _p("path", "str", required=True),
        _p("format", "enum", choices=_FORMATS),
        _p("rate", "posnum", unit="records per second"),
        _p("out_of_order_ms", "nonnegint", default=1000, **_MS),
        _p("speedup", "posnum", unit="times the rate, when replayed by a peer"),
        _p("overload", "enum", choices=("block", "shed")),
    ),
    "mqtt": (
        _p("topic", "topic_filter", required=True),
        *_MQTT,
        _p("fields", "fieldmap"),
        _p("topic_field", "str"),
        _p("count", "nonnegint"),
        # the source's log on the peer's disk: messages not yet handed on, at most
        _p("buffer", "posint", default=1_000_000, unit="records"),
        _p("buffer_mb", "posint", default=256, unit="MiB"),
        _p("overload", "enum", default="shed-oldest", choices=("shed-oldest", "shed-newest")),
        _p("out_of_order_ms", "nonnegint", default=1000, **_MS),
    ),
    "http": (
        _p("port", "port", required=True),
        _p("token_env", "str", required=True),
        _p("host", "str", default="127.0.0.1"),
        _p("path", "http_path", default="/"),
        _p("max_body_kb", "posint", default=1024, unit="KiB"),
        _p("buffer", "posint", default=10_000, unit="records"),
        _p("count", "nonnegint"),
        _p("out_of_order_ms", "nonnegint", default=1000, **_MS),
    ),
}
SINK_PARAMS: Mapping[str, tuple[Param, ...]] = {
    "file": (
        _p("path", "str", required=True),
        _p("format", "enum", choices=_FORMATS),
        _p("flush_ms", "nonnegint", default=1000, **_MS),
    ),
    "mqtt": (
        _p("topic", "topic_template", required=True),
        *_MQTT,
        _p("buffer", "posint", default=10_000, unit="records"),
        _p("drain_timeout_ms", "nonnegint", default=30_000, **_MS),
        # exactly-once (with checkpoints): committed epochs waiting for the broker, at most
        _p("delivery", "enum", choices=("at-least-once", "exactly-once"), default="at-least-once"),
        _p("buffer_mb", "posint", default=64, unit="MiB"),
        _p("id_in_payload", "bool", default=False),
    ),
    "stdout": (),
    "discard": (),
    "sql": (
        _p("table", "identifier", required=True),
        _p("url", "db_url"),
        _p("columns", "columns"),
        _p("upsert_on", "strs"),
        _p("password_env", "str"),
        _p("buffer_mb", "posint", default=64, unit="MiB"),
        _p("flush_ms", "nonnegint", default=1000, **_MS),
    ),
    "http": (
        _p("url", "http_url", required=True),
        _p("headers", "headers"),
        _p("token_env", "str"),
        _p("batch_records", "posint", default=500, unit="records per POST"),
        _p("timeout_ms", "posint", default=10_000, **_MS),
        _p("buffer_mb", "posint", default=64, unit="MiB"),
        _p("flush_ms", "nonnegint", default=1000, **_MS),
    ),
}
CHECKPOINT_PARAMS: tuple[Param, ...] = (
    _p("interval_ms", "posint", default=10_000, **_MS),
    _p("mode", "enum", default="auto", choices=CHECKPOINT_MODES),
    _p("m", "posint", default=3),
    _p("k", "nonnegint", default=2),
)
#: the ``scaling:`` block (agiledart.app.spec.ScalingSpec)
SCALING_PARAMS: tuple[Param, ...] = (
    _p("enabled", "bool", default=False),
    _p("target", "fraction", default=0.9),
    _p("tolerance", "fraction", default=0.05),
    _p("max_instances", "posint", default=4),
    _p("cooldown_ms", "nonnegint", default=5_000, **_MS),
    _p("interval_ms", "posint", default=1_000, **_MS),
    _p("latency_ms", "posint", default=5_000, **_MS),
)


def check_params(
    params: Mapping[str, Any],
    schema: tuple[Param, ...],
    path: str,
    problems: list[Problem],
    *,
    owner: str,
) -> dict[str, Any]:
    """Check ``params`` (at ``path``) against ``schema``; the result has defaults filled."""
    known = {p.name: p for p in schema}
    out: dict[str, Any] = {}
    for name, value in params.items():
        p = known.get(name)
        if p is None:
            takes = ", ".join(known) or "no parameters"
            hint = did_you_mean(str(name), list(known))
            problems.append(
                Problem(f"{path}.{name}", f"unknown parameter{hint}; {owner} takes: {takes}")
            )
            continue
        bad = p.check(value)
        if bad is not None:
            problems.append(Problem(f"{path}.{name}", bad))
            continue
        out[name] = value
    for p in schema:
        if p.name in params:
            continue
        if p.required:
            problems.append(
                Problem(f"{path}.{p.name}", f"missing; {owner} needs {p.name}: {p.describe()}")
            )
        elif p.default is not None:
            out[p.name] = p.default
    return out


def check_plain(value: Any, path: str, problems: list[Problem]) -> None:
    """Function params must be plain data (msgpack-able): report anything else."""
    if value is None or isinstance(value, str | int | float | bool):
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_plain(v, f"{path}[{i}]", problems)
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append(Problem(path, f"keys must be strings, got {k!r}"))
            check_plain(v, f"{path}.{k}", problems)
        return
    problems.append(
        Problem(path, f"must be plain data (string, number, bool, null, list, map), got {value!r}")
    )
