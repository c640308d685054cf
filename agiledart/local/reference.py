"""Expected sink outputs of an app, computed in plain Python over its whole input.

Independent of the streaming operators on purpose: windows are computed by grouping
every record into every window that contains it, joins by grouping both sides,
top-k by sorting whole windows, running aggregates and dedupe by one sequential pass.
Equal to what a correct run produces when no record is late (each source stays within
its ``out_of_order_ms``; :func:`reference_outputs` checks this at the sources).

Order: windowed outputs come in ``(window_end, key)`` order like the operators'; where
a stream merges several inputs (a union, a sink with several inputs) the reference
concatenates them, so compare those with :func:`canonical` (order-insensitive,
exact). Float sums use :func:`math.fsum`, as the window operator does, so equal inputs
give bit-identical values in any order.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from agiledart.app.errors import ExecutionError
from agiledart.app.functions import Resolver, bind, builtin_resolver
from agiledart.app.graph import topological_order
from agiledart.app.kinds import FN_OPERATORS
from agiledart.app.spec import AppSpec, OperatorSpec
from agiledart.operators.base import Record, order_key
from agiledart.operators.stateless import KEY_SEPARATOR

__all__ = ["canonical", "reference_outputs", "source_records"]


def canonical(records: list[Record]) -> list[Record]:
    """``records`` sorted by their canonical JSON text: equal lists <=> equal multisets."""
    return sorted(records, key=_json)


def _json(r: Any) -> str:
    return json.dumps(r, sort_keys=True, separators=(",", ":"), default=repr)


def source_records(
    app: AppSpec, *, base_dir: str | os.PathLike[str] | None = None
) -> dict[str, list[Record]]:
    """Every source's records, in order (finite sources only)."""
    from agiledart.local.executor import source_batches

    out: dict[str, list[Record]] = {}
    for s in app.sources:
        out[s.id] = [r for b in source_batches(s, batch_size=4096, base_dir=base_dir) for r in b]
    return out


def reference_outputs(
    app: AppSpec,
    resolve: Resolver | None = None,
    *,
    inputs: Mapping[str, list[Record]] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> dict[str, list[Record]]:
    """``{sink id: expected records}`` for the app's inputs (generated if not given)."""
    resolve = resolve or builtin_resolver()
    streams: dict[str, list[Record]] = dict(
        inputs if inputs is not None else source_records(app, base_dir=base_dir)
    )
    for s in app.sources:
        _check_order(s.id, streams[s.id], s.params.get("out_of_order_ms", 0))
    ops = {o.id: o for o in app.operators}
    sinks = {s.id: s for s in app.sinks}
    for node in topological_order(app):
        if node in ops:
            o = ops[node]
            streams[node] = _compute(o, [streams[i] for i in o.inputs], resolve)
        elif node in sinks:
            streams[node] = [r for i in sinks[node].inputs for r in streams[i]]
    return {s: streams[s] for s in sinks}


def _check_order(sid: str, records: list[Record], lag: int) -> None:
    top = None
    for n, r in enumerate(records):
        ts = r["ts"]
        if top is not None and ts < top - lag:
            msg = (
                f"source {sid!r}: record {n} (ts {ts}) is more than {lag} ms behind {top}; "
                "the reference assumes no late records"
            )
            raise ExecutionError(msg)
        top = ts if top is None or ts > top else top


def _compute(o: OperatorSpec, ins: list[list[Record]], resolve: Resolver) -> list[Record]:
    p = o.params
    xs = ins[0]
    if o.op in FN_OPERATORS or (o.op == "key_by" and o.fn):
        f = bind(resolve(str(o.fn)), dict(p))
        return _apply(o.op, f, xs)
    if o.op == "key_by":
        fields = [p["key"]] if isinstance(p["key"], str) else list(p["key"])

        def key_of(r: Record) -> Any:
            if len(fields) == 1:
                return r[fields[0]]
            return KEY_SEPARATOR.join(str(r[f]) for f in fields)

        return _apply("key_by", key_of, xs)
    if o.op == "union":
        return [r for stream in ins for r in stream]
    if o.op == "window":
        return _windows(
            xs, p["size_ms"], p["slide_ms"], p.get("key"), p["aggregate"], p.get("field")
        )
    if o.op == "aggregate":
        return _running(xs, p.get("key"), p["aggregate"], p.get("field"))
    if o.op == "join":
        return _join(ins[0], ins[1], p["key"], p["window_ms"])
    if o.op == "top_k":
        return _top_k(xs, p["k"], p["by"], p["window_ms"])
    if o.op == "dedupe":
        return _dedupe(xs, p["key"], p["ttl_ms"])
    msg = f"no reference for op {o.op!r}"
    raise ExecutionError(msg)


def _apply(op: str, f: Callable[[Record], Any], xs: list[Record]) -> list[Record]:
    out: list[Record] = []
    for r in xs:
        try:
            if op == "map":
                out.append(f(r))
            elif op == "filter":
                if f(r):
                    out.append(r)
            elif op == "flat_map":
                out.extend(f(r))
            else:
                out.append({**r, "key": f(r)})
        except Exception:  # bad records are dropped, as the operators do
            continue
    return out


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _aggregate(agg: str, values: list[Any]) -> Any:
    if agg == "count":
        return len(values)
    if agg == "min":
        return min(values)
    if agg == "max":
        return max(values)
    total = sum(values) if all(type(v) is int for v in values) else math.fsum(values)
    return total if agg == "sum" else math.fsum(values) / len(values)


def _windows(
    xs: list[Record], size: int, slide: int, key: str | None, agg: str, field: str | None
) -> list[Record]:
    groups: dict[tuple[int, Any], list[Any]] = defaultdict(list)
    for r in xs:
        if "ts" not in r or (key is not None and key not in r):
            continue
        v = None
        if agg != "count":
            v = r.get(field)  # type: ignore[arg-type]
            if not _number(v):
                continue
        k = r[key] if key is not None else None
        try:
            hash(k)
        except TypeError:
            continue
        ts = r["ts"]
        start = ts - ts % slide
        while start > ts - size:
            groups[(start, k)].append(v)
            start -= slide
    ordered = sorted(groups, key=lambda sk: (sk[0] + size, order_key(sk[1])))
    return [
        {
            "key": k,
            "window_start": s,
            "window_end": s + size,
            "value": _aggregate(agg, groups[(s, k)]),
            "ts": s + size - 1,
        }
        for s, k in ordered
    ]


def _running(xs: list[Record], key: str | None, agg: str, field: str | None) -> list[Record]:
    count: dict[Any, int] = defaultdict(int)
    total: dict[Any, Any] = defaultdict(int)
    best: dict[Any, Any] = {}
    out: list[Record] = []
    for r in xs:
        if "ts" not in r or (key is not None and key not in r):
            continue
        k = r[key] if key is not None else None
        v = r.get(field) if field is not None else None
        if agg != "count" and not _number(v):
            continue
        count[k] += 1
        if agg == "count":
            value: Any = count[k]
        elif agg in ("sum", "mean"):
            total[k] += v
            value = total[k] if agg == "sum" else total[k] / count[k]
        else:
            pick = min if agg == "min" else max
            value = best[k] = v if k not in best else pick(best[k], v)
        out.append({"key": k, "value": value, "ts": r["ts"]})
    return out


def _join(left: list[Record], right: list[Record], key: str, w: int) -> list[Record]:
    groups: dict[tuple[int, Any], tuple[list[Record], list[Record]]] = {}
    for side, xs in ((0, left), (1, right)):
        for r in xs:
            if "ts" not in r or key not in r:
                continue
            start = r["ts"] - r["ts"] % w
            groups.setdefault((start, r[key]), ([], []))[side].append(r)
    out: list[Record] = []
    for s, k in sorted(groups, key=lambda sk: (sk[0], order_key(sk[1]))):
        ls, rs = groups[(s, k)]
        out += [
            {"key": k, "left": a, "right": b, "ts": max(a["ts"], b["ts"])} for a in ls for b in rs
        ]
    return out


def _top_k(xs: list[Record], k: int, by: str, w: int) -> list[Record]:
    groups: dict[int, list[Record]] = defaultdict(list)
    for r in xs:
        if "ts" in r and _number(r.get(by)):
            groups[r["ts"] - r["ts"] % w].append(r)
    out: list[Record] = []
    for s in sorted(groups):
        xs = sorted(groups[s], key=lambda r: (-r[by], r["ts"]))
        # ties with the k-th on (by, ts) are broken by canonical JSON
        edge = (-xs[min(k, len(xs)) - 1][by], xs[min(k, len(xs)) - 1]["ts"])
        head = [r for r in xs if (-r[by], r["ts"]) <= edge]
        best = sorted(head, key=lambda r: (-r[by], r["ts"], _json(r)))[:k]
        out.append({"window_start": s, "window_end": s + w, "top": best, "ts": s + w - 1})
    return out


def _dedupe(xs: list[Record], key: str, ttl: int) -> list[Record]:
    last: dict[Any, int] = {}
    out: list[Record] = []
    for r in xs:
        if "ts" not in r or key not in r:
            continue
        k, ts = r[key], r["ts"]
        if k in last and abs(ts - last[k]) < ttl:
            continue
        last[k] = ts
        out.append(r)
    return out
