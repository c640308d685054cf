"""A Python builder for app specs, producing the same validated value as YAML.

::

    spec = (
        App("urban-sensing")
        .source("readings", peer="sensor-1", connector="generator",
                dataset="urban", rate=2000, count=100_000, seed=7)
        .filter("hot", "builtin:is_hot", threshold=30)
        .window("per-city", size_ms=5000, key="city", aggregate="mean", field="value")
        .sink("out", peer="gateway-1", connector="file", path="out.jsonl")
        .build()
    )

:meth:`App.source` returns a :class:`Stream`; each operator method returns the
:class:`Stream` it creates; :meth:`Stream.sink` returns the :class:`App` so another
source or :meth:`App.build` can follow. Merges: ``a.union("all", b)``,
``a.join("j", b, key="cell", window_ms=60_000)``. Nothing is checked until
:meth:`App.build`, which runs the YAML parser's validation on :meth:`App.to_dict`, so
mistakes are reported with the same field paths (``operators[1].params.size_ms``).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from agiledart.app.parse import parse_spec
from agiledart.app.spec import AppSpec

__all__ = ["App", "Stream"]


class App:
    """An app under construction (mutable); :meth:`build` gives the frozen spec."""

    def __init__(
        self,
        name: str,
        *,
        placement: str | None = None,
        checkpoint: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self._top: dict[str, Any] = {}
        if placement is not None:
            self._top["placement"] = placement
        if checkpoint is not None:
            self._top["checkpoint"] = dict(checkpoint)
        if params is not None:
            self._top["params"] = dict(params)
        self._sources: list[dict[str, Any]] = []
        self._operators: list[dict[str, Any]] = []
        self._sinks: list[dict[str, Any]] = []

    def source(self, node_id: str, /, *, peer: str, connector: str, **params: Any) -> Stream:
        self._sources.append(
            {"id": node_id, "peer": peer, "connector": connector, "params": params}
        )
        return Stream(self, node_id)

    def union(self, node_id: str, /, *streams: Stream) -> Stream:
        return self._op(node_id, "union", [s.id for s in streams], None, {})

    def join(
        self, node_id: str, /, left: Stream, right: Stream, *, key: str, window_ms: int
    ) -> Stream:
        return self._op(
            node_id, "join", [left.id, right.id], None, {"key": key, "window_ms": window_ms}
        )

    def sink(
        self, node_id: str, /, inputs: Iterable[Stream], *, peer: str, connector: str, **params: Any
    ) -> App:
        self._sinks.append(
            {
                "id": node_id,
                "peer": peer,
                "connector": connector,
                "params": params,
                "inputs": [s.id for s in inputs],
            }
        )
        return self

    def _op(
        self,
        node_id: str,
        op: str,
        inputs: list[str],
        fn: str | None,
        params: Mapping[str, Any],
        *,
        keep_none: bool = False,
    ) -> Stream:
        d: dict[str, Any] = {"id": node_id, "op": op}
        if fn is not None:
            d["fn"] = fn
        d["params"] = {k: v for k, v in params.items() if keep_none or v is not None}
        d["inputs"] = inputs
        self._operators.append(d)
        return Stream(self, node_id)

    def to_dict(self) -> dict[str, Any]:
        """The raw (unvalidated) spec, as YAML would hold it."""
        d: dict[str, Any] = {"name": self.name, **self._top}
        d["sources"] = self._sources
        d["operators"] = self._operators
        d["sinks"] = self._sinks
        return copy.deepcopy(d)

    def build(
        self,
        *,
        known_peers: Collection[str] | None = None,
        overrides: Iterable[str] | Mapping[str, Any] = (),
    ) -> AppSpec:
        """Validate and freeze; raises SpecError listing every problem."""
        return parse_spec(self.to_dict(), overrides=overrides, known_peers=known_peers)


class Stream:
    """The output of a source or operator, to hang further operators on."""

    __slots__ = ("app", "id")

    def __init__(self, app: App, node_id: str) -> None:
        self.app = app
        self.id = node_id

    def map(self, node_id: str, fn: str, /, **params: Any) -> Stream:
        return self.app._op(node_id, "map", [self.id], fn, params, keep_none=True)

    def filter(self, node_id: str, fn: str, /, **params: Any) -> Stream:
        return self.app._op(node_id, "filter", [self.id], fn, params, keep_none=True)

    def flat_map(self, node_id: str, fn: str, /, **params: Any) -> Stream:
        return self.app._op(node_id, "flat_map", [self.id], fn, params, keep_none=True)

    def key_by(
        self, node_id: str, /, *, key: str | list[str] | None = None, fn: str | None = None
    ) -> Stream:
        return self.app._op(node_id, "key_by", [self.id], fn, {"key": key})

    def window(
        self,
        node_id: str,
        /,
        *,
        size_ms: int,
        aggregate: str,
        slide_ms: int | None = None,
        key: str | None = None,
        field: str | None = None,
    ) -> Stream:
        params = {
            "size_ms": size_ms,
            "slide_ms": slide_ms,
            "key": key,
            "aggregate": aggregate,
            "field": field,
        }
        return self.app._op(node_id, "window", [self.id], None, params)

    def aggregate(
        self, node_id: str, /, *, aggregate: str, key: str | None = None, field: str | None = None
    ) -> Stream:
        params = {"key": key, "aggregate": aggregate, "field": field}
        return self.app._op(node_id, "aggregate", [self.id], None, params)

    def top_k(self, node_id: str, /, *, k: int, by: str, window_ms: int) -> Stream:
        params = {"k": k, "by": by, "window_ms": window_ms}
        return self.app._op(node_id, "top_k", [self.id], None, params)

    def dedupe(self, node_id: str, /, *, key: str, ttl_ms: int) -> Stream:
        return self.app._op(node_id, "dedupe", [self.id], None, {"key": key, "ttl_ms": ttl_ms})

    def join(self, node_id: str, /, other: Stream, *, key: str, window_ms: int) -> Stream:
        return self.app.join(node_id, self, other, key=key, window_ms=window_ms)

    def union(self, node_id: str, /, *others: Stream) -> Stream:
        return self.app.union(node_id, self, *others)

    def sink(self, node_id: str, /, *, peer: str, connector: str, **params: Any) -> App:
        return self.app.sink(node_id, [self], peer=peer, connector=connector, **params)
