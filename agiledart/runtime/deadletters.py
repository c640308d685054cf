"""Dead letters: the records an operator with ``on_error: dead_letter`` raised on,
written where its ``dead_letter:`` says, by each of its instances on its own peer.

Theory of operation. An operator built for ``on_error: dead_letter`` keeps every record
an error drops (``OperatorStats.failed``, :mod:`agiledart.operators.base`); the app
instance takes them after each turn of the operator and gives them to the operator's
:class:`DeadLetters` here, which writes each as one JSON object (:func:`letter`) through
the ordinary sink connectors: a ``file`` sink that appends (a file path's ``{app}``,
``{op}`` and ``{peer}`` filled in, so instances on different peers never share a file)
or an ``mqtt`` sink. The records are also counted in the operator's ``errors`` as
always.

A dead-letter sink that cannot write never stops the app or the peer: the error is
kept, and shown with the operator's problems in ``status``; the letters it could not
take are counted in ``lost``; the next letters try again. One that cannot even be
opened (a folder that cannot be made) is shown the same way, every letter lost; a path
outside what the peer allows (:mod:`agiledart.runtime.confine`) is refused when the app
deploys, as for any sink. Guarantee: at least once, best effort. A record replayed
after a recovery that raises again is written again; letters a dead peer had not yet
flushed (a file's last second, an mqtt sink's queue) are lost with it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import DeadLetterSpec
from agiledart.runtime.confine import ConfinementError
from agiledart.runtime.connectors import FileSink, Sink, json_line, open_sink
from agiledart.runtime.mqtt import BrokerPool, MqttSink

if TYPE_CHECKING:
    from agiledart.runtime.confine import DataPolicy

log = logging.getLogger(__name__)

__all__ = ["DRAIN_S", "DeadLetters", "letter"]

#: an mqtt dead-letter sink's queue gets this long, at most, to go out when the
#: instance stops (the app's end must not wait for a slow broker)
DRAIN_S = 5.0


def letter(failed: dict[str, Any], *, app: str, op: str, peer: str, ts: int) -> dict[str, Any]:
    """The dead letter of one record ``failed`` (``{"type", "message", "record"}``):
    JSON-safe (bytes as hex, NaN and infinities null; a record JSON cannot hold at all,
    e.g. with tuple keys, as its ``repr``)."""
    record = failed.get("record")
    try:
        record = json.loads(json_line(record))
    except (TypeError, ValueError):
        record = repr(record)
    return {
        "app": app,
        "op": op,
        "peer": peer,
        "error_type": str(failed.get("type", "")),
        "message": str(failed.get("message", "")),
        "record": record,
        "ts": ts,
    }


class DeadLetters:
    """The dead-letter sink of one operator's instance on this peer."""

    def __init__(
        self,
        spec: DeadLetterSpec,
        *,
        app: str,
        op: str,
        peer: str,
        out_dir: Path,
        brokers: BrokerPool | None,
        policy: DataPolicy | None,
    ) -> None:
        self.app, self.op, self.peer = app, op, peer
        self.connector = spec.connector
        self.sink: Sink | None = None
        self.written = 0  #: letters the sink took
        self.lost = 0  #: letters it could not take
        self.error: str | None = None  #: why the last write (or the opening) failed
        sink_spec = spec.sink(app=app, op=op, peer=peer)
        try:
            if spec.connector == "file":
                self.sink = FileSink(sink_spec, out_dir=out_dir, policy=policy, append=True)
            else:
                self.sink = open_sink(sink_spec, out_dir=out_dir, brokers=brokers, policy=policy)
        except ConfinementError:
            raise
        except ExecutionError as exc:
            self._failed(str(exc))

    def _failed(self, error: str) -> None:
        if self.error is None:
            log.warning(
                "app %s: dead letters of %s cannot be written: %s", self.app, self.op, error
            )
        self.error = error

    def write(self, failed: list[dict[str, Any]], *, ts: int) -> None:
        """One letter per record in ``failed``; never raises."""
        letters = [letter(f, app=self.app, op=self.op, peer=self.peer, ts=ts) for f in failed]
        if self.sink is None:
            self.lost += len(letters)
            return
        try:
            self.sink.write(letters)
        except ExecutionError as exc:
            self.lost += len(letters)
            self._failed(str(exc))
            return
        self.written += len(letters)
        self.error = None

    def publisher(self) -> Coroutine[Any, Any, None] | None:
        """An mqtt sink's publisher, for the instance's task group (others: None)."""
        return self.sink.run() if isinstance(self.sink, MqttSink) else None

    async def drain(self) -> None:
        """Give an mqtt sink's queue up to :data:`DRAIN_S` to go out, when connected."""
        sink = self.sink
        if isinstance(sink, MqttSink) and sink.connected and sink.queued:
            await sink.drain(min(DRAIN_S, sink.drain_timeout_s))

    def close(self) -> None:
        """Flush and close the sink; closing again does nothing."""
        if self.sink is None:
            return
        try:
            self.sink.close()
        except ExecutionError as exc:
            self._failed(str(exc))

    def info(self) -> dict[str, Any]:
        """What ``status`` shows of the sink: the file and the letters written to it, or
        the broker connection and the letters published and still queued; the letters
        lost, the last error, and whether any of that is a ``problem``."""
        sink = self.sink
        out: dict[str, Any] = {"connector": self.connector, "lost": self.lost, "error": self.error}
        if isinstance(sink, FileSink):
            out["path"] = os.path.abspath(sink.path)
            out["written"] = self.written
        elif isinstance(sink, MqttSink):
            out["published"] = sink.stats.records
            out["queued"] = sink.queued
            out["lost"] += sink.stats.dropped + sink.stats.errors
            c = sink.connection()
            out["connection"] = c["state"]
            out["retrying_since"] = c["since"] if c["state"] != "connected" else None
            out["last_error"] = c["last_error"]
        out["problem"] = bool(out["error"] or out["lost"] or out.get("connection") == "retrying")
        return out
