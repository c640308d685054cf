"""Per-node checks of an app spec: sources, operators, sinks and their params.

:class:`NodeParser` holds the problems found so far and the ids seen; the top-level
parser (:mod:`agiledart.app.parse`) drives it, then checks the graph.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from agiledart.app.errors import Problem
from agiledart.app.fnref import check_fn
from agiledart.app.kinds import FN_OPERATORS
from agiledart.app.schema import (
    DATASET_PARAMS,
    OPERATOR_PARAMS,
    SINK_PARAMS,
    SOURCE_PARAMS,
    check_params,
    check_plain,
    did_you_mean,
)
from agiledart.app.spec import (
    DEAD_LETTER_CONNECTORS,
    DEAD_LETTER_FIELDS,
    DEAD_LETTER_PATH,
    MAX_PANES_PER_WINDOW,
    MAX_WINDOWS_PER_RECORD,
    ON_ERROR_POLICIES,
    OPERATOR_KINDS,
    SINK_CONNECTORS,
    SOURCE_CONNECTORS,
    DeadLetterSpec,
    OperatorSpec,
    SinkSpec,
    SourceSpec,
    freeze,
)
from agiledart.app.topics import TopicTemplate

__all__ = ["ID_RE", "NodeParser"]

ID_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_SUFFIX_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv"}
_OP_KEYS = ("id", "op", "fn", "params", "inputs", "peer", "on_error", "dead_letter")
#: a dead-letter file's parameters: a file sink's, with a default path
_DEAD_LETTER_FILE = tuple(
    dataclasses.replace(p, required=False, default=DEAD_LETTER_PATH) if p.name == "path" else p
    for p in SINK_PARAMS["file"]
)
_PATH_PLACEHOLDERS = ("app", "op", "peer")


class NodeParser:
    """Checks one node at a time; every problem goes to ``problems``."""

    def __init__(self, known_peers: Collection[str] | None) -> None:
        self.problems: list[Problem] = []
        self.peers = None if known_peers is None else sorted(set(known_peers))
        self.ids: dict[str, str] = {}  # id -> path of the node that defines it
        self.kinds: dict[str, str] = {}  # id -> source | operator | sink
        self.inputs: dict[str, tuple[str, tuple[str, ...]]] = {}  # id -> (path, inputs)
        self.broken_inputs = False  # then reachability problems would only be noise

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def node(self, path: str, raw: Any, kind: str, keys: tuple[str, ...]) -> dict[str, Any] | None:
        if not isinstance(raw, Mapping):
            self.add(path, f"must be a mapping with {', '.join(keys)}")
            return None
        for key in raw:
            if key not in keys:
                if key == "inputs" and kind == "source":
                    self.add(f"{path}.inputs", "sources take no inputs; remove it")
                    continue
                hint = did_you_mean(str(key), keys)
                self.add(f"{path}.{key}", f"unknown field{hint}; a {kind} has: {', '.join(keys)}")
        node_id = raw.get("id")
        if node_id is None:
            self.add(f"{path}.id", f"missing; every {kind} needs a unique id")
        elif not (isinstance(node_id, str) and ID_RE.match(node_id)):
            self.add(f"{path}.id", f"must be letters, digits, '-' or '_' (1-64), got {node_id!r}")
        elif node_id in self.ids:
            self.add(f"{path}.id", f"duplicate id {node_id!r} (also {self.ids[node_id]}.id)")
        else:
            self.ids[node_id] = path
            self.kinds[node_id] = kind
        return dict(raw)

    def peer(self, path: str, raw: Any) -> str:
        if raw is None:
            self.add(path, "missing; name the peer this runs on, e.g. peer: sensor-1")
            return ""
        if not isinstance(raw, str) or not raw:
            self.add(path, f"must be a peer name, got {raw!r}")
            return str(raw)
        if self.peers is not None and raw not in self.peers:
            shown = ", ".join(self.peers[:10]) + (", ..." if len(self.peers) > 10 else "")
            hint = did_you_mean(raw, self.peers)
            self.add(path, f"unknown peer {raw!r}{hint}; peers in the ring: {shown or 'none'}")
        return raw

    def params_of(self, path: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        params = raw.get("params", {})
        if params is None:
            return {}
        if not isinstance(params, Mapping):
            self.add(f"{path}.params", "must be a mapping of parameter name to value")
            return {}
        return params

    def connector(self, path: str, raw: Any, choices: tuple[str, ...], kind: str) -> str:
        if raw in choices:
            return str(raw)
        if raw is None:
            self.add(f"{path}.connector", f"missing; a {kind} needs one of {', '.join(choices)}")
        else:
            hint = did_you_mean(str(raw), choices)
            self.add(
                f"{path}.connector",
                f"unknown connector {raw!r}{hint}; {kind}s use {', '.join(choices)}",
            )
        return ""

    def source(self, i: int, raw: Any) -> SourceSpec:
        path = f"sources[{i}]"
        d = self.node(path, raw, "source", ("id", "peer", "connector", "params"))
        if d is None:
            return SourceSpec(id="", peer="", connector="")
        peer = self.peer(f"{path}.peer", d.get("peer"))
        conn = self.connector(path, d.get("connector"), SOURCE_CONNECTORS, "source")
        given = self.params_of(path, d)
        params: dict[str, Any] = {}
        if conn:
            schema = SOURCE_PARAMS[conn]
            if conn == "generator" and given.get("dataset") in DATASET_PARAMS:
                schema = (*schema, *DATASET_PARAMS[given["dataset"]])
            params = check_params(given, schema, f"{path}.params", self.problems, owner=conn)
            if conn == "generator":
                params.setdefault("out_of_order_ms", params.get("disorder_ms", 0))
            if conn == "file":
                self.file_format(f"{path}.params", params)
            if conn == "mqtt":
                self.mqtt_params(f"{path}.params", params)
        if isinstance(d.get("id"), str):
            self.inputs[d["id"]] = (path, ())
        return SourceSpec(id=str(d.get("id")), peer=peer, connector=conn, params=freeze(params))

    def sink(self, i: int, raw: Any) -> SinkSpec:
        path = f"sinks[{i}]"
        d = self.node(path, raw, "sink", ("id", "peer", "connector", "params", "inputs"))
        if d is None:
            return SinkSpec(id="", peer="", connector="", inputs=())
        peer = self.peer(f"{path}.peer", d.get("peer"))
        conn = self.connector(path, d.get("connector"), SINK_CONNECTORS, "sink")
        given = self.params_of(path, d)
        params: dict[str, Any] = {}
        if conn:
            params = check_params(
                given, SINK_PARAMS[conn], f"{path}.params", self.problems, owner=conn
            )
            if conn == "file":
                self.file_format(f"{path}.params", params)
            if conn == "mqtt":
                self.mqtt_params(f"{path}.params", params)
            if conn == "sql":
                self.sql_params(f"{path}.params", params)
        inputs = self.input_list(path, d, "sink", at_least=1, at_most=None)
        return SinkSpec(
            id=str(d.get("id")), peer=peer, connector=conn, inputs=inputs, params=freeze(params)
        )

    def file_format(self, path: str, params: dict[str, Any]) -> None:
        if "format" in params or "path" not in params:
            return
        fmt = _SUFFIX_FORMATS.get(Path(params["path"]).suffix.lower())
        if fmt is None:
            self.add(
                f"{path}.format",
                f"cannot tell the format of {params['path']!r} from its name; "
                "set format: jsonl or format: csv",
            )
        else:
            params["format"] = fmt

    def mqtt_params(self, path: str, params: dict[str, Any]) -> None:
        if "password" in params and "password_env" in params:
            self.add(
                f"{path}.password_env",
                "give password or password_env (the peer's environment variable), not both",
            )
        if "ca_file" in params and not params.get("tls"):
            self.add(f"{path}.ca_file", "a CA file is for TLS: add tls: true, or remove it")
        topic_field = params.get("topic_field")
        if topic_field is not None and topic_field in params.get("fields", {}):
            self.add(
                f"{path}.topic_field",
                f"{topic_field!r} is also a key of fields: name the topic field differently",
            )

    def sql_params(self, path: str, params: dict[str, Any]) -> None:
        if params.get("password_env") and str(params.get("url", "sqlite")).startswith("sqlite"):
            self.add(f"{path}.password_env", "a SQLite database has no password: remove it")
        keys = params.get("upsert_on")
        if keys is None:
            return
        keys = [keys] if isinstance(keys, str) else list(keys)
        params["upsert_on"] = keys
        declared = params.get("columns")
        for key in keys:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                self.add(f"{path}.upsert_on", f"{key!r} is not a column name")
            elif declared is not None and key not in declared:
                self.add(f"{path}.upsert_on", f"{key!r} is not one of the columns")

    def operator(self, i: int, raw: Any) -> OperatorSpec:
        path = f"operators[{i}]"
        d = self.node(path, raw, "operator", _OP_KEYS)
        if d is None:
            return OperatorSpec(id="", op="", inputs=())
        pinned = None if d.get("peer") is None else self.peer(f"{path}.peer", d.get("peer"))
        op = d.get("op")
        if op not in OPERATOR_KINDS:
            if op is None:
                self.add(f"{path}.op", f"missing; choose one of {', '.join(OPERATOR_KINDS)}")
            else:
                hint = did_you_mean(str(op), OPERATOR_KINDS)
                self.add(
                    f"{path}.op",
                    f"unknown operator {op!r}{hint}; operators: {', '.join(OPERATOR_KINDS)}",
                )
            op = ""
        given = self.params_of(path, d)
        fn = d.get("fn")
        params = self.op_params(path, op, fn, given)
        if op == "join":
            arity: tuple[int, int | None] = (2, 2)
        elif op == "union":
            arity = (2, None)
        else:
            arity = (1, 1)
        inputs = self.input_list(path, d, op or "operator", at_least=arity[0], at_most=arity[1])
        on_error = d.get("on_error", "count")
        dead_letter = None
        if on_error not in ON_ERROR_POLICIES:
            hint = did_you_mean(str(on_error), ON_ERROR_POLICIES)
            self.add(
                f"{path}.on_error",
                f"unknown policy {on_error!r}{hint}; choose one of {', '.join(ON_ERROR_POLICIES)}",
            )
            on_error = "count"
        else:
            dead_letter = self.dead_letter(f"{path}.dead_letter", d.get("dead_letter"), on_error)
        return OperatorSpec(
            on_error=str(on_error),
            dead_letter=dead_letter,
            id=str(d.get("id")),
            op=op,
            fn=fn if isinstance(fn, str) else None,
            params=freeze(params),
            inputs=inputs,
            peer=pinned,
        )

    def dead_letter(self, path: str, raw: Any, on_error: str) -> DeadLetterSpec | None:
        """An operator's ``dead_letter:`` (``type`` and that sink's parameters), which
        goes with ``on_error: dead_letter`` and only with it."""
        if raw is None:
            if on_error == "dead_letter":
                self.add(
                    path,
                    "missing; on_error: dead_letter needs a sink for the records, e.g. "
                    "dead_letter: {type: file, path: bad-records.jsonl}",
                )
            return None
        if on_error != "dead_letter":
            self.add(
                path,
                f"a dead-letter sink needs on_error: dead_letter (this operator's is "
                f"{on_error}): add on_error: dead_letter, or remove dead_letter",
            )
            return None
        if not isinstance(raw, Mapping):
            self.add(path, "must be a mapping: type (file or mqtt) and that sink's parameters")
            return None
        given = dict(raw)
        kind = given.pop("type", None)
        if kind not in DEAD_LETTER_CONNECTORS:
            choices = ", ".join(DEAD_LETTER_CONNECTORS)
            if kind is None:
                self.add(f"{path}.type", f"missing; a dead-letter sink's type is one of {choices}")
            else:
                hint = did_you_mean(str(kind), DEAD_LETTER_CONNECTORS)
                self.add(f"{path}.type", f"unknown type {kind!r}{hint}; use one of {choices}")
            return None
        schema = _DEAD_LETTER_FILE if kind == "file" else SINK_PARAMS[kind]
        owner = f"a {kind} dead-letter sink"
        params = check_params(given, schema, path, self.problems, owner=owner)
        if kind == "file":
            self.file_format(path, params)
            self.dead_letter_path(path, params)
        else:
            self.mqtt_params(path, params)
            self.dead_letter_topic(path, params)
        return DeadLetterSpec(connector=str(kind), params=freeze(params))

    def dead_letter_path(self, path: str, params: dict[str, Any]) -> None:
        if params.get("format") == "csv":
            self.add(f"{path}.format", "dead letters are JSON objects: use format: jsonl")
        given = params.get("path")
        if not isinstance(given, str):
            return
        allowed = ", ".join("{" + n + "}" for n in _PATH_PLACEHOLDERS)
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(given) if f is not None]
        except ValueError:
            names = [""]
        bad = [n for n in names if n not in _PATH_PLACEHOLDERS]
        if bad:
            hint = did_you_mean(bad[0], _PATH_PLACEHOLDERS)
            self.add(
                f"{path}.path",
                f"unknown placeholder {{{bad[0]}}}{hint} in {given!r}; a dead-letter path "
                f"may use {allowed}",
            )

    def dead_letter_topic(self, path: str, params: dict[str, Any]) -> None:
        topic = params.get("topic")
        if not isinstance(topic, str):
            return
        fields = TopicTemplate(topic).fields
        bad = [f for f in fields if f not in DEAD_LETTER_FIELDS]
        if bad:
            hint = did_you_mean(bad[0], DEAD_LETTER_FIELDS)
            self.add(
                f"{path}.topic",
                f"a dead letter has no field {bad[0]!r}{hint}; its fields: "
                f"{', '.join(DEAD_LETTER_FIELDS)}",
            )

    def op_params(self, path: str, op: str, fn: Any, given: Mapping[str, Any]) -> dict[str, Any]:
        wants_fn = op in FN_OPERATORS or (op == "key_by" and "key" not in given)
        if fn is None and wants_fn:
            what = "either fn or params.key" if op == "key_by" else "fn"
            self.add(
                f"{path}.fn",
                f"missing; {op} needs {what}: '<code_id>:<function>' or 'builtin:<name>'",
            )
        elif fn is not None and not wants_fn and op:
            why = "give either fn or params.key, not both" if op == "key_by" else "remove it"
            self.add(f"{path}.fn", f"{op} takes no fn; {why}")
        elif fn is not None and op:
            check_fn(path, fn, op, given, self.problems)
        if op in OPERATOR_PARAMS and not (op == "key_by" and fn is not None):
            params = check_params(
                given, OPERATOR_PARAMS[op], f"{path}.params", self.problems, owner=op
            )
        else:  # parameters of the user function, bound at build time
            check_plain(dict(given), f"{path}.params", self.problems)
            return dict(given)
        if (
            op in ("window", "aggregate")
            and params.get("aggregate", "count") != "count"
            and "field" not in given
        ):
            self.add(
                f"{path}.params.field",
                f"missing; aggregate {params.get('aggregate')} needs the numeric field "
                "to aggregate, e.g. field: value",
            )
        if op == "window" and "size_ms" in params:
            self.window_shape(f"{path}.params.slide_ms", params)
        if op == "key_by" and isinstance(params.get("key"), list | tuple):
            params["key"] = list(params["key"])
        return params

    def window_shape(self, path: str, params: dict[str, Any]) -> None:
        size = params["size_ms"]
        slide = params.setdefault("slide_ms", size)
        if slide > size:
            self.add(
                path,
                f"slide_ms ({slide}) must not exceed size_ms ({size}); use slide_ms < "
                "size_ms for sliding windows, or leave it out for tumbling windows",
            )
        elif -(-size // slide) > MAX_WINDOWS_PER_RECORD:
            self.add(
                path,
                f"every record would fall into {-(-size // slide)} windows (size_ms / "
                f"slide_ms); the limit is {MAX_WINDOWS_PER_RECORD}: use a larger slide_ms",
            )
        elif size // math.gcd(size, slide) > MAX_PANES_PER_WINDOW:
            self.add(
                path,
                f"size_ms / gcd(size_ms, slide_ms) = {size // math.gcd(size, slide)} panes "
                f"per window exceeds {MAX_PANES_PER_WINDOW}: make slide_ms divide size_ms",
            )

    def input_list(
        self, path: str, d: Mapping[str, Any], what: str, *, at_least: int, at_most: int | None
    ) -> tuple[str, ...]:
        raw = d.get("inputs")
        node_id = d.get("id")
        if isinstance(node_id, str):
            self.inputs[node_id] = (path, ())
        if raw is None or not isinstance(raw, list) or not raw:
            self.broken_inputs = True
        if raw is None:
            self.add(f"{path}.inputs", f"missing; a {what} needs inputs: [<stream id>, ...]")
            return ()
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            self.add(
                f"{path}.inputs", f"must be a list of stream ids, e.g. [readings], got {raw!r}"
            )
            return ()
        n = len(raw)
        if n < at_least or (at_most is not None and n > at_most):
            if at_most == at_least == 1:
                need = "exactly one input; merge streams with a union first"
            elif at_most == at_least:
                need = f"exactly {at_least} inputs (left, right)"
            else:
                need = f"at least {at_least} input{'s' if at_least > 1 else ''}"
            self.add(f"{path}.inputs", f"{what} takes {need}; got {n}")
        if what != "join":
            seen: set[str] = set()
            for x in raw:
                if x in seen:
                    self.add(f"{path}.inputs", f"lists {x!r} twice; list each input once")
                seen.add(x)
        if isinstance(node_id, str):
            self.inputs[node_id] = (path, tuple(raw))
        return tuple(raw)
