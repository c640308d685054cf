"""The scheduler role (docs/architecture.md): validate, record, JOIN-route, place, deploy,
then follow the app to its end.

The peer that receives ``submit`` plays the scheduler of the app for now; the zone
schedulers of a later issue implement the same :class:`SchedulerRole` interface and
take the app over by its record.

:class:`Scheduler` is a thin coordinator. It holds one
:class:`~agiledart.runtime.appstate.ScheduledApp` per app (forgetting an app drops it)
and owns every task it starts (:class:`~agiledart.runtime.tasks.TaskOwner`, closed by
:meth:`Scheduler.aclose`); the work is done by one part per concern:

* :mod:`.submission`: from a spec to a deployed app;
* :mod:`.checkpointing`: the epochs of checkpointed apps (:mod:`.epochs` the values);
* :mod:`.recovery` and :mod:`.adoption`: a host's death, a scheduler's death;
* :mod:`.rescaling`: scale-outs and migrations asked for by the controllers;
* :mod:`.appstatus`: what ``status`` and ``apps`` show;
* :mod:`.hostcalls`: the requests to the hosting peers.

The scheduler follows its apps: sinks report when they are done (state ``finished``),
instances report failures (``failed``); ``stop`` undeploys everywhere (``stopped``).
Every change of state follows :data:`~agiledart.runtime.appstate.TRANSITIONS` and is
written to the app record.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from agiledart.app.parse import Overrides, parse_spec
from agiledart.app.spec import AppSpec
from agiledart.errors import AgiledartError
from agiledart.placement.survey import LinkDelays
from agiledart.runtime import appstatus
from agiledart.runtime.adoption import Adoption
from agiledart.runtime.appstate import (
    APPS_DAYS,
    APPS_LIMIT,
    LIVE_STATES,
    AppRecord,
    AppState,
    ScheduledApp,
)
from agiledart.runtime.checkpointing import Checkpointer
from agiledart.runtime.code import CodeStore
from agiledart.runtime.epochs import CHECKPOINT_RATE
from agiledart.runtime.errors import DeployError, UnknownApp
from agiledart.runtime.failover import PINNED_GRACE_S, Recovery
from agiledart.runtime.hostcalls import HostCalls
from agiledart.runtime.instance import Deployment
from agiledart.runtime.links import Address, Links
from agiledart.runtime.records import Records, record_key
from agiledart.runtime.recovery import forget, holders_of
from agiledart.runtime.rescaling import Rescaling
from agiledart.runtime.submission import Submission
from agiledart.runtime.tasks import TaskOwner

log = logging.getLogger(__name__)

__all__ = [
    "APPS_DAYS",
    "APPS_LIMIT",
    "LIVE_STATES",
    "AppRecord",
    "PeerDirectory",
    "Scheduler",
    "SchedulerRole",
]

#: ended apps (finished, failed, stopped) a scheduler keeps in memory, the newest; it
#: reads older ones back from the DHT when asked about them
ENDED_KEPT = 256


class PeerDirectory(Protocol):
    """Where peers are: name -> (node id, address), or None when unknown."""

    async def resolve(self, name: str) -> tuple[int, Address] | None: ...

    def names(self) -> list[str]: ...


class SchedulerRole(Protocol):
    async def submit(self, spec: Any, overrides: Overrides = ()) -> AppRecord: ...

    async def status(self, app_id: str) -> dict[str, Any]: ...

    async def stop(self, app_id: str) -> AppRecord: ...


class Tracer(Protocol):
    def emit(self, type: str, **fields: Any) -> None: ...


class _Records(Mapping[str, AppRecord]):
    """The records of the apps a scheduler holds, by id (a read-only view)."""

    __slots__ = ("_held",)

    def __init__(self, held: Mapping[str, ScheduledApp]) -> None:
        self._held = held

    def __getitem__(self, app_id: str) -> AppRecord:
        return self._held[app_id].record

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


class Scheduler:
    def __init__(
        self,
        *,
        name: str,
        address: Callable[[], Address],
        records: Records,
        links: Links,
        code: CodeStore,
        directory: PeerDirectory,
        stats_of: Callable[[str], Awaitable[dict[str, Any] | None]],
        trace: Tracer | None = None,
        link_model: LinkDelays | None = None,
        checkpoint_rate: float = CHECKPOINT_RATE,
    ) -> None:
        self.name = name
        self.link_model = link_model  #: the emulated network, for model-based placement
        self.trace = trace
        self.address = address
        self.records = records
        self.links = links
        self.code = code
        self.directory = directory
        #: the apps this peer schedules (and the newest ended ones), one object each
        self.scheduled: dict[str, ScheduledApp] = {}
        self.apps: Mapping[str, AppRecord] = _Records(self.scheduled)  #: their records
        #: ended apps still in memory, oldest first (see :meth:`_retire`)
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: how long the peer of a source or sink that died is waited for before its
        #: apps fail (it keeps its part if it restarts meanwhile)
        self.pinned_grace_s = PINNED_GRACE_S
        self.tasks = TaskOwner(f"scheduler {name}")  #: every task the scheduler starts
        self.hosts = HostCalls(name=name, links=links, stats_of=stats_of)
        self.submission = Submission(self)
        self.checkpoints = Checkpointer(self, checkpoint_rate)
        self.recovery = Recovery(self)
        self.adoption = Adoption(self)
        self.rescaling = Rescaling(self)

    def start(self) -> None:
        """Open the scheduler (again, after :meth:`aclose`): it may start tasks."""
        self.tasks.start()

    async def aclose(self) -> None:
        """Stop every task the scheduler started (checkpoint loops, recoveries,
        rescales, revisits, messages to hosts) and wait until they ended."""
        await self.tasks.aclose()

    # -- the apps held here -----------------------------------------------------------

    def hold(self, rec: AppRecord) -> ScheduledApp:
        """Schedule ``rec`` here from now on (its sinks' ends counted anew); the app's
        object is kept if this peer holds it already (its lock, its epochs)."""
        app = self.scheduled.get(rec.app_id)
        if app is None:
            app = self.scheduled[rec.app_id] = ScheduledApp(rec)
        else:
            app.record, app.sinks_done = rec, {}
        return app

    def forget(self, app_id: str) -> None:
        """Drop what this peer holds in memory of ``app_id``."""
        self.scheduled.pop(app_id, None)

    def ending(self, app_id: str) -> bool:
        """Whether the end of ``app_id`` is being recorded now."""
        app = self.scheduled.get(app_id)
        return app is not None and app.ending is not None

    def next_generation(self, rec: AppRecord) -> None:
        """``rec`` is redeployed: a new generation, whose sinks and epochs start anew."""
        rec.generation += 1
        app = self.scheduled.get(rec.app_id)
        if app is not None:
            app.sinks_done = {}
            app.epochs.drop()

    def spec_of(self, rec: AppRecord) -> AppSpec:
        """``rec``'s spec, parsed once while the app lives (every checkpoint report and
        scaling request reads it; a record's spec is replaced, never changed in place)."""
        app = self.scheduled.get(rec.app_id)
        if app is not None and app.parsed is not None and app.parsed[0] is rec.spec:
            return app.parsed[1]
        spec = parse_spec(rec.spec)
        if rec.live and app is not None:  # save forgets it when the app ends
            app.parsed = (rec.spec, spec)
        return spec

    def schedules(self, app_id: str) -> bool:
        """Whether this peer schedules ``app_id`` and it is live."""
        rec = self.apps.get(app_id)
        return rec is not None and rec.live and rec.scheduler_name == self.name

    # -- the parts' entry points ------------------------------------------------------

    async def validate(
        self, source: Any, overrides: Overrides = ()
    ) -> tuple[AppSpec, dict[str, tuple[int, Address]]]:
        """The validated spec and where its pinned peers are; SpecError otherwise."""
        return await self.submission.validate(source, overrides)

    async def submit(self, source: Any, overrides: Overrides = ()) -> AppRecord:
        return await self.submission.submit(source, overrides)

    def warnings(self, rec: AppRecord) -> list[str]:
        return self.submission.warnings(rec)

    async def checkpoint_report(
        self, app_id: str, report: dict[str, Any], *, generation: int = 0
    ) -> None:
        await self.checkpoints.report(app_id, report, generation=generation)

    async def peer_dead(self, name: str) -> None:
        await self.recovery.peer_dead(name)

    async def recover(
        self, app_id: str, dead: str, *, restarted: bool = False, generation: int | None = None
    ) -> None:
        await self.recovery.recover(app_id, dead, restarted=restarted, generation=generation)

    async def adopt_from(self, dead: str) -> None:
        await self.adoption.adopt_from(dead)

    async def resume_own(self) -> int:
        return await self.adoption.resume_own()

    async def rescale(
        self,
        app_id: str,
        operators: Sequence[str],
        action: str,
        peer: str,
        *,
        generation: int,
        reason: str = "",
    ) -> bool:
        return await self.rescaling.rescale(
            app_id, operators, action, peer, generation=generation, reason=reason
        )

    async def answers(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer``, a host of ``rec``, answers a ``ring`` request now."""
        return await self.hosts.answers(rec, peer)

    async def gather(self, rec: AppRecord) -> dict[str, Any]:
        """Every hosting peer's statistics of ``rec``'s instance."""
        return await self.hosts.gather(rec)

    async def still_mine(self, rec: AppRecord) -> bool:
        """Whether the stored record of ``rec`` does not name another scheduler of the
        live app. A scheduler frozen or cut off for long was adopted meanwhile: its
        adopter's record is the truth, and this peer steps down (forgets the app)
        before it touches an instance; reports held up while it was away would
        otherwise end or restart the app under its adopter. True when the record
        cannot be read."""
        try:
            stored = AppRecord.from_wire(await self.records.get(record_key("app", rec.app_id)))
        except AgiledartError:
            return True  # nothing says otherwise
        app = self.scheduled.get(rec.app_id)
        adopted_from = None if app is None else app.adopted_from
        if stored.scheduler_name in (self.name, adopted_from) or not stored.live:
            return True
        log.warning(
            "app %s: %s schedules it now (it adopted the app while this peer was away); "
            "this peer steps down",
            rec.app_id,
            stored.scheduler_name,
        )
        self.forget(rec.app_id)
        return False

    async def still_scheduled(self, address: Address, app_id: str) -> bool:
        """Whether the peer at ``address`` answers that it schedules ``app_id``: the
        check before anybody takes an app over from a scheduler believed dead."""
        if address == self.address():
            return self.schedules(app_id)
        try:
            reply = await self.links.request(
                address, "app_scheduled", {"app_id": app_id}, timeout=3.0
            )
        except AgiledartError:
            return False
        return reply is True

    # -- deploying and saving ---------------------------------------------------------

    async def install(
        self,
        rec: AppRecord,
        spec: AppSpec,
        hosts: dict[str, tuple[str, ...]],
        addresses: Mapping[str, Address],
        order: Sequence[str],
        *,
        restore: dict[str, Any] | None = None,
    ) -> None:
        """Deploy ``hosts`` (consumers first, as ``order`` says), then start them all."""
        missing = sorted({p for ps in hosts.values() for p in ps} - set(addresses))
        if missing:
            msg = f"no address known for peers {missing}"
            raise DeployError(msg)
        rec.addresses = {p: list(addresses[p]) for ps in hosts.values() for p in ps}
        deployment = Deployment(
            app_id=rec.app_id,
            spec=spec,
            hosts=hosts,
            addresses={p: addresses[p] for p in rec.addresses},
            scheduler=self.address(),
            generation=rec.generation,
            restore=restore,
        )
        wire = deployment.to_wire()
        peers = [p for p in order if p in rec.addresses]
        peers += sorted(set(rec.addresses) - set(peers))
        for peer in peers:  # along the reversed paths: consumers are ready first
            await self.hosts.call(addresses[peer], "deploy", wire, timeout=30.0)
        await asyncio.gather(
            *(self.hosts.call(addresses[p], "start", {"app_id": rec.app_id}) for p in peers)
        )
        rec.move_to(AppState.RUNNING)
        log.info(
            "app %s running (generation %d): %s",
            rec.app_id, rec.generation,
            ", ".join(f"{op} @ {'+'.join(ps)}" for op, ps in hosts.items()),
        )  # fmt: skip
        await self.save(rec)
        self.checkpoints.follow(rec)

    async def save(self, rec: AppRecord) -> bool:
        """Store ``rec`` in the DHT; False (logged) when the store refused or failed."""
        app = self.scheduled.get(rec.app_id)
        if not rec.live and app is not None:
            app.parsed = None
        try:
            stored = await self.records.put(record_key("app", rec.app_id), rec.to_wire())
        except AgiledartError as exc:
            log.warning("could not store the record of %s: %s", rec.app_id, exc)
            return False
        if not stored:  # a newer write is there: this one must not count as saved
            log.warning("the record of %s was refused as older than the one stored", rec.app_id)
            return False
        if not rec.live and self.apps.get(rec.app_id) is rec:
            self._retire(rec.app_id)
        return True

    def _retire(self, app_id: str) -> None:
        """``app_id`` ended and its final record is in the DHT: keep it in memory among
        the :data:`ENDED_KEPT` newest ended apps, and forget the oldest beyond them
        (``status``, ``stop`` and ``apps`` read a forgotten app's record from the DHT),
        so that a peer scheduling queries for months does not grow with every one."""
        self._ended[app_id] = None
        self._ended.move_to_end(app_id)
        while len(self._ended) > ENDED_KEPT:
            old, _ = self._ended.popitem(last=False)
            rec = self.apps.get(old)
            if rec is None or rec.live:
                continue  # revived meanwhile (adopted again): not ended any more
            self.forget(old)

    # -- following --------------------------------------------------------------------

    async def sink_done(
        self, app_id: str, sink: str, info: dict[str, Any], *, generation: int = 0
    ) -> bool:
        """A sink of ``app_id`` ended; False: this peer does not know the app."""
        rec = self.apps.get(app_id)
        if rec is None:
            return False
        if not rec.live or generation != rec.generation:
            return True
        done = self.scheduled[app_id].sinks_done
        done[sink] = info
        if set(done) >= set(rec.sinks) and await self.end(rec, AppState.FINISHED):
            log.info("app %s finished", app_id)
        return True

    async def failed(
        self,
        app_id: str,
        peer: str,
        error: str,
        *,
        lost: str | None = None,
        generation: int = 0,
    ) -> bool:
        """An instance of ``app_id`` on ``peer`` failed: fail the app, or recover it when
        the instance lost a peer that is gone or restarted. False when this peer does
        not schedule the app (the reporter tries again, or its adopter's rebind)."""
        rec = self.apps.get(app_id)
        if rec is None or rec.scheduler_name != self.name:
            return False
        if not rec.live or generation != rec.generation:
            return True
        if lost is not None and lost not in rec.hosts():
            return True  # about a peer that no longer hosts it (recovered from meanwhile)
        if lost is not None:
            if not await self.hosts.answers(rec, lost):
                # the instance could not reach a peer that is gone: recover, do not fail
                self.tasks.spawn(self.recover(app_id, lost))
                return True
            if not await self.hosts.runs(rec, lost):
                # it answers but lost its instances: it restarted (a power cut, a crash
                # and a supervisor faster than the failure detector); it keeps its part
                self.tasks.spawn(self.recover(app_id, lost, restarted=True, generation=generation))
                return True
        await self.fail(rec, f"on {peer}: {error}")
        return True

    async def fail(self, rec: AppRecord, error: str) -> None:
        await self.end(rec, AppState.FAILED, error)

    async def end(self, rec: AppRecord, state: AppState, error: str | None = None) -> bool:
        """End a live ``rec`` in ``state``: its final statistics gathered once, the record
        saved, its instances undeployed. False (once that end is recorded) if it has ended
        or is ending already: a second sink's end, a repeated report or a stop racing the
        gather must not gather again and replace the totals a status has shown."""
        app = self.scheduled.get(rec.app_id) or ScheduledApp(rec)  # stopped from elsewhere
        if app.ending is not None:  # the other caller's end is the end
            await app.ending.wait()
        if not rec.live:
            return False
        ending = app.ending = asyncio.Event()
        try:
            rec.final = final = await self.hosts.gather(rec)
            for sink, info in app.sinks_done.items():
                # a sink's own end report stands in for a peer that no longer answers
                # for it (a recovery undeployed it while this end gathered)
                peer = rec.sinks.get(sink)
                if peer is not None:
                    stats = final.setdefault(peer, {"peer": peer, "generation": rec.generation})
                    stats.setdefault("sinks", {}).setdefault(sink, info)
            if rec.scheduler_name == self.name and not await self.still_mine(rec):
                return False  # adopted while this peer was away: its adopter ends it
            rec.move_to(state)
            if error is not None:
                rec.error = error
            rec.finished_at = time.time()
            await self.save(rec)
        finally:
            app.ending = None
            ending.set()
        # a newer generation (an adopter's, started while this peer was away) is not
        # this end's to stop; a user's stop stops whatever runs
        await self.hosts.undeploy(rec, fenced=state is not AppState.STOPPED)
        holders = holders_of(rec.checkpoint) | app.epochs.unsaved_holders
        app.epochs.unsaved_holders = set()
        if holders:  # its fragments are of no use now (holders sweep what is missed)
            self.tasks.spawn(forget(self.links, holders, rec.app_id))
        return True

    # -- queries ----------------------------------------------------------------------

    async def record(self, app_id: str) -> AppRecord:
        rec = self.apps.get(app_id)
        if rec is not None:
            return rec
        raw = await self.records.get(record_key("app", app_id))
        if raw is None:
            msg = f"no app {app_id!r} (see `agiledart apps`)"
            raise UnknownApp(msg)
        return AppRecord.from_wire(raw)

    async def status(self, app_id: str) -> dict[str, Any]:
        rec = await self.record(app_id)
        if rec.live and rec.scheduler_name != self.name:
            try:  # the scheduler has the live view
                return dict(
                    await self.links.request(
                        rec.scheduler, "status", {"app_id": app_id, "local": True}
                    )
                )
            except AgiledartError:
                pass
        stats = rec.final if not rec.live else await self.hosts.gather(rec)
        return appstatus.status_view(rec, stats or {})

    async def stop(self, app_id: str) -> AppRecord:
        rec = await self.record(app_id)
        if rec.scheduler_name != self.name and rec.live:
            try:
                raw = await self.links.request(
                    rec.scheduler, "stop", {"app_id": app_id, "local": True}
                )
                return AppRecord.from_wire(raw)
            except AgiledartError as exc:
                log.warning("scheduler of %s unreachable (%s); stopping it from here", app_id, exc)
        if not await self.end(rec, AppState.STOPPED):
            if rec.live:  # this peer stepped down (adopted meanwhile): the adopter stops it
                return await self.stop(app_id)
            await self.hosts.undeploy(rec)  # ended already: whatever is left of it goes
        return rec

    async def list_apps(
        self, *, days: int = APPS_DAYS, limit: int = APPS_LIMIT
    ) -> list[dict[str, Any]]:
        """The apps submitted in the last ``days`` days (UTC), newest first, at most
        ``limit`` of them; each record is read from the DHT (this peer's own from memory)."""
        return await appstatus.list_apps(self.records, self.apps, days=days, limit=limit)
