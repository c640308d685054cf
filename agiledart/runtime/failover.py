"""Recovery (paper §IV-D; docs/recovery.md): an app that lost a host rolls back as a
whole, to its last committed checkpoint when it has one, else to its beginning.

What a dead peer hosted moves to the live peer whose id is closest to it (its leaf-set
neighbour); a peer that restarted (it answers, but lost its instances) keeps its part;
so does a network sink (mqtt, http, sql to a server: what it held at the checkpoint
is restored with it). The peer of a source or of a sink writing the peer's own files
(file, SQLite) is waited for (:data:`PINNED_GRACE_S`) and the app fails if it does
not come back. Every recovery starts a new *generation*: reports of an older
one are ignored, so a restart is never recovered from twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agiledart.app.graph import topological_order
from agiledart.app.spec import AppSpec, SourceSpec
from agiledart.errors import AgiledartError
from agiledart.runtime import twophase
from agiledart.runtime.appstate import AppRecord
from agiledart.runtime.epochs import restore_plan
from agiledart.runtime.errors import DeployError
from agiledart.runtime.links import Address

if TYPE_CHECKING:
    from agiledart.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

__all__ = [
    "PINNED_GRACE_S",
    "Recovery",
    "app_hosts",
    "consumers_first",
    "movable",
    "pinned_peers",
    "replaced",
]

#: seconds a dead source's or sink's peer is waited for (see Recovery.recover)
PINNED_GRACE_S = 20.0


class Recovery:
    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler

    async def peer_dead(self, name: str) -> None:
        """The failure detector declared ``name`` dead: recover the apps it hosted."""
        for app_id, rec in list(self.s.apps.items()):
            if rec.live and name in rec.hosts():
                await self.recover(app_id, name)

    async def recover(
        self, app_id: str, dead: str, *, restarted: bool = False, generation: int | None = None
    ) -> None:
        """Move what ``dead`` hosted to the live peer closest to its id and restart the
        app from its sources' beginning on every host (the paper's policy for apps
        without checkpoints): file sinks start over, so the output is exactly that of
        a run without the failure. A peer that ``restarted`` (it answers, but lost its
        instances) keeps what it hosted. A source's or sink's peer is waited for
        (:attr:`pinned_grace_s`: a device reboots after a power cut): it keeps its part
        if it comes back, else the app fails, its data or its consumer gone with it."""
        app = self.s.scheduled.get(app_id)
        if app is None:
            return  # not scheduled here (any more)
        async with app.lock:
            rec = self.s.apps.get(app_id)
            if rec is None or not rec.live or dead not in rec.hosts():
                return  # done already, or nothing of it there
            if generation is not None and generation != rec.generation:
                return  # a restart reported of a generation recovered from meanwhile
            if generation is None and await self.s.hosts.runs_now(rec, dead):
                # declared dead after a restart it was recovered from meanwhile (it kept
                # its part and runs this generation): nothing is left to recover
                return
            started = time.monotonic()
            ends = set(rec.sources.values()) | set(rec.sinks.values())
            pinned = dead in ends and dead in pinned_peers(self.s.spec_of(rec), rec)
            if pinned and not restarted:
                restarted = await self._comes_back(rec, dead)
                if not restarted:
                    await self.s.fail(
                        rec,
                        f"peer {dead}, which hosts a source or sink, died (not back "
                        f"within {self.s.pinned_grace_s:g} s)",
                    )
                    return
            if not await self.s.still_mine(rec):
                return  # adopted while this peer was away: the adopter recovers it
            try:
                await self.restart_without(rec, dead, started, restarted=restarted)
            except AgiledartError as exc:
                log.warning("recovery of %s from the loss of %s failed: %s", app_id, dead, exc)
                await self.s.fail(rec, f"recovery from the loss of {dead} failed: {exc}")

    async def _comes_back(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer`` answers again within :attr:`pinned_grace_s`."""
        deadline = time.monotonic() + self.s.pinned_grace_s
        while time.monotonic() < deadline:
            if await self.s.hosts.answers(rec, peer):
                log.info("app %s: %s is back; it keeps its part", rec.app_id, peer)
                return True
            await asyncio.sleep(1.0)
        return False

    async def restart_without(
        self, rec: AppRecord, dead: str, started: float, *, restarted: bool = False
    ) -> None:
        """Roll the whole app back: to its last committed checkpoint when it has one
        (states restored from their fragments, sources replayed from their offsets,
        file sinks cut back to their committed size), else to its beginning. What
        ``dead`` hosted, and any other host that no longer answers (several may die at
        once), moves to the live peer closest to the dead one's id; a ``restarted``
        peer keeps its part."""
        spec = self.s.spec_of(rec)
        others = sorted(p for p in rec.hosts() if p not in (dead, self.s.name))
        answers = await asyncio.gather(*(self.s.hosts.answers(rec, p) for p in others))
        gone = {p for p, ok in zip(others, answers, strict=True) if not ok}
        ends = pinned_peers(spec, rec)  # a source that can move is not waited for
        for peer in sorted(gone & ends):
            # one missed probe of a loaded device is no death: a source's or sink's
            # peer gets the grace that a dead one gets before the app fails for it
            if await self._comes_back(rec, peer):
                gone.discard(peer)
        if not restarted:
            gone.add(dead)
        pinned = sorted(gone & ends)
        if pinned:
            msg = f"peer {pinned[0]}, which hosts a source or sink, died"
            raise DeployError(msg)
        moved: dict[str, str] = {}
        addresses = {p: a for p, a in rec.known_addresses().items() if p not in gone}
        for lost in sorted(gone):
            takeover = await self._takeover(lost, exclude=gone)
            if takeover is None:
                msg = "no live peer to take over"
                raise DeployError(msg)
            moved[lost], addresses[takeover[0]] = takeover
            log.info("app %s: %s died; %s takes over", rec.app_id, lost, takeover[0])
        rec.addresses = {p: list(a) for p, a in addresses.items() if p in rec.hosts()}
        hosted = {
            lost: sorted(op for op, peers in rec.placement.items() if lost in peers)
            for lost in [*moved, *([dead] if restarted else [])]
        }
        if self.s.ending(rec.app_id) or not await self.clear(rec):
            return  # ending: its sinks ended (the end gathers what they report)
        if not rec.live or self.s.ending(rec.app_id):
            # every sink ended meanwhile (their reports were held up while this peer
            # was frozen or busy): the output is whole, and a new generation would
            # start the file sinks over under an app that then ends
            log.info("app %s ended while it was being recovered", rec.app_id)
            return
        rec.placement = {
            op: list(dict.fromkeys(moved.get(p, p) for p in peers))
            for op, peers in rec.placement.items()
        }
        rec.sources = {sid: moved.get(p, p) for sid, p in rec.sources.items()}  # movable ones
        rec.sinks = {k: moved.get(p, p) for k, p in rec.sinks.items()}  # network sinks
        for lost, by in moved.items():
            rec.paths = [replaced(path, lost, by) for path in rec.paths]
        self.s.next_generation(rec)
        hosts = app_hosts(spec, rec.placement, rec.sources, rec.sinks)
        plan = restore_plan(rec.checkpoint, moved) if rec.checkpoint else None
        if plan is not None and rec.checkpoint is not None:
            # the states stay where they go now: a second recovery from the same
            # checkpoint must find them there, not at the peer that died first
            rec.checkpoint = {**rec.checkpoint, "states": plan["states"]}
        order = consumers_first(spec, hosts)
        events = {**moved, dead: dead} if restarted else moved
        # noted before the install: the app may end inside it (a short replay), and
        # its final status still shows the recovery; the seconds are filled in after
        noted = self._note(rec, events, hosted, plan)
        await self.s.install(rec, spec, hosts, addresses, order, restore=plan)
        self._resumed(rec, noted, round(time.monotonic() - started, 3))
        await self.s.save(rec)

    async def clear(self, rec: AppRecord) -> bool:
        """Undeploy ``rec``'s instances before its next generation: those of its
        generation or older. A host that runs a newer one deployed by another
        scheduler (an adopter, while this peer was frozen or cut off) makes this peer
        step down: False, nothing stopped there. A newer one deployed from here (this
        peer's record of it was lost) is stopped too, the next generation past it."""
        for _ in range(2):
            newer = await self.s.hosts.undeploy(rec, fenced=True)
            if not newer:
                return True
            others = sorted({n.peer for n in newer if n.scheduler != self.s.address()})
            if others:
                log.warning(
                    "app %s: %s run a newer generation under another scheduler; "
                    "this peer steps down",
                    rec.app_id,
                    ", ".join(others),
                )
                self.s.forget(rec.app_id)
                return False
            rec.generation = max(n.generation for n in newer)
        return True

    def _note(
        self,
        rec: AppRecord,
        events: Mapping[str, str],
        hosted: Mapping[str, list[str]],
        plan: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        """Record that each lost peer of ``events`` was taken over by its value (itself
        when it restarted); the entries, whose ``seconds`` :meth:`_resumed` fills in."""
        epoch = 0 if plan is None else int(plan["epoch"])
        noted: list[dict[str, Any]] = []
        for lost, by in sorted(events.items()):
            noted.append(
                {
                    "dead": lost,
                    "by": self.s.name,
                    "takeover": by,
                    "operators": hosted.get(lost, []),
                    "restarted": lost == by,
                    "mode": "restart" if plan is None else "checkpoint",
                    "epoch": epoch,
                    "at": time.time(),
                    "seconds": None,
                }
            )
        rec.recoveries.extend(noted)
        return noted

    def _resumed(self, rec: AppRecord, noted: list[dict[str, Any]], seconds: float) -> None:
        """The app runs again, ``seconds`` after the loss was found: fill in the noted
        entries and trace each recovery."""
        for entry in noted:
            entry["seconds"] = seconds
            if self.s.trace is not None:
                by = entry["takeover"]
                self.s.trace.emit(
                    "recovery",
                    app=rec.app_id,
                    dead_peer=entry["dead"],
                    epoch=entry["epoch"],
                    phase="resumed",
                    duration_ms=seconds * 1000.0,
                    operators=sorted(op for op, ps in rec.placement.items() if by in ps),
                )

    async def _takeover(self, dead: str, *, exclude: set[str]) -> tuple[str, Address] | None:
        """The live peer whose id is closest to the dead one's (its leaf-set neighbour)."""
        found = await self.s.directory.resolve(dead)
        dead_id = found[0] if found is not None else 0
        candidates = []
        for name in self.s.directory.names():
            if name in exclude:
                continue
            where = await self.s.directory.resolve(name)
            if where is not None:
                candidates.append((where[0] ^ dead_id, name, where[1]))
        for _, name, address in sorted(candidates):
            if name == self.s.name:
                return name, address
            if await self.s.hosts.ring_answers(address):
                return name, address
        return None


def replaced(path: list[str], dead: str, by: str) -> list[str]:
    """A JOIN path with ``dead`` swapped for ``by`` (a peer appears once in a row)."""
    out: list[str] = []
    for peer in (by if p == dead else p for p in path):
        if not out or out[-1] != peer:
            out.append(peer)
    return out


def consumers_first(spec: AppSpec, hosts: Mapping[str, Sequence[str]]) -> list[str]:
    """Hosting peers, those of the last nodes in topological order first."""
    order: list[str] = []
    for node in reversed(topological_order(spec)):
        for peer in hosts.get(node, ()):
            if peer not in order:
                order.append(peer)
    return order


def movable(spec: AppSpec, source: SourceSpec) -> bool:
    """Whether a source moves to another peer when its own dies: a QoS 1 mqtt source
    of a checkpointed app (its broker session follows it: agiledart.runtime.mqtt.acks)."""
    qos = source.params.get("qos", 0)
    return spec.checkpointed and source.connector == "mqtt" and qos == 1


def pinned_peers(spec: AppSpec | None, rec: AppRecord) -> set[str]:
    """The peers hosting a source or sink that cannot move: the app fails without them
    (without its spec at hand, every source and sink counts as one that cannot). A QoS
    1 mqtt source of a checkpointed app moves (:func:`movable`), and so does a network
    sink (:func:`agiledart.runtime.twophase.movable`: its output is not a file of its
    peer's)."""
    if spec is None:
        return set(rec.sources.values()) | set(rec.sinks.values())
    moves = {s.id for s in spec.sources if movable(spec, s)}
    moves |= {k.id for k in spec.sinks if twophase.movable(k)}
    ends = [*rec.sources.items(), *rec.sinks.items()]
    return {p for node, p in ends if node not in moves}


def app_hosts(
    spec: AppSpec,
    placement: Mapping[str, Sequence[str]],
    sources: Mapping[str, str] | None = None,
    sinks: Mapping[str, str] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Node id -> its hosting peers: sources and sinks on their peers (``sources``,
    ``sinks``: where those that can move now run, else the spec's), the operators where
    ``placement`` puts them."""
    src, out = sources or {}, sinks or {}
    hosts: dict[str, tuple[str, ...]] = {s.id: (src.get(s.id, s.peer),) for s in spec.sources}
    hosts |= {k.id: (out.get(k.id, k.peer),) for k in spec.sinks}
    hosts |= {op: tuple(peers) for op, peers in placement.items()}
    return hosts
