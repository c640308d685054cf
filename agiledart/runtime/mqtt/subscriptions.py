"""The peer's side of its ingest processes: one per broker, shared by its sources.

A :class:`Subscribing` starts ``python -m agiledart.runtime.mqtt.worker`` (see
:mod:`.worker` for why a process, and the JSON lines spoken), tells it the
subscriptions its :class:`Subscription` objects want, and turns what it reports into
their state: a commit count for each log (a :class:`~.log.LogReader` reads up to
it), what it shed, whether the broker holds the filter. When the process dies it is
logged, counted in ``errors`` and started again with back-off; each log continues
after its last whole frame on disk.

A durable subscription (a checkpointed app's source) outlives its source: when the
source is stopped without ending (its app undeployed to be restored) it is
*detached*, and the process goes on logging the broker's messages for it until a
source of the next generation *attaches* and reads on from its checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agiledart.runtime.mqtt.core import BrokerOptions, BrokerPoolStatistics, Deliver
from agiledart.runtime.mqtt.log import LogReader

if TYPE_CHECKING:
    from agiledart.runtime.mqtt.pool import BrokerPool

__all__ = ["SUBSCRIPTION_FILE", "Subscribing", "Subscription"]

log = logging.getLogger(__name__)

#: The file in a durable subscription's log directory that says what it subscribes to.
SUBSCRIPTION_FILE = "subscription.json"
#: A source's own session's expiry interval when its pool's sessions do not persist.
HELD_EXPIRY_S = 3600
_WORKER = (sys.executable, "-m", "agiledart.runtime.mqtt.worker")
#: the counters an ingest process reports, summed over the processes a pool ran
_COUNTERS = ("connects", "reconnects", "messages_in", "unrouted", "errors")


class Subscription:
    """One source's subscription: its log's reader and what the broker side says.

    ``on_commit()`` is called when more of the log is committed (read it then);
    ``on_active(bool)`` when the broker takes or loses the filter. :meth:`close` ends it.
    """

    def __init__(
        self,
        owner: Subscribing,
        key: int,
        topic_filter: str,
        *,
        qos: int,
        log_dir: Path,
        max_bytes: int,
        limit: int | None,
        on_commit: Callable[[], None],
        on_active: Callable[[bool], None] | None,
        start: int = 0,
        seed: list[Any] | None = None,
    ) -> None:
        self._owner: Subscribing | None = owner
        self.key = key
        self.topic_filter = topic_filter
        self.qos = qos
        self.reader = LogReader(log_dir, start=start)
        #: when it was detached (monotonic seconds), None while a source reads it
        self.detached_at: float | None = None
        self.attachments = 1  #: sources that have read it (the latest is its reader)
        self.max_bytes = max_bytes
        self.limit = limit
        self.on_commit = on_commit
        self.on_active = on_active
        #: told the broker connection's state as it changes (see Subscribing.connection)
        self.on_connection: Callable[[dict[str, Any]], None] | None = None
        self.active = False  #: whether the broker holds the filter on the current connection
        self.refused: str | None = None  #: the broker's reason, if it refused the filter
        self.shed = 0  #: messages the ingest process gave up (the log was full)
        self.received = 0  #: messages the ingest process took for this subscription
        self._shed_before = 0  #: shed by ingest processes that have ended
        self._received_before = 0
        #: held acknowledgements (a session of its own): positions below are done
        self.done = start
        self.seed = seed  #: the packet ids its checkpoint recorded (see :mod:`.acks`)
        self.duplicates = 0  #: the broker's redeliveries dropped
        self._duplicates_before = 0

    def add_command(self) -> dict[str, Any]:
        return {
            "op": "add",
            "key": self.key,
            "filter": self.topic_filter,
            "qos": self.qos,
            "dir": str(self.reader.directory),
            "max_bytes": self.max_bytes,
            "limit": self.limit,
            "start": self.reader.committed,
            "read": self.reader.position,
            "released": self.reader.released,
            "done": self.done,
            "seed": self.seed,
        }

    def read_to(self, position: int, released: int | None = None) -> None:
        """Tell the ingest process how far the log is read (its bound counts from
        there) and remove the segments before ``released`` (default: ``position``)."""
        self.reader.release(released)
        if released is not None:
            self.done = max(self.done, released)
        if self._owner is not None:
            message = {"op": "read", "key": self.key, "position": position, "done": self.done}
            self._owner.send({**message, "released": self.reader.released})

    def attach(
        self,
        start: int,
        *,
        on_commit: Callable[[], None],
        on_active: Callable[[bool], None] | None,
    ) -> None:
        """A new source reads the log on from ``start`` (its checkpoint's position)."""
        self.attachments += 1
        self.detached_at = None
        self.on_commit, self.on_active = on_commit, on_active
        self.on_connection = None
        committed = self.reader.committed
        self.reader.seek(start)
        self.reader.committed = max(self.reader.position, committed)
        if self.on_active is not None:
            self.on_active(self.active)

    def detach(self, now: float) -> None:
        """No source reads the log for now; the ingest process goes on writing it."""
        self.detached_at = now
        self.on_commit, self.on_active, self.on_connection = _nothing, None, None

    def _report(self, message: dict[str, Any]) -> None:
        if "c" in message:
            self.reader.committed = max(self.reader.committed, int(message["c"]))
            self.shed = self._shed_before + int(message["s"])
            self.received = self._received_before + int(message["r"])
            self.duplicates = self._duplicates_before + int(message.get("d", 0))
            self.on_commit()
        elif "a" in message:
            self._set_active(bool(message["a"]), message.get("why"))

    def _set_active(self, active: bool, why: str | None = None) -> None:
        self.active, self.refused = active, why
        if self.on_active is not None:
            self.on_active(active)

    def _restarted(self) -> None:
        """A new ingest process: its counts start again from 0 (its log goes on)."""
        self._shed_before, self._received_before = self.shed, self.received
        self._duplicates_before = self.duplicates

    def close(self, *, remove: bool = True) -> None:
        """Unsubscribe; remove the log, or (``remove=False``) keep it for a source
        that may read it again, no longer taken up by a restarted peer."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.remove(self)
        self.active = False
        self.reader.close(remove=remove)
        if not remove:
            (self.reader.directory / SUBSCRIPTION_FILE).unlink(missing_ok=True)


class Subscribing:
    """The ingest process for one broker, and the subscriptions it serves."""

    def __init__(
        self, pool: BrokerPool, options: BrokerOptions, session: str | None = None
    ) -> None:
        self.pool = pool
        self.options = options
        #: a source's own session (client id), its acknowledgements held; None: the
        #: peer's shared ingest connection to the broker
        self.session = session
        self.subs: dict[int, Subscription] = {}
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        self.subscriptions = 0
        self._remote: dict[str, int] = {}  #: the running process's counters
        self._before = dict.fromkeys(_COUNTERS, 0)  #: counters of processes that ended
        self._proc: asyncio.subprocess.Process | None = None
        self._ended_why: str | None = None  #: set when an ingest process ended

    @property
    def users(self) -> int:
        return len(self.subs)

    def counters(self) -> dict[str, int]:
        return {k: self._before[k] + int(self._remote.get(k, 0)) for k in _COUNTERS}

    def send(self, message: dict[str, Any]) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def add(self, sub: Subscription) -> None:
        self.subs[sub.key] = sub
        self.send(sub.add_command())

    def remove(self, sub: Subscription) -> None:
        if self.subs.pop(sub.key, None) is not None:
            self.send({"op": "remove", "key": sub.key})
            self.pool._release_sub(self)

    async def run(self) -> None:
        """Run the ingest process, starting it again when it dies, until cancelled."""
        attempt = 0
        while True:
            try:
                await self._serve()
            except Exception:
                self.pool.stats.errors += 1
                log.exception("the MQTT ingest process for %s failed", self.options.address)
            await asyncio.sleep(self.pool.backoff.delay(attempt, self.pool.rng))
            attempt += 1

    def _config(self) -> dict[str, Any]:
        pool = self.pool
        return {
            "broker": dataclasses.asdict(self.options),
            "client_id": self.session or pool.ingest_client_id(self.options),
            "hold": self.session is not None,
            # a source's own session outlives its peer, whatever the pool's does
            "session_expiry_s": pool.session_expiry_s or (HELD_EXPIRY_S if self.session else 0),
            "keepalive_s": pool.keepalive_s,
            "timeout_s": pool.timeout_s,
            "backoff": dataclasses.asdict(pool.backoff),
            "log_level": logging.getLogger("agiledart").getEffectiveLevel(),
        }

    async def _serve(self) -> None:
        proc = await asyncio.create_subprocess_exec(
            *_WORKER,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 20,
        )
        self._proc = proc
        try:
            self.send(self._config())
            for sub in self.subs.values():
                self.send(sub.add_command())
            assert proc.stdout is not None
            async for line in proc.stdout:
                self._event(json.loads(line))
            code = await proc.wait()
            self.pool.stats.errors += 1
            log.error("the MQTT ingest process for %s exited (%s)", self.options.address, code)
        finally:
            self._proc = None
            self._ended()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(proc.wait())

    def _event(self, message: dict[str, Any]) -> None:
        if "stats" in message:
            st = message["stats"]
            self._remote = st
            self.connected = bool(st.get("connected"))
            self.subscriptions = int(st.get("subscriptions", 0))
            self._tell_connection()
            return
        sub = self.subs.get(int(message.get("k", -1)))
        if sub is not None:
            try:
                sub._report(message)
            except Exception:  # one bad subscriber must not stop the others
                self.pool.stats.errors += 1
                log.exception("an MQTT subscriber failed on %s", self.options.address)

    def connection(self) -> dict[str, Any]:
        """``{"state": connected | retrying | connecting, "since", "last_error"}``: the
        broker connection as ``status`` shows it for the sources that use it."""
        st = self._remote
        if self.connected:
            return {"state": "connected", "since": None, "last_error": None}
        error = st.get("last_error") or self._ended_why
        return {
            "state": "retrying" if error else "connecting",
            "since": st.get("down_since"),
            "last_error": error,
        }

    def _tell_connection(self) -> None:
        state = self.connection()
        for sub in list(self.subs.values()):
            if sub.on_connection is not None:
                sub.on_connection(state)

    def _ended(self) -> None:
        for k in _COUNTERS:
            self._before[k] += int(self._remote.get(k, 0))
        self._ended_why = "the ingest process ended (restarting it)"
        self._remote = {}
        self.connected, self.subscriptions = False, 0
        for sub in self.subs.values():
            sub._restarted()
            if sub.active:
                sub._set_active(False)
        self._tell_connection()


def _nothing() -> None:
    pass


def delivering(
    deliver: Deliver, stats: BrokerPoolStatistics
) -> tuple[Path, Callable[[Subscription], Callable[[], None]]]:
    """A private log directory, and an ``on_commit`` for a subscription that hands
    every committed message to ``deliver(topic, payload)`` (a failing call is logged
    and counted in ``errors``)."""
    directory = Path(tempfile.mkdtemp(prefix="agiledart-mqtt-"))

    def bind(sub: Subscription) -> Callable[[], None]:
        def on_commit() -> None:
            while messages := sub.reader.read(1000):
                for topic, payload in messages:
                    try:
                        deliver(topic, payload)
                    except Exception:
                        stats.errors += 1
                        log.exception("an MQTT subscriber failed on a message from %s", topic)
            sub.read_to(sub.reader.position)

        return on_commit

    return directory, bind
