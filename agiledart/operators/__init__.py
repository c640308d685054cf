"""The operator library: plain objects fed batches of records and watermarks.

No I/O, no asyncio: a driver (the local executor, a peer's worker process) calls
``on_batch`` / ``on_watermark`` and forwards what they return; see
:mod:`agiledart.operators.base` for the contract and :func:`build_operator` to make one
from a validated :class:`~agiledart.app.spec.OperatorSpec`.

Stateless: :class:`Map`, :class:`Filter`, :class:`FlatMap`, :class:`KeyBy`,
:class:`Union`. Stateful (``snapshot()`` / ``restore()``): :class:`Window`,
:class:`Join`, :class:`TopK`, :class:`Dedupe`, :class:`Aggregate` (running, per key).
Errors are those of :mod:`agiledart.app.errors` (``OperatorError``, ``SnapshotError``).
"""

from agiledart.operators.aggregate import Aggregate
from agiledart.operators.base import (
    FINAL_WATERMARK,
    MIN_WATERMARK,
    Operator,
    OperatorStats,
    Record,
    order_key,
)
from agiledart.operators.dedupe import Dedupe
from agiledart.operators.factory import build_operator
from agiledart.operators.join import Join
from agiledart.operators.stateless import KEY_SEPARATOR, Filter, FlatMap, KeyBy, Map, Union
from agiledart.operators.topk import TopK
from agiledart.operators.watermarks import BoundedOutOfOrderness
from agiledart.operators.window import Window

__all__ = [
    "FINAL_WATERMARK",
    "KEY_SEPARATOR",
    "MIN_WATERMARK",
    "Aggregate",
    "BoundedOutOfOrderness",
    "Dedupe",
    "Filter",
    "FlatMap",
    "Join",
    "KeyBy",
    "Map",
    "Operator",
    "OperatorStats",
    "Record",
    "TopK",
    "Union",
    "Window",
    "build_operator",
    "order_key",
]
