"""The sans-IO core of the data plane between operator instances (docs/architecture.md).

Plain objects over values, driven by a transport that owns sockets and timers:

* :class:`Batcher` groups a edge's records into numbered :class:`Batch` es (size or time);
  :meth:`Batch.encode` / :meth:`Batch.decode` are the msgpack wire form.
* :class:`CreditWindow` (sender) and :class:`CreditGrantor` (receiver) bound the
  receiver's input queue; :class:`SourceBuffer` applies an :class:`OverloadPolicy`.
* :class:`KeyPartitioner` / :class:`RoundRobinPartitioner` pick the downstream instance.
* :class:`SequenceTracker` drops duplicate batches and reports gaps.
* :class:`TraceSampler` marks ~5% of tuples with a :class:`Trace`; :func:`trace_latency`.
"""

from agiledart.dataplane.batch import Batch, Record, TracePoint
from agiledart.dataplane.batcher import Batcher
from agiledart.dataplane.credit import (
    CreditGrantor,
    CreditGrantorStatistics,
    CreditWindow,
    CreditWindowStatistics,
)
from agiledart.dataplane.errors import (
    BatchDecodeError,
    BrokenResourceError,
    ClosedResourceError,
    DataPlaneError,
    DataPlaneUsageError,
    ProtocolError,
    WouldBlock,
)
from agiledart.dataplane.overload import OverloadPolicy, SourceBuffer, SourceBufferStatistics
from agiledart.dataplane.partition import KeyPartitioner, RoundRobinPartitioner, stable_hash
from agiledart.dataplane.sequence import SequenceStatistics, SequenceTracker
from agiledart.dataplane.trace import Trace, TraceSampler, trace_latency

__all__ = [
    "Batch",
    "BatchDecodeError",
    "Batcher",
    "BrokenResourceError",
    "ClosedResourceError",
    "CreditGrantor",
    "CreditGrantorStatistics",
    "CreditWindow",
    "CreditWindowStatistics",
    "DataPlaneError",
    "DataPlaneUsageError",
    "KeyPartitioner",
    "OverloadPolicy",
    "ProtocolError",
    "Record",
    "RoundRobinPartitioner",
    "SequenceStatistics",
    "SequenceTracker",
    "SourceBuffer",
    "SourceBufferStatistics",
    "Trace",
    "TracePoint",
    "TraceSampler",
    "WouldBlock",
    "stable_hash",
    "trace_latency",
]
