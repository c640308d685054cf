"""Segments: local operators chained in one task with one inbox (see
:mod:`agiledart.runtime.topology`), their inbox entries and the helpers that queue them.

An inbox holds batches, watermarks and checkpoint barriers, per channel (producer,
sending peer) in order. A watermark arriving behind a queued entry of its channel is
folded into it, and a small local batch joins the queued batch of its channel that has
not started, so the queue counts entries, not records, and cannot pile up.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agiledart.app.errors import ExecutionError
from agiledart.dataplane import Trace
from agiledart.local.executor import Executor
from agiledart.operators.base import OperatorStats, Record
from agiledart.runtime.deadletters import DeadLetters
from agiledart.runtime.edges import BatchAck
from agiledart.runtime.epochs import Alignment
from agiledart.runtime.execution.engines import Unit
from agiledart.runtime.metrics import InstanceMeter

__all__ = ["Item", "Segment"]


def now_ms() -> float:
    return time.time() * 1000.0


@dataclass
class Item:
    """An inbox entry: a batch or a watermark from ``producer``."""

    producer: str
    records: list[Record] | None
    traces: list[Trace]
    wm: int = 0
    wall: float = 0.0
    ack: BatchAck | None = None
    local: bool = False
    sender: str = ""
    #: a watermark of the same producer and sender that came after this batch while it
    #: waited (watermarks are merged into queued items, so they cannot pile up)
    wm_after: int | None = None
    wall_after: float = 0.0
    popped: bool = False
    queued_at: float = 0.0  #: time.monotonic() when it entered the inbox
    offset: int = 0  #: records already run (a turn takes at most ``turn`` of them)
    barrier: int | None = None  #: a checkpoint barrier (records None, no watermark)


class Segment:
    """Local operators (one, or a chained group inline), one task, one inbox, run as
    one :class:`~agiledart.runtime.execution.Unit` of the peer's engine."""

    def __init__(self, ops: list[str], executor: Executor) -> None:
        self.ops = ops
        self.executor = executor
        self.unit: Unit | None = None
        self.inbox: collections.deque[Item] = collections.deque()
        self.pending = 0  #: records and watermarks waiting (the EdgeWise queue length)
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.local_items = 0
        self.processed = 0
        #: producer -> sender peer -> watermark, for producers with several instances
        self.watermarks: dict[str, dict[str, int]] = {}
        #: (producer, sender) -> its latest inbox item
        self.last: dict[tuple[str, str], Item] = {}
        self.meter = InstanceMeter(time.monotonic())
        self.align = Alignment(())  #: checkpoint barriers of its input channels
        self.held: list[Item] = []  #: items of channels waiting for the others' barrier
        #: the replicas of a scaled-up operator (agiledart.runtime.replicas); [unit]
        self.units: list[Unit] = []
        self.scalable = False  #: whether the operator may run as several replicas here
        self.split_field: str | None = None  #: what splits a batch over the replicas
        self.resize_to: int | None = None  #: a change of the replica count, asked for
        self.resized = asyncio.Event()  #: set when a resize asked for is done
        #: counters for the scaling controller (agiledart.runtime.scaling), cumulative
        self.arrived = 0  #: records put in the inbox
        self.executed = 0  #: records executed
        self.service_s = 0.0  #: execution time, summed over the replicas
        self.retired: dict[str, dict[str, int]] = {}  #: counters of replicas gone

    @property
    def replicas(self) -> int:
        return max(1, len(self.units))

    def oldest_s(self, now: float) -> float | None:
        return now - self.inbox[0].queued_at if self.inbox else None

    def rate(self, now: float) -> float:
        return self.meter.reading(now).rate


def fail_on_error(seg: Segment, ops: list[str]) -> None:
    """ExecutionError, naming the error and its record, if one of ``ops`` (whose
    ``on_error`` is ``fail``) dropped a record."""
    for name in ops:
        for unit in seg.units:
            st = unit.executor.operators[name].stats
            if st.errors:
                e = st.recent_errors[0] if st.recent_errors else {}
                record = f" on record {e['record']}" if e.get("record") else ""
                msg = (
                    f"operator {name} raised {e.get('type', 'an error')}: "
                    f"{e.get('message', st.last_error)}{record} (on_error: fail)"
                )
                raise ExecutionError(msg)


def post_dead_letters(seg: Segment, ops: list[str], sinks: Mapping[str, DeadLetters]) -> None:
    """The records ``ops`` (whose ``on_error`` is ``dead_letter``) dropped in the turn
    just run, to their dead-letter sinks."""
    ts = int(now_ms())
    for name in ops:
        for unit in seg.units:
            st = unit.executor.operators[name].stats
            if st.failed:
                failed, st.failed = st.failed, []
                sinks[name].write(failed, ts=ts)


def op_stats(op: Any) -> dict[str, Any]:
    return {k: v for k, v in op.stats.as_dict().items() if isinstance(v, int | float)}


def seg_op_stats(seg: Segment, name: str) -> dict[str, Any]:
    """Counters of operator ``name`` over the segment's replicas, gone ones included,
    and its recent distinct errors."""
    total: dict[str, Any] = dict(seg.retired.get(name, {}))
    merged = OperatorStats()
    for unit in seg.units:
        op = unit.executor.operators[name]
        for k, v in op_stats(op).items():
            total[k] = total.get(k, 0) + v
        for error in op.stats.recent_errors:
            merged.note_error(error)
    if merged.recent_errors:
        total["recent_errors"] = merged.recent_errors
    return total


def append(seg: Segment, item: Item) -> None:
    item.queued_at = now = time.monotonic()
    if not seg.inbox:
        seg.meter.queued(now)
    seg.inbox.append(item)
    seg.pending += 1 if item.records is None else len(item.records)
    seg.arrived += 0 if item.records is None else len(item.records)
    seg.last[(item.producer, item.sender)] = item
    seg.wake.set()


def mergeable(seg: Segment, item: Item, batch_records: int) -> Item | None:
    """The queued batch that ``item``'s records may join: the same channel's latest
    item, still last in the inbox (not held back by barrier alignment, where the inbox
    may be empty), not started, without a watermark or an acknowledgement riding on it,
    and with room for ``item``'s records."""
    last = seg.last.get((item.producer, item.sender))
    if (
        last is None
        or last.popped
        or not seg.inbox
        or last is not seg.inbox[-1]
        or last.offset
        or last.records is None
        or last.wm_after is not None
        or last.ack is not None
        or item.records is None
        or len(last.records) + len(item.records) > batch_records
    ):
        return None
    return last


def merge_wm(seg: Segment, item: Item) -> bool:
    """Fold watermark ``item`` into the queued item of its producer and sender, if any."""
    last = seg.last.get((item.producer, item.sender))
    if last is None or last.popped or last.barrier is not None:
        return False
    if last.records is None:
        if item.wm > last.wm:
            last.wm, last.wall = item.wm, item.wall
    elif last.wm_after is None or item.wm > last.wm_after:
        last.wm_after, last.wall_after = item.wm, item.wall
    return True
