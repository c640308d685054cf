"""The validated app spec: frozen dataclasses, the catalogue of names, ``to_dict``.

An :class:`AppSpec` only ever exists validated: build one with
:func:`agiledart.app.parse_spec` (YAML text, a file, a mapping) or the
:class:`agiledart.app.App` builder; both run the same checks. ``params`` mappings are
deep-frozen (read-only mappings, tuples for lists) and hold normalized values: defaults
are filled in (a window's ``slide_ms`` defaults to its ``size_ms``), so two specs that
mean the same thing compare equal. :meth:`AppSpec.to_dict` gives plain dicts and lists
(msgpack- and JSON-able) and ``parse_spec(spec.to_dict()) == spec``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agiledart.app.kinds import MERGE_OPERATORS, OPERATOR_KINDS, STATEFUL_OPERATORS

__all__ = [
    "AGGREGATES",
    "CHECKPOINT_MODES",
    "DATASETS",
    "DEAD_LETTER_CONNECTORS",
    "DEAD_LETTER_FIELDS",
    "DEAD_LETTER_PATH",
    "DEFAULT_PLACEMENT",
    "MAX_PANES_PER_WINDOW",
    "MAX_WINDOWS_PER_RECORD",
    "MERGE_OPERATORS",
    "OPERATOR_KINDS",
    "PLACEMENTS",
    "SINK_CONNECTORS",
    "SOURCE_CONNECTORS",
    "STATEFUL_OPERATORS",
    "AppSpec",
    "CheckpointSpec",
    "DeadLetterSpec",
    "OperatorSpec",
    "ScalingSpec",
    "SinkSpec",
    "SourceSpec",
    "freeze",
    "thaw",
]

AGGREGATES = ("count", "sum", "mean", "min", "max")
SOURCE_CONNECTORS = ("generator", "file", "mqtt", "http")
SINK_CONNECTORS = ("file", "mqtt", "stdout", "discard", "sql", "http")
DATASETS = ("urban", "taxi", "words", "counter")
#: Placement strategies (agiledart.placement): JOIN routing, RTR, RTR+RP and baselines.
PLACEMENTS = ("join-routing", "rtr", "rtr-rp", "cloud-only", "lb", "random")
DEFAULT_PLACEMENT = "join-routing"
CHECKPOINT_MODES = ("auto", "restart", "erasure", "replication")
#: an operator's ``on_error`` policies
ON_ERROR_POLICIES = ("count", "fail", "dead_letter")
#: the sink connectors an operator's ``dead_letter:`` may use
DEAD_LETTER_CONNECTORS = ("file", "mqtt")
#: the fields of a dead letter (one JSON object per record that raised); a dead-letter
#: file path may use ``{app}``, ``{op}`` and ``{peer}``, an mqtt topic any of these
DEAD_LETTER_FIELDS = ("app", "op", "peer", "error_type", "message", "record", "ts")
#: a dead-letter file's path when none is given (relative: under the app's output folder)
DEAD_LETTER_PATH = "dead-letters/{op}-{peer}.jsonl"
#: Sliding windows: at most this many windows hold one record (size_ms / slide_ms) ...
MAX_WINDOWS_PER_RECORD = 1000
#: ... and at most this many panes of gcd(size_ms, slide_ms) make one window.
MAX_PANES_PER_WINDOW = 100_000

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def freeze(value: Any) -> Any:
    """Deep-freeze plain data: dicts become read-only mappings, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Undo :func:`freeze`: plain dicts and lists, ready for msgpack or JSON."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceSpec:
    """A source pinned to a peer: ``connector`` is generator, file or mqtt."""

    id: str
    peer: str
    connector: str
    params: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "peer": self.peer,
            "connector": self.connector,
            "params": thaw(self.params),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetterSpec:
    """Where an operator with ``on_error: dead_letter`` writes the records it raised
    on: a ``file`` or ``mqtt`` sink's connector and parameters (``type:`` in the spec)."""

    connector: str
    params: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def sink(self, *, app: str, op: str, peer: str) -> SinkSpec:
        """The sink an instance of ``op`` on ``peer`` opens: a file path's ``{app}``,
        ``{op}`` and ``{peer}`` filled in."""
        params = dict(self.params)
        if self.connector == "file":
            path = str(params.get("path", DEAD_LETTER_PATH))
            for name, value in (("app", app), ("op", op), ("peer", peer)):
                path = path.replace("{" + name + "}", value)
            params["path"] = path
        return SinkSpec(
            id=f"{op}.dead_letter", peer=peer, connector=self.connector, inputs=(), params=params
        )

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.connector, **thaw(self.params)}


@dataclass(frozen=True, kw_only=True, slots=True)
class OperatorSpec:
    """One operator: built-in ``op``, optional ``fn`` reference, params and inputs."""

    id: str
    op: str
    inputs: tuple[str, ...]
    fn: str | None = None
    params: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    #: pins the operator to this peer (optional; placement decides otherwise)
    peer: str | None = None
    #: what a record that makes the operator raise does: ``count`` (dropped, counted
    #: and shown in status with the record), ``fail`` (the app fails, naming it) or
    #: ``dead_letter`` (counted, and written to :attr:`dead_letter`)
    on_error: str = "count"
    dead_letter: DeadLetterSpec | None = None

    @property
    def stateful(self) -> bool:
        return self.op in STATEFUL_OPERATORS

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "op": self.op}
        if self.fn is not None:
            d["fn"] = self.fn
        d["params"] = thaw(self.params)
        d["inputs"] = list(self.inputs)
        if self.peer is not None:
            d["peer"] = self.peer
        if self.on_error != "count":
            d["on_error"] = self.on_error
        if self.dead_letter is not None:
            d["dead_letter"] = self.dead_letter.to_dict()
        return d


@dataclass(frozen=True, kw_only=True, slots=True)
class SinkSpec:
    """A sink pinned to a peer: ``connector`` is file, mqtt, sql, http, stdout or discard."""

    id: str
    peer: str
    connector: str
    inputs: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "peer": self.peer,
            "connector": self.connector,
            "params": thaw(self.params),
            "inputs": list(self.inputs),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSpec:
    """Checkpoint settings (docs/recovery.md): barrier interval, policy, fragments m + k.

    ``mode``: ``restart`` (no state saved; stateless or short-lived apps), ``erasure``
    (snapshots split into ``m`` fragments, zfec-encoded to ``m + k``), ``replication``
    (``k + 1`` full copies), or ``auto`` (erasure coding when the app has a stateful
    operator and a source that does not end).
    """

    interval_ms: int = 10_000
    mode: str = "auto"
    m: int = 3
    k: int = 2

    def to_dict(self) -> dict[str, Any]:
        return {"interval_ms": self.interval_ms, "mode": self.mode, "m": self.m, "k": self.k}


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalingSpec:
    """Elastic scaling (paper §IV-C; docs/scaling.md): the ``scaling:`` block.

    Off unless ``enabled``; the health score and the controllers' would-be decisions
    are reported either way. ``target`` is f*, ``max_instances`` bounds the instances
    of one operator on one peer, ``cooldown_ms`` separates two changes, and the
    controllers decide every ``interval_ms``; a backlog should drain within
    ``latency_ms`` (the health model's L).
    """

    enabled: bool = False
    target: float = 0.9
    tolerance: float = 0.05
    max_instances: int = 4
    cooldown_ms: int = 5_000
    interval_ms: int = 1_000
    latency_ms: int = 5_000  #: a backlog should drain within this (the health model's L)

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "enabled": self.enabled,
            "target": self.target,
            "tolerance": self.tolerance,
            "max_instances": self.max_instances,
            "cooldown_ms": self.cooldown_ms,
            "interval_ms": self.interval_ms,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class AppSpec:
    """A validated application: the dataflow as a value."""

    name: str
    sources: tuple[SourceSpec, ...]
    operators: tuple[OperatorSpec, ...]
    sinks: tuple[SinkSpec, ...]
    placement: str = DEFAULT_PLACEMENT
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    params: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    scaling: ScalingSpec = field(default_factory=ScalingSpec)

    def node(self, node_id: str) -> SourceSpec | OperatorSpec | SinkSpec:
        """The source, operator or sink called ``node_id`` (KeyError if none)."""
        for group in (self.sources, self.operators, self.sinks):
            for n in group:
                if n.id == node_id:
                    return n
        raise KeyError(node_id)

    def operator(self, op_id: str) -> OperatorSpec:
        for o in self.operators:
            if o.id == op_id:
                return o
        raise KeyError(op_id)

    @property
    def stateful(self) -> bool:
        return any(o.op in STATEFUL_OPERATORS for o in self.operators)

    @property
    def finite(self) -> bool:
        """Whether every source ends (a file, or a generator or mqtt source with a ``count``)."""
        return all(s.connector == "file" or "count" in s.params for s in self.sources)

    @property
    def checkpointed(self) -> bool:
        """Whether the app cuts checkpoint epochs: mode erasure or replication, or auto
        with a stateful operator and a source that does not end."""
        cp = self.checkpoint
        if cp.mode == "restart":
            return False
        if cp.mode == "auto":
            endless = any(
                s.connector in ("mqtt", "http")
                or (s.connector == "generator" and "count" not in s.params)
                for s in self.sources
            )
            return any(o.stateful for o in self.operators) and endless
        return True

    def to_dict(self) -> dict[str, Any]:
        """Plain data for storage; ``parse_spec(spec.to_dict()) == spec``."""
        d: dict[str, Any] = {
            "name": self.name,
            "placement": self.placement,
            "checkpoint": self.checkpoint.to_dict(),
        }
        if self.params:
            d["params"] = thaw(self.params)
        if self.scaling != ScalingSpec():
            d["scaling"] = self.scaling.to_dict()
        d["sources"] = [s.to_dict() for s in self.sources]
        d["operators"] = [o.to_dict() for o in self.operators]
        d["sinks"] = [s.to_dict() for s in self.sinks]
        return d
