"""Stateless operators: map, filter, flat_map, key_by, union.

The fast path is one list comprehension per batch. If the user function raises on
some record, the batch is redone record by record, and the records it fails on are
counted in ``stats.errors`` and dropped (functions are pure, so redoing is safe).
Stateless operators do not drop late records: lateness is decided where state is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from agiledart.app.errors import OperatorError
from agiledart.operators.base import Operator, Record

#: What user code may raise on a record and be counted as a bad record for: any
#: Exception, and SystemExit (a function calling sys.exit must not end the peer).
USER_ERRORS: tuple[type[BaseException], ...] = (Exception, SystemExit)

__all__ = ["KEY_SEPARATOR", "Filter", "FlatMap", "KeyBy", "Map", "Union"]

#: Joins the values of a composite ``key_by`` key: ``"Geneva/dust"``.
KEY_SEPARATOR = "/"


class Map(Operator):
    """``fn(record) -> record`` for every record."""

    kind: ClassVar[str] = "map"

    def __init__(self, fn: Callable[[Record], Record]) -> None:
        super().__init__()
        self._fn = fn

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        f = self._fn
        try:
            out = [f(r) for r in records]
        except USER_ERRORS:
            out = []
            for r in records:
                try:
                    out.append(f(r))
                except USER_ERRORS as e:
                    self._bad(e, r)
        st = self.stats
        st.records_in += len(records)
        st.records_out += len(out)
        return out


class Filter(Operator):
    """The records for which ``fn(record)`` is truthy."""

    kind: ClassVar[str] = "filter"

    def __init__(self, fn: Callable[[Record], Any]) -> None:
        super().__init__()
        self._fn = fn

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        f = self._fn
        try:
            out = [r for r in records if f(r)]
        except USER_ERRORS:
            out = []
            for r in records:
                try:
                    if f(r):
                        out.append(r)
                except USER_ERRORS as e:
                    self._bad(e, r)
        st = self.stats
        st.records_in += len(records)
        st.records_out += len(out)
        return out


class FlatMap(Operator):
    """Every record of ``fn(record)``, an iterable, for every record."""

    kind: ClassVar[str] = "flat_map"

    def __init__(self, fn: Callable[[Record], Iterable[Record]]) -> None:
        super().__init__()
        self._fn = fn

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        f = self._fn
        try:
            out = [o for r in records for o in f(r)]
        except USER_ERRORS:
            out = []
            for r in records:
                try:
                    out.extend(list(f(r)))
                except USER_ERRORS as e:
                    self._bad(e, r)
        st = self.stats
        st.records_in += len(records)
        st.records_out += len(out)
        return out


class KeyBy(Operator):
    """A copy of each record with a ``key`` field: from ``fn``, or from ``fields``.

    One field: its value. Several fields: their values joined with
    :data:`KEY_SEPARATOR` (``["city", "metric"]`` -> ``"Geneva/dust"``). The key tells
    the runtime how to partition a scaled-out stateful operator downstream.
    """

    kind: ClassVar[str] = "key_by"

    def __init__(
        self,
        *,
        fields: Sequence[str] | None = None,
        fn: Callable[[Record], Any] | None = None,
    ) -> None:
        super().__init__()
        if fn is not None:
            self._keyfn = fn
        elif fields and len(fields) == 1:
            (name,) = fields
            self._keyfn = lambda r: r[name]
        elif fields:
            names = tuple(fields)
            sep = KEY_SEPARATOR
            self._keyfn = lambda r: sep.join([str(r[n]) for n in names])
        else:
            msg = "key_by needs fields or fn"
            raise OperatorError(msg)

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        f = self._keyfn
        try:
            out = [dict(r, key=f(r)) for r in records]
        except USER_ERRORS:
            out = []
            for r in records:
                try:
                    out.append(dict(r, key=f(r)))
                except USER_ERRORS as e:
                    self._bad(e, r)
        st = self.stats
        st.records_in += len(records)
        st.records_out += len(out)
        return out


class Union(Operator):
    """All records of all inputs, as they come; watermark is the minimum of inputs."""

    kind: ClassVar[str] = "union"

    def __init__(self, *, inputs: int = 2) -> None:
        super().__init__(inputs=inputs)

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        n = len(records)
        self.stats.records_in += n
        self.stats.records_out += n
        return records
