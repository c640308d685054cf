"""Function references: ``fn: "<code_id>:<function>"`` or ``fn: "builtin:<name>"``.

A *resolver* turns a reference into a callable. The registered-code machinery (Pluto,
:mod:`agiledart.runtime.code`) provides one for code ids; :func:`builtin_resolver` handles the
``builtin:`` library (:mod:`agiledart.app.builtins`) and hands anything else to the
fallback it wraps. Per-op contracts of the resolved function:

========  ===========================================  ==================================
op        called as                                    returns
========  ===========================================  ==================================
map       ``fn(record)``                               a new record (never mutate input)
filter    ``fn(record)``                               truthy to keep the record
flat_map  ``fn(record)``                               an iterable of records
key_by    ``fn(record)``                               the key (str, int, float, bool, None)
========  ===========================================  ==================================

An operator's ``params`` are bound once, at build time (:func:`bind`): a function
marked with :func:`factory` is called as ``fn(**params)`` and must return the
per-record function (fast: no per-record keyword handling); any other function is
wrapped as ``functools.partial(fn, **params)``. Functions must not mutate the records
they are given: a batch may be shared by several consumers. Nor should they keep state
between records: a peer's worker pool may run consecutive batches of one operator in
different worker processes (state belongs in window, aggregate, join, dedupe and top-k,
whose state the runtime moves with them).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agiledart.app.errors import FunctionError

__all__ = [
    "BUILTIN_PREFIX",
    "FN_REF_RE",
    "Resolver",
    "bind",
    "builtin_resolver",
    "factory",
    "is_factory",
    "parse_fn_ref",
]

Resolver = Callable[[str], Callable[..., Any]]
BUILTIN_PREFIX = "builtin"
#: ``<64 lowercase hex>:<identifier>`` or ``builtin:<identifier>``.
FN_REF_RE = re.compile(r"^(builtin|[0-9a-f]{64}):([A-Za-z_][A-Za-z0-9_]*)$")
_FACTORY_MARK = "__agiledart_factory__"

F = TypeVar("F", bound=Callable[..., Any])


def factory(fn: F) -> F:
    """Mark ``fn`` as a factory: ``fn(**params)`` returns the per-record function."""
    setattr(fn, _FACTORY_MARK, True)
    return fn


def is_factory(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, _FACTORY_MARK, False))


def parse_fn_ref(ref: str) -> tuple[str, str]:
    """Split a reference into ``(code_id or "builtin", function name)``."""
    m = FN_REF_RE.match(ref)
    if m is None:
        msg = (
            f"bad function reference {ref!r}: expected '<code_id>:<function>' with a "
            "64-character lowercase hex code id (from 'agiledart register'), or "
            "'builtin:<name>'"
        )
        raise FunctionError(msg)
    return m.group(1), m.group(2)


def bind(fn: Callable[..., Any], params: Mapping[str, Any]) -> Callable[..., Any]:
    """The per-record function for ``fn`` with the operator's ``params`` bound."""
    if is_factory(fn):
        return fn(**params)  # type: ignore[no-any-return]
    if params:
        return functools.partial(fn, **params)
    return fn


def _no_code(ref: str) -> Callable[..., Any]:
    msg = (
        f"cannot resolve {ref!r}: registered code needs a code resolver (a peer's code "
        "cache); only 'builtin:' functions resolve locally"
    )
    raise FunctionError(msg)


def builtin_resolver(fallback: Resolver | None = None) -> Resolver:
    """A resolver for ``builtin:<name>`` that passes other references to ``fallback``."""
    from agiledart.app.builtins import BUILTINS

    other = fallback or _no_code

    def resolve(ref: str) -> Callable[..., Any]:
        prefix, name = parse_fn_ref(ref)
        if prefix != BUILTIN_PREFIX:
            return other(ref)
        try:
            return BUILTINS[name].factory
        except KeyError:
            msg = f"unknown built-in function {ref!r}; built-ins: {', '.join(sorted(BUILTINS))}"
            raise FunctionError(msg) from None

    return resolve
