"""Parameter binding: ``--set KEY=VALUE`` overrides and ``${name}`` substitution.

Overrides address the raw spec by a dotted path, naming list entries by their ``id``::

    name=my-app                              placement=random
    checkpoint.interval_ms=5000              params.threshold=30
    scaling.enabled=true                     scaling.max_instances=2
    sources.readings.params.rate=500         sinks.out.peer=gateway-2
    operators.per-city.params.size_ms=10000  operators.hot.fn=builtin:is_hot

``sources[0].params.rate=500`` (an index) works too. ``VALUE`` is read as a YAML
scalar or flow collection: ``500`` is an integer, ``true`` a bool, ``[a, b]`` a list,
``'"500"'`` the string ``500``; an empty value is null. Overrides apply in order, the
last one wins; a path that names no existing node, or an undeclared top-level
parameter, is an error.

Top-level ``params`` declares named parameters with defaults (``null`` means "must be
set"). Any string in the spec may use them: a string that is exactly ``${name}`` takes
the parameter's value with its type (``rate: ${rate}`` stays a number); ``${name}``
inside a longer string is replaced by the value's text (``path: out-${city}.jsonl``).
Substitution is a single pass (values are not themselves expanded).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from agiledart.app.errors import Problem, SpecError
from agiledart.app.schema import did_you_mean

__all__ = ["apply_overrides", "parse_override", "substitute"]

_SECTIONS = ("sources", "operators", "sinks")
_TOP = ("name", "placement", "checkpoint", "scaling", "params")
_PARAM_RE = re.compile(r"\$\{([^}]*)\}")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INDEX_RE = re.compile(r"^([A-Za-z_]+)\[(\d+)\]$")


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=VALUE"`` -> ``("a.b", value)`` with the value read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        msg = f"bad --set {text!r}: expected KEY=VALUE, e.g. sources.readings.params.rate=500"
        raise SpecError([Problem("--set", msg)])
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def apply_overrides(
    raw: Mapping[str, Any], overrides: Iterable[str] | Mapping[str, Any]
) -> dict[str, Any]:
    """A deep copy of ``raw`` with the overrides applied; SpecError lists bad ones."""
    out = copy.deepcopy(dict(raw))
    problems = apply_into(out, overrides)
    if problems:
        raise SpecError(problems, name=str(out.get("name", "")))
    return out


def apply_into(raw: dict[str, Any], overrides: Iterable[str] | Mapping[str, Any]) -> list[Problem]:
    """Apply overrides to ``raw`` in place; return the problems instead of raising."""
    pairs: list[tuple[str, Any]] = []
    problems: list[Problem] = []
    if isinstance(overrides, Mapping):
        pairs = list(overrides.items())
    else:
        for text in overrides:
            try:
                pairs.append(parse_override(text))
            except SpecError as e:
                problems += e.problems
    for key, value in pairs:
        err = _set(raw, key, value)
        if err is not None:
            problems.append(Problem(f"--set {key}", err))
    return problems


def _set(raw: dict[str, Any], key: str, value: Any) -> str | None:
    parts = key.split(".")
    head = parts[0]
    m = _INDEX_RE.match(head)
    if m is not None:  # sources[0].params.rate
        head, parts = m.group(1), [m.group(1), m.group(2), *parts[1:]]
    if head in _TOP:
        if head == "params":
            declared = raw.get("params")
            if len(parts) < 2 or not isinstance(declared, dict) or parts[1] not in declared:
                names = list(declared) if isinstance(declared, dict) else []
                what = parts[1] if len(parts) > 1 else ""
                return (
                    f"no declared parameter {what!r}{did_you_mean(what, names)}; declared: "
                    f"{', '.join(names) or 'none'} (declare it under top-level params)"
                )
        return _assign(raw, parts, value)
    if head not in _SECTIONS:
        return (
            f"unknown section {head!r}; overrides start with one of {', '.join(_SECTIONS + _TOP)}"
        )
    if len(parts) < 3:
        return f"name a field, e.g. {head}.<id>.params.<name>=VALUE"
    nodes = raw.get(head)
    if not isinstance(nodes, list):
        return f"the spec has no {head} list"
    ref = parts[1]
    if ref.isdigit():
        idx = int(ref)
        if idx >= len(nodes):
            return f"{head} has {len(nodes)} entries, no index {idx}"
        node = nodes[idx]
    else:
        found = [n for n in nodes if isinstance(n, dict) and n.get("id") == ref]
        if not found:
            ids = [str(n.get("id")) for n in nodes if isinstance(n, dict)]
            return f"no {head[:-1]} with id {ref!r}{did_you_mean(ref, ids)}; ids: {', '.join(ids)}"
        node = found[0]
    if not isinstance(node, dict):
        return f"{head}[{ref}] is not a mapping"
    return _assign(node, parts[2:], value)


def _assign(target: dict[str, Any], parts: list[str], value: Any) -> str | None:
    for part in parts[:-1]:
        nxt = target.get(part)
        if nxt is None:
            nxt = target[part] = {}
        if not isinstance(nxt, dict):
            return f"{part!r} is not a mapping, cannot set {parts[-1]!r} inside it"
        target = nxt
    target[parts[-1]] = value
    return None


def substitute(value: Any, params: Mapping[str, Any], path: str, problems: list[Problem]) -> Any:
    """``value`` with every ``${name}`` replaced from ``params`` (see module doc)."""
    if isinstance(value, str):
        if "${" not in value:
            return value
        whole = _PARAM_RE.fullmatch(value)
        if whole is not None:
            return _lookup(whole.group(1), params, path, problems)

        def text(m: re.Match[str]) -> str:
            v = _lookup(m.group(1), params, path, problems)
            if isinstance(v, bool):
                return "true" if v else "false"
            return "" if v is None else str(v)

        return _PARAM_RE.sub(text, value)
    if isinstance(value, dict):
        return {k: substitute(v, params, f"{path}.{k}", problems) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, params, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    return value


def _lookup(name: str, params: Mapping[str, Any], path: str, problems: list[Problem]) -> Any:
    if not _NAME_RE.match(name):
        problems.append(Problem(path, f"bad parameter reference ${{{name}}}: use ${{name}}"))
        return None
    if name not in params:
        hint = did_you_mean(name, list(params))
        problems.append(
            Problem(
                path,
                f"unknown parameter ${{{name}}}{hint}; declare it under top-level params "
                f"(declared: {', '.join(params) or 'none'})",
            )
        )
        return None
    v = params[name]
    if v is None:
        problems.append(
            Problem(
                path,
                f"parameter {name!r} has no value: pass --set params.{name}=VALUE "
                "or give it a default under params",
            )
        )
    return v
