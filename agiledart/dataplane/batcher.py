"""Per-edge batching: flush at ``max_records`` or ``max_delay_ms``, whichever comes first.

The clock is passed in (milliseconds); the driver sleeps until :attr:`Batcher.deadline`
and then calls :meth:`Batcher.poll`.
"""

from __future__ import annotations

from collections.abc import Sequence

from agiledart.dataplane.batch import Batch, Record, TracePoint
from agiledart.dataplane.errors import DataPlaneUsageError
from agiledart.dataplane.trace import Trace

__all__ = ["Batcher"]


class Batcher:
    """Accumulates records for one downstream edge into numbered :class:`Batch` es."""

    __slots__ = (
        "_deadline",
        "_records",
        "_traces",
        "edge",
        "max_delay_ms",
        "max_records",
        "next_seq",
    )

    def __init__(
        self, edge: str, *, max_records: int, max_delay_ms: float, first_seq: int = 0
    ) -> None:
        if not edge:
            msg = "edge id must be a non-empty string"
            raise DataPlaneUsageError(msg)
        if max_records < 1:
            msg = f"max_records must be >= 1, got {max_records}"
            raise DataPlaneUsageError(msg)
        if max_delay_ms < 0:
            msg = f"max_delay_ms must be >= 0, got {max_delay_ms}"
            raise DataPlaneUsageError(msg)
        if first_seq < 0:
            msg = f"first_seq must be >= 0, got {first_seq}"
            raise DataPlaneUsageError(msg)
        self.edge = edge
        self.max_records = max_records
        self.max_delay_ms = max_delay_ms
        self.next_seq = first_seq
        self._records: list[Record] = []
        self._traces: list[TracePoint] = []
        self._deadline: float | None = None

    @property
    def deadline(self) -> float | None:
        """When the pending records must be flushed; ``None`` when empty."""
        return self._deadline

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: Record, now: float, trace: Trace | None = None) -> Batch | None:
        """Append one record; return a batch if the size or time limit is reached."""
        records = self._records
        if not records:
            self._deadline = now + self.max_delay_ms
        if trace is not None:
            self._traces.append(TracePoint(len(records), trace))
        records.append(record)
        deadline = self._deadline
        if len(records) >= self.max_records or (deadline is not None and now >= deadline):
            return self.flush()
        return None

    def extend(
        self, records: Sequence[Record], now: float, traces: Sequence[TracePoint] = ()
    ) -> bool:
        """Append ``records`` at once (``traces`` index into ``records``); True when the
        size or time limit is reached: then take the batches with :meth:`cut`."""
        if not records:
            return False
        pending = self._records
        if not pending:
            self._deadline = now + self.max_delay_ms
        if traces:
            base = len(pending)
            if base:
                self._traces.extend(TracePoint(base + tp.position, tp.trace) for tp in traces)
            else:
                self._traces.extend(traces)
        pending.extend(records)
        deadline = self._deadline
        return len(pending) >= self.max_records or (deadline is not None and now >= deadline)

    def cut(self) -> Batch | None:
        """The oldest pending records, at most ``max_records``, as the next batch (``None``
        if nothing is pending); the rest stays pending, its deadline unchanged."""
        pending, size = self._records, self.max_records
        if len(pending) <= size:
            return self.flush()
        self._records = pending[size:]
        traces = self._traces
        if traces:
            self._traces = [
                TracePoint(tp.position - size, tp.trace) for tp in traces if tp.position >= size
            ]
            traces = [tp for tp in traces if tp.position < size]
        batch = Batch(self.edge, self.next_seq, pending[:size], tuple(traces))
        self.next_seq += 1
        return batch

    def poll(self, now: float) -> Batch | None:
        """Return the pending batch if its deadline has passed."""
        if self._deadline is not None and now >= self._deadline:
            return self.flush()
        return None

    def flush(self) -> Batch | None:
        """Return whatever is pending as a batch (``None`` if nothing is)."""
        if not self._records:
            return None
        batch = Batch(self.edge, self.next_seq, self._records, tuple(self._traces))
        self.next_seq += 1
        self._records = []
        if self._traces:
            self._traces = []
        self._deadline = None
        return batch
