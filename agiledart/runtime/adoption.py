"""Adoption: a scheduler's apps outlive it (docs/architecture.md).

When a scheduler dies, the leaf-set neighbour closest to it reads the live apps that
name it (``scheduling:<name>`` and each ``app:<id>`` in the records store) and takes
them over: apps whose every host still runs are only rebound (their hosts report
here); an app that lost a host while nobody scheduled it, or whose host restarted, is
restarted from its last committed checkpoint (:mod:`.recovery`). It never adopts an
app its old scheduler still answers for (it asks again later, :data:`REVISIT_S`), nor
one that ended meanwhile. A scheduler that restarted resumes its own apps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from agiledart.errors import AgiledartError
from agiledart.runtime.appstate import AppRecord, AppState
from agiledart.runtime.failover import pinned_peers
from agiledart.runtime.links import Address
from agiledart.runtime.records import record_key

if TYPE_CHECKING:
    from agiledart.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

__all__ = ["REVISITS", "REVISIT_S", "Adoption"]

REVISIT_S = 5.0  #: seconds between checks of a scheduler whose adoption was declined
REVISITS = 24  #: checks, at most


class Adoption:
    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.revisiting: set[str] = set()  #: dead schedulers whose adoption waits

    async def adopt_from(self, dead: str) -> None:
        """``dead`` scheduled apps and this peer is its closest neighbour: take over
        the live ones (their records are in the DHT) and restart them, so that their
        instances report here (and whatever ``dead`` hosted runs elsewhere)."""
        ids = await self.s.records.get(record_key("scheduling", dead))
        for app_id in ids if isinstance(ids, list) else []:
            try:
                raw = await self.s.records.get(record_key("app", str(app_id)))
                rec = AppRecord.from_wire(raw)
            except AgiledartError as exc:
                log.warning("cannot adopt app %s of %s: %s", app_id, dead, exc)
                continue
            if not rec.live or rec.scheduler_name != dead:
                continue
            if self.s.schedules(rec.app_id):
                continue  # adopted here already, or this peer never stopped scheduling it
            if await self.s.still_scheduled(rec.scheduler, rec.app_id):
                # declared dead by a peer that was cut off, or by one that lost it for a
                # moment: adopting would give the app two schedulers
                log.warning("not adopting app %s: %s still schedules it", rec.app_id, dead)
                if dead not in self.revisiting:
                    self.revisiting.add(dead)
                    self.s.tasks.spawn(self._revisit(dead, rec.scheduler, rec.app_id))
                continue
            log.info("adopting app %s: its scheduler %s died", rec.app_id, dead)
            rec.scheduler, rec.scheduler_name = self.s.address(), self.s.name
            app = self.s.hold(rec)
            app.adopted_from = dead
            await self.s.records.add(record_key("scheduling", self.s.name), rec.app_id)
            async with app.lock:
                await self._take_over(rec, dead)

    async def _take_over(self, rec: AppRecord, dead: str) -> None:
        """Restart (or only rebind) ``rec``, adopted from ``dead``, under its lock."""
        started = time.monotonic()
        lost, restarted = dead, False
        if dead not in rec.hosts():  # nothing of it ran there: it runs on,
            silent = await self.silent_hosts(rec)
            if silent:
                # unless a host died too: its death was news while nobody
                # scheduled the app, and its instances told the dead scheduler
                lost = silent[0]
            else:
                # or restarted: it told the dead scheduler, and answers now
                # without its instances
                lost = next(iter(await self.restarted_hosts(rec)), "")
                if not lost:
                    await self.rebind(rec)
                    return
                restarted = True
        if await self.s.hosts.sinks_ended(rec):
            # every sink ended while nobody scheduled the app (their reports went to
            # the old scheduler): it finished, and a restart would run it again
            log.info("app %s finished while %s was away; ending it", rec.app_id, dead)
            await self.s.end(rec, AppState.FINISHED)
            return
        if await self.ended_meanwhile(rec, dead):
            # the old scheduler, only slow, ended the app while this peer
            # looked (its hosts undeployed it): restarting would run it again
            log.warning("not adopting app %s: it ended meanwhile", rec.app_id)
            self.s.forget(rec.app_id)
            return
        if not restarted and lost in pinned_peers(self.s.spec_of(rec), rec):
            await self.s.fail(rec, f"peer {lost}, which hosts a source or sink, died")
            return
        try:
            await self.s.recovery.restart_without(rec, lost, started, restarted=restarted)
        except AgiledartError as exc:
            await self.s.fail(rec, f"recovery from the loss of {lost} failed: {exc}")

    async def silent_hosts(self, rec: AppRecord) -> list[str]:
        """The hosts of ``rec`` that do not answer (other than this peer)."""
        hosts = sorted(p for p in rec.hosts() if p != self.s.name)
        answers = await asyncio.gather(*(self.s.hosts.answers(rec, p) for p in hosts))
        return [p for p, ok in zip(hosts, answers, strict=True) if not ok]

    async def ended_meanwhile(self, rec: AppRecord, dead: str) -> bool:
        """Whether the stored record of ``rec``, adopted from ``dead``, says it ended (or
        a third peer took it) since this peer read it."""
        try:
            now = AppRecord.from_wire(await self.s.records.get(record_key("app", rec.app_id)))
        except AgiledartError:
            return False
        return not now.live or now.scheduler_name not in (dead, self.s.name)

    async def restarted_hosts(self, rec: AppRecord) -> list[str]:
        """The hosts of ``rec`` (other than this peer) that answer but no longer run
        their instances: they restarted since the app was deployed."""
        hosts = sorted(p for p in rec.hosts() if p != self.s.name)
        runs = await asyncio.gather(*(self.s.hosts.runs(rec, p) for p in hosts))
        return [p for p, ok in zip(hosts, runs, strict=True) if not ok]

    async def resume_own(self) -> int:
        """This peer restarted: the live apps it scheduled before (their records name
        it, no other peer adopted them meanwhile) are its again, and restart from their
        last committed checkpoint where it hosted a part of them."""
        ids = await self.s.records.get(record_key("scheduling", self.s.name))
        resumed = 0
        for app_id in ids if isinstance(ids, list) else []:
            if str(app_id) in self.s.scheduled:
                continue
            try:
                rec = AppRecord.from_wire(await self.s.records.get(record_key("app", str(app_id))))
            except AgiledartError as exc:
                log.warning("cannot resume app %s: %s", app_id, exc)
                continue
            if not rec.live or rec.scheduler_name != self.s.name:
                continue
            log.info("resuming app %s, scheduled here before this peer restarted", app_id)
            resumed += 1
            rec.scheduler = self.s.address()
            async with self.s.hold(rec).lock:
                try:
                    await self.s.recovery.restart_without(
                        rec, self.s.name, time.monotonic(), restarted=self.s.name in rec.hosts()
                    )
                except AgiledartError as exc:
                    await self.s.fail(rec, f"resuming after a restart failed: {exc}")
        return resumed

    async def _revisit(self, dead: str, address: Address, app_id: str) -> None:
        """An adoption declined because ``dead`` still answered is tried again once it
        stops answering: a peer declared dead a moment before it really died never
        comes back to be declared dead again, so nobody else would adopt its apps."""
        try:
            for _ in range(REVISITS):
                await asyncio.sleep(REVISIT_S)
                if not await self.s.still_scheduled(address, app_id):
                    break
            else:
                return
        finally:
            self.revisiting.discard(dead)
        await self.adopt_from(dead)

    async def rebind(self, rec: AppRecord) -> None:
        """An adopted app whose instances all live: tell every host to report here,
        and record the new scheduler; its checkpoints resume from here. When every
        host that answers refuses (the old scheduler answers them that it still
        schedules the app), the adoption is undone."""
        body = {"app_id": rec.app_id, "scheduler": list(self.s.address())}
        replies = await asyncio.gather(
            *(
                self.s.hosts.quiet(rec.address_of(p), "app_rebind", body)
                for p in sorted(rec.addresses)
            )
        )
        if False in replies and True not in replies:
            log.warning("app %s: its hosts still follow their scheduler; not adopted", rec.app_id)
            self.s.forget(rec.app_id)
            return
        await self.s.save(rec)
        self.s.checkpoints.follow(rec)
