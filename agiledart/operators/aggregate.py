"""Running (unwindowed) aggregate per key, emitting every update.

For each input record the operator updates its key's aggregate and emits
``{"key", "value", "ts"}`` with the record's ``ts`` (key null when unkeyed): count,
sum, mean, min or max so far. This is the keyed running aggregate of the throughput
benchmark (filter -> map -> aggregate), so its loops are tight: one for count, one
for the numeric aggregates.
Sums accumulate in arrival order. No record is late here: there is no window to miss;
the watermark passes through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from agiledart.app.errors import OperatorError
from agiledart.operators.base import Operator, Record

__all__ = ["Aggregate"]

_AGGREGATES = ("count", "sum", "mean", "min", "max")


class Aggregate(Operator):
    kind: ClassVar[str] = "aggregate"
    stateful: ClassVar[bool] = True

    def __init__(
        self,
        *,
        aggregate: str,
        key: str | None = None,
        field: str | None = None,
        state: bytes | None = None,
    ) -> None:
        super().__init__()
        if aggregate not in _AGGREGATES:
            msg = f"unknown aggregate {aggregate!r}; use one of {', '.join(_AGGREGATES)}"
            raise OperatorError(msg)
        if aggregate != "count" and field is None:
            msg = f"aggregate {aggregate!r} needs a field"
            raise OperatorError(msg)
        self.aggregate, self.key, self.field = aggregate, key, field
        #: key -> count | sum | [sum, n] (mean) | min | max
        self._acc: dict[Any, Any] = {}
        loops: dict[str, Callable[[list[Record], list[Record]], None]] = {
            "count": self._count,
            "sum": self._sum,
            "mean": self._numeric,
            "min": self._numeric,
            "max": self._numeric,
        }
        self._loop = loops[aggregate]
        if state is not None:
            self.restore(state)

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        out: list[Record] = []
        self._loop(records, out)
        st = self.stats
        st.records_in += len(records)
        st.records_out += len(out)
        return out

    def _count(self, records: list[Record], out: list[Record]) -> None:
        acc, key, append = self._acc, self.key, out.append
        for r in records:
            try:
                k = None if key is None else r[key]
                ts = r["ts"]
                c = acc.get(k, 0) + 1
                acc[k] = c
                append({"key": k, "value": c, "ts": ts})
            except (KeyError, TypeError) as e:
                self._bad(e, r)

    def _sum(self, records: list[Record], out: list[Record]) -> None:
        """sum: a loop of its own (the throughput benchmark's; a test per record costs)."""
        acc, key, field, append = self._acc, self.key, self.field, out.append
        for r in records:
            try:
                k = None if key is None else r[key]
                v = r[field]  # type: ignore[index]
                if v.__class__ not in (int, float):
                    raise TypeError(f"field {field!r} is not a number: {v!r}")  # noqa: EM102
                ts = r["ts"]  # before the state changes: a record without one is bad
                s = acc[k] = acc.get(k, 0) + v
                append({"key": k, "value": s, "ts": ts})
            except (KeyError, TypeError) as e:
                self._bad(e, r)

    def _numeric(self, records: list[Record], out: list[Record]) -> None:
        """mean, min and max: one loop, the update chosen per record by a cheap test."""
        acc, key, field, append = self._acc, self.key, self.field, out.append
        agg = self.aggregate
        is_mean, is_min = agg == "mean", agg == "min"
        for r in records:
            try:
                k = None if key is None else r[key]
                v = r[field]  # type: ignore[index]
                if v.__class__ not in (int, float):
                    raise TypeError(f"field {field!r} is not a number: {v!r}")  # noqa: EM102
                ts = r["ts"]
                if is_mean:
                    sn = acc.get(k)
                    if sn is None:
                        sn = acc[k] = [0, 0]
                    sn[0] += v
                    sn[1] += 1
                    value = sn[0] / sn[1]
                else:
                    value = acc.get(k)
                    if value is None or (v < value if is_min else v > value):
                        acc[k] = value = v
                append({"key": k, "value": value, "ts": ts})
            except (KeyError, TypeError) as e:
                self._bad(e, r)

    def _state(self) -> Any:
        return list(self._acc.items())

    def _load(self, state: Any) -> None:
        self._acc = {k: v for k, v in state}
