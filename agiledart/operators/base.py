"""The operator interface: batches of records in, records out; watermarks; snapshots.

Theory of operation. A *record* is a dict (a msgpack map) whose ``ts`` field is its
event time in milliseconds. A *watermark* ``W`` on an input promises that no more
records with ``ts < W`` will arrive on it; a record that arrives with ``ts < W`` anyway
is *late*: windowed operators count it (``stats.late``) and drop it. An operator with
several inputs (union, join) runs on the minimum of its inputs' watermarks. Sources
emit watermarks with bounded out-of-orderness (:class:`~agiledart.operators.watermarks.
BoundedOutOfOrderness`); a finite source ends with :data:`FINAL_WATERMARK`, which
closes every open window.

The driver (local executor, or a worker process of a peer) calls:

* ``on_batch(input_index, records) -> list[Record]``: the records to forward now.
* ``on_watermark(input_index, wm) -> (records, new_wm)``: records released by the
  watermark (fired windows), and the operator's new output watermark, or ``None`` if
  it did not advance. Forward the records first, then the watermark.
* ``snapshot() -> bytes`` and ``restore(bytes)`` (or the ``state=`` constructor
  argument): msgpack of the watermarks and the operator's state, taken between calls.

Batches are immutable once emitted (several consumers may share one list, and an
operator may forward its input list as is); operators never mutate input records.
Bad records (a missing field, a function that raises, a non-numeric aggregate field)
are counted in ``stats.errors`` and dropped; they never stop the operator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import msgpack

from agiledart.app.errors import OperatorError, SnapshotError

__all__ = [
    "FINAL_WATERMARK",
    "MIN_WATERMARK",
    "Operator",
    "OperatorStats",
    "Record",
    "order_key",
]

Record = dict[str, Any]
#: The watermark before any has been seen.
MIN_WATERMARK = -(2**63)
#: The last watermark of a finite stream: fires every window, ends the stream.
FINAL_WATERMARK = 2**63 - 1
_SNAPSHOT_VERSION = 1


def order_key(key: Any) -> tuple[int, Any, str]:
    """A total order over record keys of mixed types: null < numbers < strings < other."""
    if key is None:
        return (0, 0, "")
    t = type(key)
    if t is int or t is float or t is bool:
        return (1, key, "")
    if t is str:
        return (2, 0, key)
    return (3, 0, repr(key))


#: distinct errors an operator keeps (type and message), with a record that caused each
RECENT_ERRORS = 5
#: characters of the offending record kept with an error
RECORD_CHARS = 300


@dataclass(slots=True)
class OperatorStats:
    records_in: int = 0
    records_out: int = 0
    late: int = 0  # dropped: behind the watermark
    errors: int = 0  # dropped: missing field, bad value, function raised
    last_error: str = ""
    #: the last :data:`RECENT_ERRORS` distinct errors, oldest first: ``{"type",
    #: "message", "record", "count"}`` (``record``: the first that raised it, as text)
    recent_errors: list[dict[str, Any]] = field(default_factory=list)
    #: with :attr:`Operator.keep_failed`, every record dropped by an error since the
    #: driver last took them: ``{"type", "message", "record"}`` (the record as it came)
    failed: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def note_error(self, error: dict[str, Any]) -> None:
        """Count ``error`` among the recent ones (merged with an equal type and message)."""
        recent = self.recent_errors
        for known in recent:
            if known["type"] == error["type"] and known["message"] == error["message"]:
                known["count"] = int(known.get("count", 1)) + int(error.get("count", 1))
                return
        recent.append(dict(error))
        del recent[:-RECENT_ERRORS]


class Operator:
    """Base class: watermark bookkeeping, error counting, snapshot framing.

    Subclasses implement :meth:`on_batch` and, if they hold state, the hooks
    :meth:`_advance` (fire what the watermark releases), :meth:`_state` and
    :meth:`_load`; :meth:`_output_watermark` may hold the watermark back.
    """

    kind: ClassVar[str] = "operator"
    stateful: ClassVar[bool] = False
    #: keep each record an error drops in ``stats.failed`` (``on_error: dead_letter``);
    #: the driver takes them after every call
    keep_failed: bool = False

    def __init__(self, *, inputs: int = 1) -> None:
        if inputs < 1:
            msg = f"{self.kind} needs at least one input, got {inputs}"
            raise OperatorError(msg)
        self.inputs = inputs
        self._wms = [MIN_WATERMARK] * inputs
        self._wm = MIN_WATERMARK
        self._out_wm = MIN_WATERMARK
        self.stats = OperatorStats()

    @property
    def watermark(self) -> int:
        """The input watermark the operator runs on (minimum over its inputs)."""
        return self._wm

    @property
    def output_watermark(self) -> int:
        return self._out_wm

    @property
    def finished(self) -> bool:
        return self._wm == FINAL_WATERMARK

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        raise NotImplementedError

    def on_watermark(self, input_index: int, wm: int) -> tuple[list[Record], int | None]:
        wms = self._wms
        if not 0 <= input_index < self.inputs:
            msg = f"{self.kind} has {self.inputs} input(s), got input index {input_index}"
            raise OperatorError(msg)
        if wm <= wms[input_index]:
            return [], None  # watermarks never go back; a stale one is ignored
        wms[input_index] = wm
        new = min(wms) if self.inputs > 1 else wm
        if new <= self._wm:
            return [], None
        prev, self._wm = self._wm, new
        out = self._advance(prev, new)
        self.stats.records_out += len(out)
        out_wm = self._output_watermark(new)
        if out_wm <= self._out_wm:
            return out, None
        self._out_wm = out_wm
        return out, out_wm

    # --- hooks -----------------------------------------------------------------------

    def _advance(self, prev: int, wm: int) -> list[Record]:
        """Records released when the watermark moves from ``prev`` to ``wm``."""
        return []

    def _output_watermark(self, wm: int) -> int:
        return wm

    def _state(self) -> Any:
        return None

    def _load(self, state: Any) -> None:
        return None

    # --- errors ----------------------------------------------------------------------

    def _bad(self, exc: BaseException, record: Any = None) -> None:
        """``record`` (when known) was dropped because of ``exc``: counted, and kept
        among the recent errors with the record, for ``status`` to show."""
        st = self.stats
        st.errors += 1
        st.last_error = f"{type(exc).__name__}: {exc}"
        if self.keep_failed:
            st.failed.append({"type": type(exc).__name__, "message": str(exc), "record": record})
        st.note_error(
            {
                "type": type(exc).__name__,
                "message": str(exc)[:RECORD_CHARS],
                "record": None if record is None else repr(record)[:RECORD_CHARS],
                "count": 1,
            }
        )

    # --- snapshots -------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The operator's resume state (watermarks and operator state) as msgpack."""
        return msgpack.packb(
            {
                "v": _SNAPSHOT_VERSION,
                "kind": self.kind,
                "wms": self._wms,
                "out_wm": self._out_wm,
                "state": self._state(),
            },
            use_bin_type=True,
        )

    def restore(self, data: bytes) -> None:
        """Replace this operator's state with a snapshot taken from the same kind."""
        try:
            snap = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            msg = f"{self.kind}: snapshot is not valid msgpack: {e}"
            raise SnapshotError(msg) from None
        if not isinstance(snap, dict) or snap.get("v") != _SNAPSHOT_VERSION:
            msg = f"{self.kind}: not an operator snapshot (version {_SNAPSHOT_VERSION})"
            raise SnapshotError(msg)
        if snap.get("kind") != self.kind:
            msg = f"snapshot of a {snap.get('kind')!r} operator cannot restore a {self.kind!r}"
            raise SnapshotError(msg)
        wms = snap.get("wms")
        if not (isinstance(wms, list) and len(wms) == self.inputs):
            msg = f"{self.kind}: snapshot has watermarks for {wms!r}, need {self.inputs} inputs"
            raise SnapshotError(msg)
        try:
            self._load(snap.get("state"))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            msg = f"{self.kind}: snapshot state is malformed: {e!r}"
            raise SnapshotError(msg) from None
        self._wms = [int(w) for w in wms]
        self._wm = min(self._wms)
        self._out_wm = int(snap.get("out_wm", MIN_WATERMARK))
