"""Validation of ``fn`` references (format, built-in name, kind and parameters)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from agiledart.app.builtins import BUILTINS
from agiledart.app.errors import Problem
from agiledart.app.functions import BUILTIN_PREFIX, FN_REF_RE
from agiledart.app.schema import did_you_mean

__all__ = ["check_fn"]


def check_fn(
    op_path: str, fn: Any, op: str, params: Mapping[str, Any], problems: list[Problem]
) -> None:
    """Report what is wrong with the ``fn`` of the operator at ``op_path`` (kind ``op``)."""
    path = f"{op_path}.fn"
    if not isinstance(fn, str):
        problems.append(Problem(path, f"must be a string '<code_id>:<function>', got {fn!r}"))
        return
    m = FN_REF_RE.match(fn)
    if m is None:
        problems.append(Problem(path, _format_hint(fn)))
        return
    if m.group(1) != BUILTIN_PREFIX:
        return  # registered code: resolved (and checked) by the code cache at deploy time
    name = m.group(2)
    b = BUILTINS.get(name)
    suitable = sorted(n for n, x in BUILTINS.items() if x.kind == op)
    if b is None:
        hint = did_you_mean(name, list(BUILTINS))
        problems.append(
            Problem(
                path,
                f"unknown built-in function {name!r}{hint}; {op} built-ins: "
                f"{', '.join(suitable) or 'none'}",
            )
        )
        return
    if b.kind != op:
        problems.append(
            Problem(
                path,
                f"builtin:{name} is a {b.kind} function, not a {op} one; {op} built-ins: "
                f"{', '.join(suitable) or 'none'}",
            )
        )
        return
    sig = inspect.signature(b.factory)
    unknown = [p for p in params if p not in sig.parameters]
    for p in unknown:
        hint = did_you_mean(p, list(sig.parameters))
        takes = ", ".join(sig.parameters) or "no parameters"
        problems.append(
            Problem(
                f"{op_path}.params.{p}", f"unknown parameter{hint}; builtin:{name} takes: {takes}"
            )
        )
    missing = [
        n
        for n, p in sig.parameters.items()
        if p.default is inspect.Parameter.empty and n not in params
    ]
    for n in missing:
        problems.append(Problem(f"{op_path}.params.{n}", f"missing; builtin:{name} needs it"))
    if unknown or missing:
        return
    try:
        b.factory(**params)
    except (TypeError, ValueError, AttributeError) as e:
        problems.append(Problem(f"{op_path}.params", f"builtin:{name} rejects them: {e}"))


def _format_hint(fn: str) -> str:
    base = (
        f"bad function reference {fn!r}: use '<code_id>:<function>' (the 64-character "
        "lowercase hex code id printed by 'agiledart register') or 'builtin:<name>'"
    )
    code, sep, func = fn.partition(":")
    if not sep:
        return base + "; the ':' is missing"
    if code != BUILTIN_PREFIX and len(code) != 64:
        return base + f"; the code id has {len(code)} characters, not 64"
    if code != BUILTIN_PREFIX and code.lower() != code:
        return base + "; write the code id in lowercase"
    if not func.isidentifier():
        return base + f"; {func!r} is not a Python function name"
    return base + "; the code id must be hexadecimal"
