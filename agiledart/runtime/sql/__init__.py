"""The ``sql`` sink: an app's results as rows of a SQLite or PostgreSQL table, each
epoch's rows applied exactly once, through a buffer on disk while the database is down.

Theory of operation (a two-phase commit, as Flink's ``TwoPhaseCommitSinkFunction``).
*Pre-commit:* when checkpoint barrier E has come on every input
(:mod:`agiledart.runtime.epochs`), the rows written since barrier E-1 are *sealed*:
written to the sink's spool on its peer's disk (:mod:`agiledart.runtime.spool`,
fsynced), and only then does the sink report the epoch to the scheduler. *Commit:* once
the scheduler has committed E (every source, stateful instance and sink reported, the
app record saved), it tells the sink's peer, and the sink sends the spooled epochs up to
E to the database in order, each in one transaction that also records (app, sink,
instance, epoch) in the bookkeeping table (:mod:`.db`): an epoch already recorded is
skipped, so an epoch sent again after a crash is never applied twice.

An epoch's rows wait in memory up to ``BATCH_ROWS``; past that they go to the spool
as rows of the open epoch, which its seal renames (so a long epoch fills no memory).
The epochs' entries go out in one transaction per epoch.

*Recovery.* A restore from committed epoch R keeps the spooled epochs up to R (they
go out) and forgets the later ones (the replay makes them again); the spool outlives
the peer's restart. A PostgreSQL sink whose peer dies for good moves to another peer
(:mod:`agiledart.runtime.failover`): at each barrier E it stores the sealed epochs up
to E not yet sent with the checkpoint (fragments on leaf-set peers), and restored
elsewhere from R it makes them its spool (:meth:`~agiledart.runtime.twophase.SpooledSink.seed`)
and sends them; the bookkeeping table skips those that went out before. A SQLite sink
stays on its peer (its database is that peer's file). *The end.* When every input has
ended, the rows after the last barrier and whatever still waits go out in one
transaction that also records the sink's whole output as done (``FINAL_EPOCH``); a
later replay (another peer's failure before the app finished) then writes nothing.
*Store-and-forward.* While the database cannot be reached, committed epochs stay in
the spool (at most ``buffer_mb``; an epoch that does not fit is dropped and counted,
shown in ``status``) and the sink retries with back-off; ``status`` shows the
connection as retrying since when, with the last error. Without checkpoints rows go
out in batches (within ``flush_ms``) through the same spool: at-least-once, since an
app without checkpoints restarts from its beginning after a failure.

::

    ExecutionError                  (agiledart.app.errors)
    ├── DestinationDown             (agiledart.runtime.twophase)
    │   └── DatabaseDown            cannot reach the database now (retried)
    └── DestinationRefused          (agiledart.runtime.twophase)
        └── DatabaseRefused         a statement that cannot succeed (the app fails)
"""

from agiledart.runtime.sql.db import DatabaseDown, DatabaseRefused
from agiledart.runtime.sql.sink import DEFAULT_BUFFER_MB, SqlSink

__all__ = ["DEFAULT_BUFFER_MB", "DatabaseDown", "DatabaseRefused", "SqlSink"]
