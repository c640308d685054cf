"""The peer's ingest process: one per broker, reading the broker into sources' logs.

``python -m agiledart.runtime.mqtt.worker``, started by the peer's
:class:`~agiledart.runtime.mqtt.BrokerPool`. Why a process: with Mosquitto's default
``max_inflight_messages 20`` a QoS 1 subscriber has to acknowledge every 20 messages
within about a millisecond to keep up with a ``mosquitto_pub`` burst, or the broker's
queue (``max_queued_messages 1000``) overflows and it drops the rest. A peer's event
loop, busy with its apps, and on a shared CPU, cannot promise that; a small process
that only reads, writes logs and acknowledges wakes as promptly as
``mosquitto_sub`` does. It runs :class:`~agiledart.runtime.mqtt.ingest.Ingest`.

The peer and the process speak JSON lines. Peer to process (stdin): first the
connection (``broker`` options, ``client_id``, ``session_expiry_s``, ``keepalive_s``,
``timeout_s``, ``log_level``), then ``{"op": "add", "key", "filter", "qos", "dir",
"max_bytes", "limit", "start", "read", "released"}`` (a log already in ``dir`` is
continued), ``{"op": "remove", "key"}`` and ``{"op": "read", "key", "position",
"released"}`` (how far a source has read: the log's bound counts from there; and the
segments it removed). Process to peer (stdout): ``{"k": key, "c": committed, "s":
shed, "r": received}`` after an add and a commit, ``{"k": key, "a": active, "why":
refused}`` when the broker takes or loses a subscription, ``{"stats": {...}}`` twice
a second while they change. The process ends when its stdin closes (the peer is gone)
or it is terminated.

With ``"hold": true`` in the connection (a checkpointed app's source, alone on its own
broker session) QoS 1 messages are not acknowledged once logged but held (:mod:`.acks`)
until the source says their positions are done: the add carries ``"done"`` (the
position of the last committed epoch) and ``"seed"`` (the packet ids a checkpoint
recorded, for a log begun anew on another peer), and a ``read`` carries ``"done"``.
The commit reports add ``"d"``: the redeliveries dropped as duplicates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from agiledart.runtime.mqtt.acks import HeldAcks
from agiledart.runtime.mqtt.core import Backoff, BrokerOptions, BrokerPoolStatistics
from agiledart.runtime.mqtt.ingest import Ingest
from agiledart.runtime.mqtt.log import LogWriter
from agiledart.runtime.mqtt.wire import Publish

__all__ = ["main"]

log = logging.getLogger(__name__)

#: seconds between statistics reports
STATS_S = 0.5


@dataclass(slots=True)
class _Sub:
    key: int
    topic_filter: str
    writer: LogWriter
    received: int = 0
    reported: tuple[int, ...] = ()
    acks: HeldAcks | None = None  #: a held session's
    pending: list[int] | None = None  #: packet ids of the messages appended, not committed

    def deliver(self, topic: str, payload: bytes) -> None:
        self.received += 1
        self.writer.append(topic, payload)


class _Worker:
    def __init__(self, config: dict[str, Any], out: asyncio.WriteTransport) -> None:
        self.out = out
        self.stats = BrokerPoolStatistics()
        self.ingest = Ingest(
            BrokerOptions(**config["broker"]),
            client_id=str(config["client_id"]),
            session_expiry_s=int(config.get("session_expiry_s", 0)),
            keepalive_s=int(config["keepalive_s"]),
            timeout_s=float(config["timeout_s"]),
            stats=self.stats,
        )
        self.backoff = Backoff(**config.get("backoff", {}))
        self.hold = bool(config.get("hold"))
        self.subs: dict[int, _Sub] = {}
        self._keys: dict[int, int] = {}  #: the peer's key -> the table's
        self._reported: dict[str, Any] = {}

    def send(self, message: dict[str, Any]) -> None:
        if not self.out.is_closing():
            self.out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def command(self, cmd: dict[str, Any]) -> None:
        op, key = cmd["op"], int(cmd["key"])
        if op == "add":
            self._add(key, cmd)
        elif op == "remove":
            self._remove(key)
        elif op == "read" and key in self.subs:
            sub = self.subs[key]
            sub.writer.reader_at(int(cmd["position"]), cmd.get("released"))
            if sub.acks is not None and cmd.get("done") is not None:
                self.ingest.ack(sub.acks.release(int(cmd["done"])))

    def _add(self, key: int, cmd: dict[str, Any]) -> None:
        ingest = self.ingest
        writer = LogWriter(
            Path(cmd["dir"]),
            max_bytes=int(cmd["max_bytes"]),
            limit=cmd.get("limit"),
            start=int(cmd.get("start", 0)),
        )
        writer.reader_at(int(cmd.get("read", writer.read)), cmd.get("released"))
        sub = self.subs[key] = _Sub(key, cmd["filter"], writer)
        if self.hold:  # one source per held session: every message is its
            sub.acks = HeldAcks(
                writer.directory,
                committed=writer.committed,
                done=int(cmd.get("done", writer.committed)),
                seed=cmd.get("seed"),
            )
            sub.pending = []
            ingest.hold = partial(self._held, sub)
            ingest.on_session = sub.acks.new_session
        tkey = self._keys[key] = ingest.table.add(sub.topic_filter, int(cmd["qos"]), sub.deliver)
        ingest.watchers[tkey] = (sub.topic_filter, partial(self._active, key))
        ingest.commits[tkey] = partial(self._commit, key)
        ingest.changed.set()
        self._commit(key)  # what the log holds already (a continued one)

    def _remove(self, key: int) -> None:
        ingest = self.ingest
        sub = self.subs.pop(key, None)
        if sub is None:
            return
        tkey = self._keys.pop(key)
        if sub.acks is not None:
            ingest.hold = ingest.on_session = None
        ingest.watchers.pop(tkey, None)
        ingest.commits.pop(tkey, None)
        if ingest.table.remove(sub.topic_filter, tkey):
            ingest.refused.pop(sub.topic_filter, None)
            ingest.changed.set()
        sub.writer.close()

    def _active(self, key: int, active: bool) -> None:
        sub = self.subs.get(key)
        if sub is not None:
            self.report()  # first: the subscriptions and connection this change made
            self.send({"k": key, "a": active, "why": self.ingest.refused.get(sub.topic_filter)})

    def _held(self, sub: _Sub, ev: Publish) -> None:
        """A message of a held session: a duplicate dropped, or logged (not acked)."""
        acks, pending = sub.acks, sub.pending
        assert acks is not None
        assert pending is not None
        if ev.dup:
            position = acks.redelivered(ev.packet_id)
            if position is not None:
                self.ingest.ack(acks.hold(position, ev.packet_id))
                return
        else:
            acks.fresh()
        sub.received += 1
        if sub.writer.append(ev.topic, ev.payload):
            pending.append(ev.packet_id if ev.qos else 0)
        elif ev.qos:
            self.ingest.ack([ev.packet_id])  # shed (counted): the broker need not keep it

    def _commit(self, key: int) -> None:
        sub = self.subs.get(key)
        if sub is None:
            return
        first = sub.writer.committed
        done = sub.writer.commit()
        if sub.acks is not None and sub.pending is not None:
            pids, sub.pending = sub.pending, []
            if done == len(pids) and pids:
                sub.acks.logged(first, pids)
            elif pids:  # the disk failed: shed (counted), not kept at the broker either
                self.ingest.ack([p for p in pids if p])
        dups = 0 if sub.acks is None else sub.acks.duplicates
        now = (sub.writer.committed, sub.writer.shed, sub.received, dups)
        if now != sub.reported:
            sub.reported = now
            self.report()  # first: the counts that include these messages
            self.send({"k": key, "c": now[0], "s": now[1], "r": now[2], "d": now[3]})

    def report(self) -> None:
        """Send the statistics, if they changed since last sent."""
        st = asdict(self.stats)
        st["connected"] = int(self.ingest.connected)
        st["subscriptions"] = len(self.ingest.granted)
        st["last_error"] = self.ingest.last_error
        st["down_since"] = self.ingest.down_since
        if st != self._reported:
            self._reported = st
            self.send({"stats": st})

    async def reporting(self) -> None:
        while True:
            await asyncio.sleep(STATS_S)
            self.report()

    async def commands(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            try:
                self.command(json.loads(line))
            except Exception:  # a bad command is the peer's bug: say so, go on
                log.exception("ingest worker: bad command %r", line[:200])


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)
    config = json.loads(await reader.readline())
    logging.basicConfig(
        level=config.get("log_level", logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    worker = _Worker(config, out)
    async with asyncio.TaskGroup() as group:
        run = group.create_task(worker.ingest.run(worker.backoff, random.Random()))
        stats = group.create_task(worker.reporting())
        await worker.commands(reader)  # until the peer closes our stdin
        run.cancel()
        stats.cancel()
    for sub in worker.subs.values():
        sub.writer.close()


def main() -> None:
    asyncio.run(_serve())


if __name__ == "__main__":
    main()
