"""Batches: the unit that travels between operator instances (docs/architecture.md).

Wire form (msgpack map, short keys to keep frames small)::

    {"e": edge id (str), "s": sequence number (int >= 0), "r": [record, ...],
     "t": [[record index, trace id, source timestamp ms], ...]}   # "t" optional

Decoding is strict: anything else raises :class:`BatchDecodeError`, never another
exception type.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from agiledart.dataplane.errors import BatchDecodeError, DataPlaneUsageError
from agiledart.dataplane.trace import Trace

__all__ = ["Batch", "Record", "TracePoint"]

Record = Any
_KEYS = frozenset({"e", "s", "r"})
_KEYS_T = frozenset({"e", "s", "r", "t"})
_U63 = (1 << 63) - 1


class TracePoint(NamedTuple):
    """A sampled record inside a batch: its position and its trace (a tuple: cheap)."""

    position: int  #: the record's index in the batch
    trace: Trace


@dataclass(frozen=True, slots=True)
class Batch:
    """Records for one downstream edge, numbered per edge from 0."""

    edge: str
    seq: int
    records: list[Record]
    traces: tuple[TracePoint, ...] = field(default=())

    def traced(self) -> Iterator[tuple[Record, Trace]]:
        """The sampled records with their traces."""
        for tp in self.traces:
            yield self.records[tp.position], tp.trace

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"e": self.edge, "s": self.seq, "r": self.records}
        if self.traces:
            d["t"] = [[tp.position, tp.trace.trace_id, tp.trace.source_ts] for tp in self.traces]
        return d

    @classmethod
    def from_dict(cls, d: object) -> Batch:
        """Validate and build; raise :class:`BatchDecodeError` on anything malformed."""
        if not isinstance(d, dict):
            msg = f"batch must be a map, got {type(d).__name__}"
            raise BatchDecodeError(msg)
        keys = d.keys()
        if keys != _KEYS and keys != _KEYS_T:
            msg = f"batch keys must be e, s, r[, t], got {sorted(map(str, keys))}"
            raise BatchDecodeError(msg)
        edge, seq, records = d["e"], d["s"], d["r"]
        if type(edge) is not str or not edge:
            msg = "batch edge id must be a non-empty string"
            raise BatchDecodeError(msg)
        if type(seq) is not int or not 0 <= seq <= _U63:
            msg = f"batch sequence number must be an int in [0, 2**63), got {seq!r}"
            raise BatchDecodeError(msg)
        if not isinstance(records, list):
            msg = "batch records must be an array"
            raise BatchDecodeError(msg)
        raw = d.get("t", [])
        if not isinstance(raw, list):
            msg = "batch traces must be an array"
            raise BatchDecodeError(msg)
        return cls(edge, seq, records, _trace_points(raw, len(records)) if raw else ())

    def encode(self) -> bytes:
        """The msgpack frame; a record msgpack cannot carry is a DataPlaneUsageError."""
        try:
            data: bytes = msgpack.packb(self.to_dict(), use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as e:
            msg = f"batch {self.edge}#{self.seq} is not msgpack-encodable: {e}"
            raise DataPlaneUsageError(msg) from e
        return data

    @classmethod
    def decode(cls, data: bytes) -> Batch:
        """Parse one msgpack frame; raise only :class:`BatchDecodeError` on garbage."""
        try:
            obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
        except Exception as e:  # msgpack raises many types; map them all at this boundary
            msg = f"not a msgpack batch: {type(e).__name__}: {e}"
            raise BatchDecodeError(msg) from e
        return cls.from_dict(obj)


_new = tuple.__new__


def _trace_points(raw: list[Any], n: int) -> tuple[TracePoint, ...]:
    """The batch's trace tags, checked; the common well-formed tag costs one pass of
    cheap type tests and two tuples (the data path parses ~5% of records' tags)."""
    out: list[TracePoint] = []
    for t in raw:
        if type(t) is list and len(t) == 3:
            index, trace_id, ts = t
            if (
                type(index) is int
                and 0 <= index < n
                and type(trace_id) is int
                and 0 <= trace_id <= _U63
                and type(ts) is float
                and ts - ts == 0.0  # finite
            ):
                out.append(_new(TracePoint, (index, _new(Trace, (trace_id, ts)))))
                continue
        out.append(_trace_point(t, n))  # the slow path: converts, or says what is wrong
    return tuple(out)


def _trace_point(t: object, n: int) -> TracePoint:
    if not isinstance(t, list) or len(t) != 3:
        msg = "batch trace must be [index, trace id, source ts]"
        raise BatchDecodeError(msg)
    index, trace_id, ts = t
    if type(index) is not int or not 0 <= index < n:
        msg = f"batch trace index {index!r} outside the records"
        raise BatchDecodeError(msg)
    if type(trace_id) is not int or not 0 <= trace_id <= _U63:
        msg = f"batch trace id must be an int in [0, 2**63), got {trace_id!r}"
        raise BatchDecodeError(msg)
    if type(ts) not in (int, float) or not math.isfinite(ts):
        msg = f"batch trace timestamp must be a number, got {ts!r}"
        raise BatchDecodeError(msg)
    return TracePoint(index, Trace(trace_id, float(ts)))
