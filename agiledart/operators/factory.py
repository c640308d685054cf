"""Build an operator from its validated spec, resolving its ``fn`` reference."""

from __future__ import annotations

from agiledart.app.errors import OperatorError
from agiledart.app.functions import Resolver, bind
from agiledart.app.kinds import FN_OPERATORS
from agiledart.app.spec import OperatorSpec
from agiledart.operators.aggregate import Aggregate
from agiledart.operators.base import Operator
from agiledart.operators.dedupe import Dedupe
from agiledart.operators.join import Join
from agiledart.operators.stateless import Filter, FlatMap, KeyBy, Map, Union
from agiledart.operators.topk import TopK
from agiledart.operators.window import Window

__all__ = ["build_operator"]


def build_operator(
    spec: OperatorSpec, resolve: Resolver, *, state: bytes | None = None
) -> Operator:
    """A fresh operator for ``spec``, or one resumed from ``state`` (its snapshot).

    ``resolve`` maps a ``fn`` reference to a callable (see
    :func:`agiledart.app.functions.builtin_resolver`); the operator's ``params`` are
    bound to user functions once, here.
    """
    p = dict(spec.params)
    op: Operator
    if spec.op in FN_OPERATORS or (spec.op == "key_by" and spec.fn):
        if spec.fn is None:
            msg = f"operator {spec.id!r} ({spec.op}) has no fn"
            raise OperatorError(msg)
        fn = bind(resolve(spec.fn), p)
        if spec.op == "map":
            op = Map(fn)
        elif spec.op == "filter":
            op = Filter(fn)
        elif spec.op == "flat_map":
            op = FlatMap(fn)
        else:
            op = KeyBy(fn=fn)
    elif spec.op == "key_by":
        key = p["key"]
        op = KeyBy(fields=[key] if isinstance(key, str) else list(key))
    elif spec.op == "union":
        op = Union(inputs=len(spec.inputs))
    elif spec.op == "window":
        op = Window(
            size_ms=p["size_ms"],
            slide_ms=p.get("slide_ms"),
            aggregate=p["aggregate"],
            key=p.get("key"),
            field=p.get("field"),
        )
    elif spec.op == "aggregate":
        op = Aggregate(aggregate=p["aggregate"], key=p.get("key"), field=p.get("field"))
    elif spec.op == "join":
        op = Join(key=p["key"], window_ms=p["window_ms"])
    elif spec.op == "top_k":
        op = TopK(k=p["k"], by=p["by"], window_ms=p["window_ms"])
    elif spec.op == "dedupe":
        op = Dedupe(key=p["key"], ttl_ms=p["ttl_ms"])
    else:
        msg = f"operator {spec.id!r}: unknown op {spec.op!r}"
        raise OperatorError(msg)
    op.keep_failed = spec.on_error == "dead_letter"
    if state is not None:
        op.restore(state)
    return op
