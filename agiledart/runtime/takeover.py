"""What a peer does when another dies or when it restarts itself: the apps a dead
scheduler left are adopted by its closest live neighbour, the schedulers of the apps a
dead peer hosted are told, and a restarted peer takes back the apps it scheduled and
tells the schedulers of the apps it hosted. A peer cut off from the network (every
other one seems to die) acts on nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError
from agiledart.overlay.leafset import Membership, MembershipEvent
from agiledart.overlay.routing import Contact
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.runtime.hosting import app_id_of
from agiledart.runtime.records import record_key

if TYPE_CHECKING:
    from agiledart.runtime.service import AppRuntime

log = logging.getLogger(__name__)

__all__ = ["Takeover", "left_to"]

TAKE_BACK_TRIES = 3  #: reads of the apps a restarted peer scheduled
TAKE_BACK_WAIT_S = 1.5  #: seconds before each
DEATHS_REVISITED_S = 60.0  #: how long a death's adopter is recomputed on later deaths


class Takeover:
    """Deaths and restarts, for one peer's runtime."""

    def __init__(self, rt: AppRuntime) -> None:
        self.rt = rt
        #: dead peers whose apps this peer took care of, and when (see left_to_me)
        self._took_over: dict[str, float] = {}

    def membership(self, event: MembershipEvent) -> None:
        """A leaf-set peer declared dead: the apps this peer schedules that it hosted
        are recovered (their scheduler notices; an instance sending to it may too)."""
        if event.kind is Membership.JOINED and event.contact.name:
            log.info("%s joined this peer's leaf set", event.contact.name)
        if event.kind is not Membership.DEAD or not event.contact.name or self.rt._group is None:
            return
        dead = event.contact
        jobs = [self.rt.scheduler.peer_dead(dead.name)]
        others = [c for c in self.rt.overlay.leaf_set.members() if c.node_id != dead.node_id]
        for gone in self.left_to_me(dead):
            # the dead peer's closest live neighbour takes care of what it left
            adopt = self.rt.adopter or self.rt.scheduler.adopt_from
            jobs.append(adopt(gone))
            jobs.append(self.report_hosted(gone))
        for job in jobs:
            self.rt._background(self.unless_cut_off(others, dead.name, job))

    def left_to_me(self, dead: Contact) -> list[str]:
        """The dead peers whose apps and hosted parts this peer takes care of, now that
        ``dead`` died (see :func:`left_to`): ``dead`` whenever this peer is its closest
        live neighbour, an earlier death only if not taken care of here already."""
        now = asyncio.get_running_loop().time()
        self._took_over = {n: t for n, t in self._took_over.items() if now - t < DEATHS_REVISITED_S}
        gone = self.rt.overlay.recently_dead(DEATHS_REVISITED_S)
        mine = []
        for c in left_to(self.rt.overlay.node_id, dead, gone, self.rt.overlay.leaf_set.members()):
            if c.node_id != dead.node_id and c.name in self._took_over:
                continue  # taken care of on its own death or an earlier revisit
            self._took_over[c.name] = now
            mine.append(c.name)
        return mine

    async def unless_cut_off(
        self, others: list[Any], dead: str, job: Coroutine[Any, Any, None]
    ) -> None:
        """Act on a death only while another peer still answers: a peer cut off from
        the network (``docker network disconnect``, a dead uplink) sees every other one
        die, one after the other, and must not recover, adopt or fail their apps; the
        others, which see only it gone, do what is needed. The witnesses are the other
        leaf-set peers or, once the last of them is gone too, the rest of the routing
        table, or else the peers that died in the last minute (only a peer that knew
        nobody else acts unchecked)."""
        if not others:
            others = [c for c in self.rt.overlay.known_peers() if c.name != dead]
        if not others:
            others = [c for c in self.rt.overlay.recently_dead(60.0) if c.name != dead]
        if others:
            try:
                pings = await asyncio.gather(
                    *(self.rt.overlay.ping((c.host, c.port)) for c in others[:4])
                )
            except BaseException:  # cancelled (the peer is stopping): the job never runs
                job.close()
                raise
            if all(answer is None for answer in pings):
                job.close()
                log.warning("no leaf-set peer answers: cut off? not acting on %s's death", dead)
                return
        await job

    async def after_restart(self) -> None:
        """What this peer ran before it (re)started is gone with its process: the apps
        it scheduled resume from here, and the schedulers of the apps it hosted are
        told, so that they restart them (from their last checkpoint) with this peer
        keeping its part, instead of waiting for data it will never send or take."""
        await self.take_apps_back()
        try:
            manifest = await self.rt.records.get(record_key("hosting", self.rt.name))
        except AgiledartError as exc:
            log.debug("no hosting manifest of this peer: %s", exc)
            return
        apps = manifest.get("apps") if isinstance(manifest, dict) else None
        for app_id in apps if isinstance(apps, list) else []:
            if str(app_id) in self.rt.instances:
                continue  # deployed here again meanwhile
            try:
                rec = await self.rt.scheduler.record(str(app_id))
            except AgiledartError:
                continue
            if rec.state not in ("deploying", "running") or rec.scheduler_name == self.rt.name:
                continue
            log.info("app %s ran here before this peer restarted: telling its scheduler", app_id)
            body = {
                "app_id": rec.app_id,
                "error": f"{self.rt.name} restarted",
                "lost": self.rt.name,
                "generation": rec.generation,
            }
            try:
                await self.rt.links.request(rec.scheduler, "app_failed", body, timeout=10.0)
            except AgiledartError as exc:
                log.warning("scheduler of %s not told of this restart: %s", rec.app_id, exc)

    async def take_apps_back(self) -> None:
        """A peer restarted (same state dir, same name) before the ring declared it
        dead finds apps in the records store that still name it as their scheduler;
        nobody else will adopt them, so it resumes them (from their last checkpoint,
        keeping what ran here). Apps it schedules already (submitted since it started)
        are left alone, and no other peer is asked: a peer that answers for these apps
        must not have them adopted elsewhere. The ring may take a moment to route
        records to their owners after the join: asked a few times."""
        for _ in range(TAKE_BACK_TRIES):
            await asyncio.sleep(TAKE_BACK_WAIT_S)
            try:
                ids = await self.rt.records.get(record_key("scheduling", self.rt.name))
            except AgiledartError as exc:
                log.debug("could not read the apps this peer scheduled: %s", exc)
                continue
            if ids:
                break
        else:
            return
        if await self.rt.scheduler.resume_own() and self.rt.on_resumed is not None:
            await self.rt.on_resumed()

    async def report_hosted(self, dead: str) -> None:
        """Tell the scheduler of every app ``dead`` hosted (its hosting manifest, kept
        in the DHT) that it died: a scheduler far away in the ring does not see it."""
        try:
            manifest = await self.rt.records.get(record_key("hosting", dead))
        except AgiledartError as exc:
            log.warning("no hosting manifest of %s: %s", dead, exc)
            return
        apps = manifest.get("apps") if isinstance(manifest, dict) else None
        for app_id in apps if isinstance(apps, list) else []:
            try:
                rec = await self.rt.scheduler.record(str(app_id))
            except AgiledartError:
                continue
            if rec.state not in ("deploying", "running") or rec.scheduler_name == dead:
                continue  # over, or adopted with the dead scheduler's other apps
            body = {"app_id": rec.app_id, "dead": dead}
            if rec.scheduler_name == self.rt.name:
                await self.rt.scheduler.recover(rec.app_id, dead)
                continue
            try:
                await self.rt.links.request(rec.scheduler, "app_peer_dead", body, timeout=10.0)
            except AgiledartError as exc:
                log.warning("scheduler of %s not told of %s's death: %s", rec.app_id, dead, exc)

    async def app_peer_dead(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        dead = req.get("dead")
        if not isinstance(dead, str) or not dead:
            msg = "app_peer_dead needs 'dead': a peer name"
            raise MalformedError(msg)
        app_id = app_id_of(req)
        rec = self.rt.scheduler.apps.get(app_id)
        if rec is not None and dead in rec.hosts() and self.rt._group is not None:
            self.rt._background(self.recover_if_silent(app_id, dead))
        return True

    async def recover_if_silent(self, app_id: str, dead: str) -> None:
        """A death reported second-hand (by a peer that may itself have been cut off)
        is acted on only when ``dead`` does not answer this scheduler either."""
        rec = self.rt.scheduler.apps.get(app_id)
        if rec is not None and await self.rt.scheduler.answers(rec, dead):
            log.warning("%s was reported dead but answers: %s goes on", dead, app_id)
            return
        await self.rt.scheduler.recover(app_id, dead)


def left_to(
    me: int, dead: Contact, gone: Iterable[Contact], leaf_set: Iterable[Contact]
) -> list[Contact]:
    """The peers of ``gone`` (the peers declared dead lately) and ``dead`` (just declared
    dead) whose closest live neighbour, by XOR distance among ``me`` and the members of
    ``leaf_set`` that are not gone, is ``me``: what they scheduled and hosted is left to
    ``me``. Recomputed on every death: when two neighbours die together, each deferred
    to the other on the first death, and nobody would revisit it."""
    dead_ids = {c.node_id: c for c in gone if c.name}
    dead_ids[dead.node_id] = dead
    candidates = [me, *(c.node_id for c in leaf_set if c.node_id not in dead_ids)]
    return [c for c in dead_ids.values() if c.name and min(candidates, key=c.node_id.__xor__) == me]
