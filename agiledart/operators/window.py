"""Event-time windows: tumbling (``slide_ms == size_ms``) and sliding; keyed or not.

Theory of operation. Windows are ``[start, start + size)`` with ``start`` a multiple
of ``slide`` (aligned to event time 0). State is kept per *pane* of width
``g = gcd(size, slide)``: a record goes to exactly one pane, ``ts - ts % g``, and a
window is the union of its ``size / g`` panes, so sliding windows do not copy records.
When the watermark moves from ``prev`` to ``wm``, every window with
``prev < end <= wm`` that holds data fires, in ``(window_end, key)`` order (keys in
:func:`~agiledart.operators.base.order_key` order); a pane is dropped once the last
window containing it has fired. Records with ``ts`` below the watermark are late:
counted and dropped (their windows may already have fired).

Aggregates: ``count`` (int), ``min``/``max`` (the value), ``sum`` and ``mean`` over the
window's values with :func:`math.fsum`, so they are correctly rounded and do not
depend on arrival order (``sum`` of integers stays an exact integer). Output:
``{"key", "window_start", "window_end", "value", "ts": window_end - 1}``, key null
when unkeyed. The output watermark is the input watermark: every later output has
``window_end > wm``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from agiledart.app.errors import OperatorError
from agiledart.app.spec import MAX_PANES_PER_WINDOW, MAX_WINDOWS_PER_RECORD
from agiledart.operators.base import Operator, Record, order_key

__all__ = ["Window", "aggregate_values"]

_NUMBERS = (int, float)
_COUNT, _LIST, _MIN, _MAX = 0, 1, 2, 3
_MODE = {"count": _COUNT, "sum": _LIST, "mean": _LIST, "min": _MIN, "max": _MAX}


def aggregate_values(aggregate: str, values: list[Any]) -> Any:
    """The aggregate of a non-empty list of numbers (``count`` ignores the values)."""
    if aggregate == "count":
        return len(values)
    if aggregate == "min":
        return min(values)
    if aggregate == "max":
        return max(values)
    if aggregate == "sum":
        if all(type(v) is int for v in values):
            return sum(values)
        return math.fsum(values)
    if aggregate == "mean":
        return math.fsum(values) / len(values)
    msg = f"unknown aggregate {aggregate!r}"
    raise OperatorError(msg)


class Window(Operator):
    kind: ClassVar[str] = "window"
    stateful: ClassVar[bool] = True

    def __init__(
        self,
        *,
        size_ms: int,
        aggregate: str,
        slide_ms: int | None = None,
        key: str | None = None,
        field: str | None = None,
        state: bytes | None = None,
    ) -> None:
        super().__init__()
        slide = size_ms if slide_ms is None else slide_ms
        if not (size_ms > 0 and 0 < slide <= size_ms):
            msg = f"window needs 0 < slide_ms <= size_ms, got size {size_ms}, slide {slide}"
            raise OperatorError(msg)
        g = math.gcd(size_ms, slide)
        if -(-size_ms // slide) > MAX_WINDOWS_PER_RECORD or size_ms // g > MAX_PANES_PER_WINDOW:
            msg = f"window size {size_ms} / slide {slide}: too many windows or panes"
            raise OperatorError(msg)
        if aggregate not in _MODE:
            msg = f"unknown aggregate {aggregate!r}; use one of {', '.join(_MODE)}"
            raise OperatorError(msg)
        if aggregate != "count" and field is None:
            msg = f"aggregate {aggregate!r} needs a field"
            raise OperatorError(msg)
        self.size, self.slide = size_ms, slide
        self.pane = g
        self.aggregate, self.key, self.field = aggregate, key, field
        self._mode = _MODE[aggregate]
        #: pane start -> {key: count | [values] | min/max value}
        self._panes: dict[int, dict[Any, Any]] = {}
        if state is not None:
            self.restore(state)

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        wm, g, mode = self._wm, self.pane, self._mode
        key, field, panes = self.key, self.field, self._panes
        late = 0
        for r in records:
            try:
                ts = r["ts"]
                if ts < wm:
                    late += 1
                    continue
                k = None if key is None else r[key]
                p = ts - ts % g
                pane = panes.get(p)
                if pane is None:
                    pane = panes[p] = {}
                if mode == _COUNT:
                    pane[k] = pane.get(k, 0) + 1
                    continue
                v = r[field]  # type: ignore[index]
                if not isinstance(v, _NUMBERS) or v is True or v is False:
                    raise TypeError(f"field {field!r} is not a number: {v!r}")  # noqa: EM102
                cur = pane.get(k)
                if cur is None:
                    pane[k] = [v] if mode == _LIST else v
                elif mode == _LIST:
                    cur.append(v)
                elif (v < cur) if mode == _MIN else (v > cur):
                    pane[k] = v
            except (KeyError, TypeError) as e:
                self._bad(e, r)
        st = self.stats
        st.records_in += len(records)
        st.late += late
        return []

    def _advance(self, prev: int, wm: int) -> list[Record]:
        size, slide, panes = self.size, self.slide, self._panes
        starts: set[int] = set()
        for p in panes:
            s = p - p % slide
            while s + size > p:
                if prev < s + size <= wm:
                    starts.add(s)
                s -= slide
        out: list[Record] = []
        for s in sorted(starts):
            out += self._fire(s)
        for p in [p for p in panes if p - p % slide + size <= wm]:
            del panes[p]
        return out

    def _fire(self, start: int) -> list[Record]:
        mode, agg = self._mode, self.aggregate
        merged: dict[Any, Any] = {}
        end = start + self.size
        if self.size // self.pane <= len(self._panes):
            pane_starts: Any = range(start, end, self.pane)
        else:  # sparse: fewer panes held than a window spans
            pane_starts = sorted(p for p in self._panes if start <= p < end)
        for p in pane_starts:
            pane = self._panes.get(p)
            if not pane:
                continue
            for k, v in pane.items():
                cur = merged.get(k)
                if cur is None:
                    merged[k] = list(v) if mode == _LIST else v
                elif mode == _COUNT:
                    merged[k] = cur + v
                elif mode == _LIST:
                    cur.extend(v)
                elif (v < cur) if mode == _MIN else (v > cur):
                    merged[k] = v
        out = []
        for k in sorted(merged, key=order_key):
            v = merged[k]
            value = aggregate_values(agg, v) if mode == _LIST else v
            out.append(
                {"key": k, "window_start": start, "window_end": end, "value": value, "ts": end - 1}
            )
        return out

    def _state(self) -> Any:
        return [[p, list(pane.items())] for p, pane in self._panes.items()]

    def _load(self, state: Any) -> None:
        self._panes = {int(p): {k: v for k, v in items} for p, items in state}
