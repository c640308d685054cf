"""Parse and validate an app spec completely, collecting every problem.

Nothing is deployed from a spec that has not passed here. Every problem names its
field path (``operators[2].params.size_ms``), says what is wrong and how to fix it;
all of them are raised together as one :class:`~agiledart.app.errors.SpecError`.
Order of work: ``--set`` overrides, ``${name}`` substitution, per-field checks
(with defaults filled in), then graph checks (inputs, arity, cycles, reachability).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from agiledart.app.binding import apply_into, substitute
from agiledart.app.errors import Problem, SpecError
from agiledart.app.graph import find_cycle, reaches
from agiledart.app.nodes import ID_RE, NodeParser
from agiledart.app.schema import (
    CHECKPOINT_PARAMS,
    SCALING_PARAMS,
    check_params,
    check_plain,
    did_you_mean,
)
from agiledart.app.spec import (
    DEFAULT_PLACEMENT,
    PLACEMENTS,
    AppSpec,
    CheckpointSpec,
    ScalingSpec,
    freeze,
)

__all__ = ["ID_RE", "load_spec", "parse_spec"]

_TOP_KEYS = (
    "name",
    "sources",
    "operators",
    "sinks",
    "placement",
    "checkpoint",
    "params",
    "scaling",
)

Overrides = Iterable[str] | Mapping[str, Any]


def parse_spec(
    source: str | bytes | Mapping[str, Any],
    *,
    overrides: Overrides = (),
    known_peers: Collection[str] | None = None,
) -> AppSpec:
    """Validate an app spec given as YAML text or as a mapping (e.g. ``to_dict()``).

    ``overrides`` are ``--set`` bindings (see :mod:`agiledart.app.binding`);
    ``known_peers``, when given, are the peer names of the ring: sources and sinks
    pinned elsewhere are reported.
    """
    try:
        if isinstance(source, str | bytes):
            try:
                raw: Any = yaml.safe_load(source)
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                problem = getattr(e, "problem", None) or str(e)
                raise SpecError([Problem("", f"not valid YAML{where}: {problem}")]) from None
        else:
            raw = source
        return _Parser(known_peers).run(raw, overrides)
    except RecursionError:  # YAML or maps nested beyond Python's recursion limit
        raise SpecError([Problem("", "nested too deeply to be an app spec")]) from None


def load_spec(
    path: str | os.PathLike[str],
    *,
    overrides: Overrides = (),
    known_peers: Collection[str] | None = None,
) -> AppSpec:
    """Read and validate a YAML app spec file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError([Problem("", f"cannot read {os.fspath(path)!r}: {e.strerror}")]) from None
    return parse_spec(text, overrides=overrides, known_peers=known_peers)


class _Parser(NodeParser):
    """Top-level fields and the graph; per-node checks come from NodeParser."""

    def run(self, raw: Any, overrides: Overrides) -> AppSpec:
        if not isinstance(raw, Mapping):
            self.add("", "an app spec is a mapping with name, sources, operators and sinks")
            raise SpecError(self.problems)
        raw = dict(raw)
        self.problems += apply_into(raw, overrides)
        for key in raw:
            if key not in _TOP_KEYS:
                hint = did_you_mean(str(key), _TOP_KEYS)
                self.add(str(key), f"unknown field{hint}; an app spec has: {', '.join(_TOP_KEYS)}")
        params = self.app_params(raw.get("params"))
        body = {k: substitute(v, params, k, self.problems) for k, v in raw.items() if k != "params"}
        name = self.name(body.get("name"))
        placement = body.get("placement", DEFAULT_PLACEMENT)
        if placement not in PLACEMENTS:
            hint = did_you_mean(str(placement), PLACEMENTS)
            self.add("placement", f"unknown placement {placement!r}{hint}; use one of {PLACEMENTS}")
        checkpoint = self.checkpoint(body.get("checkpoint"))
        scaling = self.scaling(body.get("scaling"))
        sources = [self.source(i, s) for i, s in enumerate(self.section(body, "sources"))]
        operators = [self.operator(i, o) for i, o in enumerate(self.section(body, "operators"))]
        sinks = [self.sink(i, s) for i, s in enumerate(self.section(body, "sinks"))]
        self.graph()
        if self.problems:
            raise SpecError(_first_per_field(self.problems), name=name)
        return AppSpec(
            name=name,
            sources=tuple(sources),
            operators=tuple(operators),
            sinks=tuple(sinks),
            placement=str(placement),
            checkpoint=checkpoint,
            params=freeze(params),
            scaling=scaling,
        )

    def app_params(self, raw: Any) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            self.add("params", "must be a mapping of parameter name to default value")
            return {}
        out: dict[str, Any] = {}
        for k, v in raw.items():
            if not (isinstance(k, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)):
                self.add(f"params.{k}", "parameter names are identifiers (letters, digits, _)")
                continue
            check_plain(v, f"params.{k}", self.problems)
            out[k] = v
        return out

    def name(self, raw: Any) -> str:
        if raw is None:
            self.add("name", "missing; give the app a name, e.g. name: urban-sensing")
            return ""
        if not (isinstance(raw, str) and ID_RE.match(raw)):
            self.add("name", f"must be letters, digits, '-' or '_' (1-64), got {raw!r}")
            return str(raw)
        return raw

    def checkpoint(self, raw: Any) -> CheckpointSpec:
        if raw is None:
            return CheckpointSpec()
        if not isinstance(raw, Mapping):
            self.add("checkpoint", "must be a mapping, e.g. {interval_ms: 10000, mode: auto}")
            return CheckpointSpec()
        vals = check_params(raw, CHECKPOINT_PARAMS, "checkpoint", self.problems, owner="checkpoint")
        try:
            return CheckpointSpec(**vals)
        except TypeError:  # pragma: no cover - check_params filled every field
            return CheckpointSpec()

    def scaling(self, raw: Any) -> ScalingSpec:
        if raw is None:
            return ScalingSpec()
        if not isinstance(raw, Mapping):
            self.add("scaling", "must be a mapping, e.g. {enabled: true, target: 0.9}")
            return ScalingSpec()
        vals = check_params(raw, SCALING_PARAMS, "scaling", self.problems, owner="scaling")
        target, tol = vals.get("target", 0.9), vals.get("tolerance", 0.05)
        if "target" in vals and not target > 0:
            self.add("scaling.target", f"must be a health score in (0, 1), got {target!r}")
            return ScalingSpec()
        if "target" in vals and "tolerance" in vals and not target - tol > 0:
            self.add("scaling.tolerance", f"must be below target ({target}), got {tol!r}")
            return ScalingSpec()
        try:
            return ScalingSpec(**vals)
        except TypeError:  # pragma: no cover - check_params filled every field
            return ScalingSpec()

    def section(self, body: Mapping[str, Any], key: str) -> list[Any]:
        raw = body.get(key)
        if raw is None:
            if key != "operators":
                self.add(key, f"missing; an app needs at least one entry under {key}")
            return []
        if not isinstance(raw, list):
            self.add(key, f"must be a list of {key[:-1]} mappings")
            return []
        if not raw and key != "operators":
            self.add(key, f"is empty; an app needs at least one {key[:-1]}")
        return raw

    def graph(self) -> None:
        streams = [i for i, k in self.kinds.items() if k != "sink"]
        graph: dict[str, list[str]] = {}
        for node_id, (path, ins) in self.inputs.items():
            ok: list[str] = []
            for x in ins:
                kind = self.kinds.get(x)
                if kind is None:
                    hint = did_you_mean(x, streams)
                    self.add(
                        f"{path}.inputs",
                        f"unknown input {x!r}{hint}; streams: {', '.join(streams) or 'none'}",
                    )
                    self.broken_inputs = True
                elif kind == "sink":
                    self.add(f"{path}.inputs", f"{x!r} is a sink; sinks produce no stream")
                    self.broken_inputs = True
                else:
                    ok.append(x)
            graph[node_id] = ok
        cycle = find_cycle(graph)
        if cycle is not None:
            self.add(
                f"{self.inputs[cycle[0]][0]}.inputs",
                f"cycle {' -> '.join(cycle)}; a dataflow must be acyclic: remove one of "
                "these inputs",
            )
            return
        if self.broken_inputs:
            return
        sinks = [i for i, k in self.kinds.items() if k == "sink"]
        live = reaches(graph, sinks)
        for node_id, kind in self.kinds.items():
            if node_id in live:
                continue
            path = self.ids[node_id]
            if kind == "source":
                self.add(
                    path,
                    f"source {node_id!r} reaches no sink: connect it through operators to "
                    "a sink's inputs, or remove it",
                )
            elif kind == "operator":
                self.add(
                    path,
                    f"the output of {node_id!r} reaches no sink: list it (or an operator "
                    "downstream of it) in a sink's inputs, or remove it",
                )


def _first_per_field(problems: list[Problem]) -> list[Problem]:
    """One problem per field, the first found: a parameter without a value makes the
    field it fills invalid too, and saying so again is noise. Each bad ``--set`` is a
    problem of its own."""
    seen: set[str] = set()
    out = []
    for p in problems:
        if p.path not in seen or p.path == "--set":
            seen.add(p.path)
            out.append(p)
    return out
