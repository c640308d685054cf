"""The ``http`` sink and source: results POSTed to an endpoint, and a webhook receiver.

Theory of operation, the sink (a two-phase commit like the ``sql`` sink's, see
:mod:`agiledart.runtime.sql` and :mod:`agiledart.runtime.twophase`). An epoch's
records are sealed into the sink's spool on disk at its checkpoint barrier and POSTed
once the scheduler has committed the epoch: as JSON lists of at most
``batch_records`` records, each with an ``Idempotency-Key`` header
``app/sink/instance/epoch/batch`` (:func:`~.sink.idempotency_key`). An epoch is cut
into batches from its first record, and its spool entries leave the disk only once
every batch was taken, so an epoch sent again after the sink's peer restarted goes
out as the same batches with the same keys: a receiver that drops a key it has seen
receives every record exactly once. A 2xx takes a batch; no connection, a timeout, a
5xx, 408, 425 or 429 leave the records on disk (at most ``buffer_mb``, counted when
full) and are tried again with back-off; any other status fails the app with the
status, the reason and the start of the body. After the last batch of the app's end
the sink writes a marker beside its spool, so that a replay after another peer's
failure sends nothing again. Without checkpoints batches go out within ``flush_ms``
(at-least-once: such an app restarts from its beginning after a failure; their keys
are unique to the sink's opening, so a receiver never drops a new batch).

The source, a webhook receiver on its peer, is described in :mod:`.source`: a
request is answered 2xx once its records are in the source's log on the peer's disk
(:mod:`.log`), and a checkpoint records the log position, so a checkpointed app's
source is exactly-once through failures while its peer lives or restarts on its
state directory.

::

    DataError                       (agiledart.app.errors)
    └── BadBody                     a POST that is not records (answered 400)
    ExecutionError                  (agiledart.app.errors)
    ├── DestinationDown             (agiledart.runtime.twophase)
    │   └── EndpointDown            no connection, a timeout, 5xx, 408/425/429 (retried)
    └── DestinationRefused          (agiledart.runtime.twophase)
        └── EndpointRefused         another 4xx (the app fails)
"""

from agiledart.runtime.http.log import http_log_dir
from agiledart.runtime.http.sink import (
    DEFAULT_BATCH_RECORDS,
    EndpointDown,
    EndpointRefused,
    HttpSink,
    idempotency_key,
)
from agiledart.runtime.http.source import HttpSource, HttpSourceStatistics

__all__ = [
    "DEFAULT_BATCH_RECORDS",
    "EndpointDown",
    "EndpointRefused",
    "HttpSink",
    "HttpSource",
    "HttpSourceStatistics",
    "http_log_dir",
    "idempotency_key",
]
