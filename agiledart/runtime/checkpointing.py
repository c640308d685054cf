"""The scheduler's checkpoint driver (the epochs themselves: :mod:`.epochs`): every
``interval_ms`` of a checkpointed app, within the scheduler's budget (:class:`Pacer`),
barriers go into the app's sources; the reports of the epoch's end come back here, and
a complete epoch is committed into the app record, after which older fragments are
dropped and two-phase sinks told to publish."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from agiledart.errors import AgiledartError
from agiledart.runtime.appstate import AppRecord, ScheduledApp
from agiledart.runtime.epochs import CHECKPOINT_RATE, Epoch, Pacer, checkpointing
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.links import Address
from agiledart.runtime.recovery import holders_of

if TYPE_CHECKING:
    from agiledart.app.spec import AppSpec
    from agiledart.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

#: the sinks that send an epoch's output once it commits
TWO_PHASE = ("sql", "http", "mqtt")
#: the sources whose log keeps what came after the last committed epoch
LOGGED = ("mqtt", "http")

__all__ = ["Checkpointer", "told_of_commits"]


def told_of_commits(spec: AppSpec, rec: AppRecord) -> set[str]:
    """The peers told when an epoch of ``rec`` commits: those of its two-phase sinks
    (sql, http, mqtt: they send the epoch's output now) and of its logged sources (mqtt,
    http: their logs let go of what the epoch covers, and an mqtt source's held
    acknowledgements go to the broker; without the news they would wait for ever)."""
    sinks = {rec.sinks.get(k.id, k.peer) for k in spec.sinks if k.connector in TWO_PHASE}
    sources = {rec.sources.get(s.id, s.peer) for s in spec.sources if s.connector in LOGGED}
    return sinks | sources


class Checkpointer:
    def __init__(self, scheduler: Scheduler, rate: float = CHECKPOINT_RATE) -> None:
        self.s = scheduler
        self.pacer = Pacer(rate)  #: when the next epoch may start

    def _current(self, app: ScheduledApp, rec: AppRecord) -> bool:
        """Whether ``rec`` lives and is still what this scheduler holds as ``app``."""
        return rec.live and self.s.scheduled.get(app.app_id) is app and app.record is rec

    def follow(self, rec: AppRecord) -> None:
        """Start cutting epochs of ``rec`` if it checkpoints and nothing cuts them yet."""
        app = self.s.scheduled.get(rec.app_id)
        if app is None:
            return  # forgotten meanwhile: nothing to cut
        spec = self.s.spec_of(rec)
        if checkpointing(spec) is not None and app.checkpoint_loop is None:
            app.checkpoint_loop = self.s.tasks.spawn(self._loop(app))

    async def _loop(self, app: ScheduledApp) -> None:
        """Cut an epoch every ``interval_ms`` while the app lives: barriers into its
        sources; the next one only once the last committed (or timed out)."""
        try:
            while True:
                rec = app.record
                if self.s.scheduled.get(app.app_id) is not app or not rec.live:
                    return
                interval = self.s.spec_of(app.record).checkpoint.interval_ms / 1000.0
                await asyncio.sleep(interval)
                if not self._current(app, rec):
                    return
                pending = app.epochs.pending
                if not app.epochs.overdue(time.monotonic(), interval):
                    continue
                waited = await self._turn()
                if not self._current(app, rec):
                    return
                if app.epochs.pending is not pending:
                    continue  # an epoch was cut meanwhile (a rescale's)
                epoch = app.epochs.cut(rec.checkpoint, rec.generation, time.monotonic(), waited)
                await self._barriers(rec, epoch)
        finally:
            app.checkpoint_loop = None

    async def _barriers(self, rec: AppRecord, epoch: Epoch) -> None:
        """Barrier ``epoch`` into the sources. A source's peer that answers but runs
        no instance of the app lost it (a scheduler that ended the app and could not
        store its end undeployed it, a restart nobody reported): the app recovers."""
        body = {"app_id": rec.app_id, "epoch": epoch.epoch, "generation": rec.generation}
        peers = sorted(set(rec.sources.values()))
        lost = await asyncio.gather(*(self._barrier(rec, p, body) for p in peers))
        gone = [p for p, no_instance in zip(peers, lost, strict=True) if no_instance]
        if gone:
            log.warning(
                "app %s: %s runs no instance of it; recovering", rec.app_id, ", ".join(gone)
            )
            self.s.tasks.spawn(self.s.recovery.recover(rec.app_id, gone[0], restarted=True))

    async def _barrier(self, rec: AppRecord, peer: str, body: dict[str, Any]) -> bool:
        """Send ``peer`` the barrier; True when it answered that it runs no instance."""
        try:
            await self.s.links.request(rec.address_of(peer), "app_barrier", body, timeout=10.0)
        except UnknownApp:
            return True
        except AgiledartError as exc:
            log.warning("app_barrier to %s failed: %s", peer, exc)
        return False

    async def _turn(self) -> float:
        """Wait for this scheduler's next checkpoint slot (:class:`Pacer`); the seconds
        waited."""
        wait = self.pacer.reserve(time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)
        return wait

    async def report(self, app_id: str, report: dict[str, Any], *, generation: int = 0) -> None:
        """A source, a stateful instance or a sink reached the end of an epoch."""
        app = self.s.scheduled.get(app_id)
        if app is None:
            return
        rec, pending = app.record, app.epochs.pending
        if (
            not rec.live
            or pending is None
            or generation != rec.generation
            or pending.generation != rec.generation
            or report.get("epoch") != pending.epoch
        ):
            return
        if report.get("kind") == "state_failed":
            await self._abandon(app, pending, report)
            return
        pending.note(report)
        spec = self.s.spec_of(app.record)
        if app.epochs.complete(spec, rec.sources, rec.sinks, app.sinks_done, rec.placement):
            await self._commit(app, pending)

    async def _abandon(self, app: ScheduledApp, pending: Epoch, report: dict[str, Any]) -> None:
        """A stateful instance could not store its state of ``pending``'s epoch: the
        epoch can never commit. Say so in the record (status, metrics) and let the next
        epoch be cut without waiting for this one to time out."""
        rec = app.record
        app.epochs.drop()
        rec.checkpoint_failures += 1
        rec.checkpoint_error = {
            "epoch": pending.epoch,
            "instance": str(report.get("instance")),
            "error": str(report.get("error"))[:500],
            "at": time.time(),
        }
        log.warning(
            "app %s: checkpoint %d abandoned: %s: %s",
            rec.app_id, pending.epoch, rec.checkpoint_error["instance"],
            rec.checkpoint_error["error"],
        )  # fmt: skip
        await self.s.save(rec)

    async def _commit(self, app: ScheduledApp, pending: Epoch) -> None:
        rec = app.record
        commit = app.epochs.commit(holders_of(rec.checkpoint), time.monotonic(), time.time())
        rec.checkpoint = commit
        rec.checkpoints += 1
        rec.checkpoint_error = None
        saved = await self.s.save(rec)
        if self.s.trace is not None:
            states = commit["states"]
            self.s.trace.emit(
                "checkpoint",
                app=rec.app_id,
                epoch=pending.epoch,
                bytes=commit["bytes"],
                duration_ms=commit["cut_s"] * 1000.0,
                m=states[0]["m"] if states else 0,
                k=states[0]["k"] if states else 0,
                committed=True,
            )
        # older epochs' fragments go only once the record naming this epoch is stored:
        # until then a peer adopting the app reads the older commit and restores from it
        if not saved:
            return
        done = {"app_id": rec.app_id, "epoch": pending.epoch, "generation": rec.generation}
        waiting = told_of_commits(self.s.spec_of(app.record), rec)
        for peer in sorted(waiting & set(rec.addresses)):
            self.s.tasks.spawn(self.s.hosts.quiet(rec.address_of(peer), "app_committed", done))
        body = {"app": rec.app_id, "below": pending.epoch}
        for address in app.epochs.saved(holders_of(commit)):  # older epochs not needed
            self.s.tasks.spawn(self._dropped(address, body))

    async def _dropped(self, address: Address, body: dict[str, Any]) -> None:
        await self.s.hosts.quiet(address, "frag_drop", body)

    async def cut_now(self, app: ScheduledApp, timeout: float = 30.0) -> int | None:
        """Cut an epoch now (after the one being cut, if any) and wait for its commit;
        its number, or None if it did not commit in time."""
        rec = app.record
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 2 / 0.05)):  # an epoch being cut: after it
            if app.epochs.pending is None:
                break
            await asyncio.sleep(0.05)
        cut = app.epochs.cut(rec.checkpoint, rec.generation, time.monotonic())
        await self._barriers(rec, cut)
        while time.monotonic() < deadline and rec.live:
            if (rec.checkpoint or {}).get("epoch", 0) >= cut.epoch:
                return cut.epoch
            await asyncio.sleep(0.05)
        app.epochs.drop(cut.epoch)
        return None
