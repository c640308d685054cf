"""The scheduler role (docs/architecture.md): validate, record, JOIN-route, place, deploy.

The peer that receives ``submit`` plays the scheduler of the app for now; the zone
schedulers of a later issue implement the same :class:`SchedulerRole` interface and
take the app over by its record.

Submission, in order; nothing is deployed before every check passed:

1. Parse and validate the spec (``--set`` overrides applied). Source and sink peers
   are resolved by name: the peer's own contacts first, then the ``peer:<name>`` record
   every peer publishes in the records store. An unknown name is a spec error naming
   the field. Registered code is fetched and every ``fn`` resolved.
2. Store the app record (``app:<id>``: spec, state, scheduler address) in the records
   store and add the id to the apps index (``index:apps``), so any peer finds it.
3. Ask each source peer to route a JOIN toward the node id of each sink it feeds; the
   recorded paths are the dataflow graph.
4. :func:`agiledart.placement.place` lays the operators along the paths (leaf sets and
   capacities fetched from the path peers).
5. Deploy along the reversed paths (sink side first), then start the sources. A
   failed deployment tears down what was deployed and records the app as failed.

The scheduler then follows its apps: sinks report when they are done (state
``finished``), instances report failures (``failed``); ``stop`` undeploys everywhere
(``stopped``). Every change of state is written to the app record.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agiledart.app.errors import Problem, SpecError
from agiledart.app.functions import bind
from agiledart.app.graph import chains, topological_order
from agiledart.app.parse import Overrides, parse_spec
from agiledart.app.spec import AppSpec
from agiledart.errors import AgiledartError
from agiledart.operators.base import RECENT_ERRORS
from agiledart.placement import place_with
from agiledart.placement.join import (
    DEFAULT_SLOT_LIMIT,
    Hop,
    NoCapacity,
    PeerInfo,
    Placement,
    PlacementError,
    place,
)
from agiledart.placement.survey import LinkDelays, survey
from agiledart.runtime.code import CodeStore, code_ids_in
from agiledart.runtime.epochs import CHECKPOINT_RATE, Pacer
from agiledart.runtime.errors import CodeError, DeployError, UnknownApp
from agiledart.runtime.instance import Deployment
from agiledart.runtime.links import Address, Links
from agiledart.runtime.metrics import quantile
from agiledart.runtime.records import Records, record_key
from agiledart.runtime.recovery import fit_code, forget, holders_of

log = logging.getLogger(__name__)

__all__ = ["AppRecord", "PeerDirectory", "Scheduler", "SchedulerRole", "path_peer_infos"]

#: days of the apps index ``apps`` reads by default, and apps it lists at most
APPS_DAYS, APPS_LIMIT = 7, 500


def apps_index(day: datetime.date) -> int:
    """The key of the apps submitted on ``day`` (UTC): one set per day, so that no
    index grows without bound and ``apps`` reads only the days it is asked for."""
    return record_key("index", f"apps:{day.isoformat()}")


def utc_day(t: float) -> datetime.date:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC).date()


LIVE_STATES = ("deploying", "running")
#: seconds a dead source's or sink's peer is waited for (see Scheduler.recover)
PINNED_GRACE_S = 20.0
REVISIT_S = 5.0  #: seconds between checks of a scheduler whose adoption was declined
REVISITS = 24  #: checks, at most
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


#: the type of each field of an app record that comes from the store or a peer
_RECORD_TYPES: dict[str, type | tuple[type, ...]] = {
    "app_id": str,
    "name": str,
    "spec": dict,
    "state": str,
    "scheduler": (list, tuple),
    "scheduler_name": str,
    "submitted_at": (int, float),
    "placement": dict,
    "sources": dict,
    "sinks": dict,
    "paths": list,
    "addresses": dict,
    "error": (str, type(None)),
    "final": (dict, type(None)),
    "finished_at": (int, float, type(None)),
    "generation": int,
    "recoveries": list,
    "checkpoint": (dict, type(None)),
    "checkpoints": int,
    "checkpoint_failures": int,
    "checkpoint_error": (dict, type(None)),
    "rescales": list,
    "strategy": str,
}


@dataclass
class AppRecord:
    """What the records store keeps about an app."""

    app_id: str
    name: str
    spec: dict[str, Any]
    state: str
    scheduler: Address
    scheduler_name: str
    submitted_at: float
    placement: dict[str, list[str]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    sinks: dict[str, str] = field(default_factory=dict)
    paths: list[list[str]] = field(default_factory=list)
    addresses: dict[str, list[Any]] = field(default_factory=dict)
    error: str | None = None
    final: dict[str, Any] | None = None
    finished_at: float | None = None
    generation: int = 0  #: incremented by every recovery
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None  #: the last committed epoch (see epochs.py)
    checkpoints: int = 0  #: epochs committed
    checkpoint_failures: int = 0  #: epochs abandoned because a state was not stored
    #: why the last epoch was abandoned, until a later one commits: epoch, instance,
    #: error, at
    checkpoint_error: dict[str, Any] | None = None
    #: scale-outs and migrations carried out (agiledart.runtime.elastic)
    rescales: list[dict[str, Any]] = field(default_factory=list)
    strategy: str = "join-routing"  #: the placement strategy used (spec ``placement``)

    def to_wire(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["scheduler"] = list(self.scheduler)
        return d

    @classmethod
    def from_wire(cls, raw: Any) -> AppRecord:
        """A record read from the store or sent by a peer; UnknownApp when malformed."""
        if not isinstance(raw, dict):
            msg = "app record is not a map"
            raise UnknownApp(msg)
        d = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        try:
            wrong = sorted(
                k for k, t in _RECORD_TYPES.items() if k in d and not isinstance(d[k], t)
            )
            if wrong:
                msg = f"wrong type of {', '.join(wrong)}"
                raise TypeError(msg)
            host, port = d["scheduler"]
            d["scheduler"] = (str(host), int(port))
            if d.get("checkpoint") is not None:
                _check_commit(d["checkpoint"])
            d["addresses"] = {
                str(p): [str(a[0]), int(a[1])] for p, a in d.get("addresses", {}).items()
            }
            return cls(**d)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            msg = f"app record is malformed: {type(exc).__name__}: {exc}"
            raise UnknownApp(msg) from exc

    def hosts(self) -> set[str]:
        peers = {p for ps in self.placement.values() for p in ps}
        return peers | set(self.sources.values()) | set(self.sinks.values())


class Tracer(Protocol):
    def emit(self, type: str, **fields: Any) -> None: ...


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
        self._local_stats = stats_of
        self.apps: dict[str, AppRecord] = {}  #: apps this peer schedules
        self._sinks_done: dict[str, dict[str, dict[str, Any]]] = {}
        self._lock = asyncio.Lock()
        self._recovering: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        #: per app: the epoch being cut (epoch, started, reports) and the next one
        self._pending: dict[str, _Epoch] = {}
        self._specs: dict[str, tuple[dict[str, Any], AppSpec]] = {}  #: live apps' parsed
        self._next_epoch: dict[str, int] = {}
        self._cp_loops: dict[str, asyncio.Future[None]] = {}
        self.pacer = Pacer(checkpoint_rate)  #: when the next epoch may start
        #: ended apps still in memory, oldest first (see :meth:`_retire`)
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: apps whose end is being recorded (their final statistics being gathered)
        self._ending: dict[str, asyncio.Event] = {}
        #: holders of committed epochs whose older fragments are not dropped yet (the
        #: record naming a newer epoch could not be stored)
        self._unsaved_holders: dict[str, set[Address]] = {}
        #: how long the peer of a source or sink that died is waited for before its
        #: apps fail (it keeps its part if it restarts meanwhile)
        self.pinned_grace_s = PINNED_GRACE_S
        self._revisiting: set[str] = set()  #: dead schedulers whose adoption waits

    # -- submit -----------------------------------------------------------------------

    async def validate(
        self, source: Any, overrides: Overrides = ()
    ) -> tuple[AppSpec, dict[str, tuple[int, Address]]]:
        """The validated spec and where its pinned peers are; SpecError otherwise."""
        spec = parse_spec(source, overrides=overrides)
        pinned = sorted(
            {s.peer for s in spec.sources}
            | {k.peer for k in spec.sinks}
            | {o.peer for o in spec.operators if o.peer is not None}
        )
        found = await asyncio.gather(*(self.directory.resolve(p) for p in pinned))
        where = {p: f for p, f in zip(pinned, found, strict=True) if f is not None}
        if len(where) < len(pinned):
            known = set(self.directory.names()) | set(where)
            spec = parse_spec(source, overrides=overrides, known_peers=known)
        await self._check_code(spec)
        return spec, where

    async def _check_code(self, spec: AppSpec) -> None:
        problems: list[Problem] = []
        ids = code_ids_in(o.fn for o in spec.operators)
        for code_id in sorted(ids):
            try:
                await self.code.fetch([code_id])
            except CodeError as exc:
                for i, o in enumerate(spec.operators):
                    if o.fn and o.fn.startswith(code_id):
                        problems.append(Problem(f"operators[{i}].fn", str(exc)))
        if problems:
            raise SpecError(problems)
        resolve = self.code.resolver()
        for i, o in enumerate(spec.operators):
            if o.fn and not o.fn.startswith("builtin:"):
                try:
                    bind(resolve(o.fn), dict(o.params))
                except AgiledartError as exc:
                    problems.append(Problem(f"operators[{i}].fn", str(exc)))
                except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code
                    problems.append(Problem(f"operators[{i}].fn", f"{type(exc).__name__}: {exc}"))
        if problems:
            raise SpecError(problems)

    async def _give_up(self, rec: AppRecord) -> None:
        """Undo a submit that failed part-way: undeploy what was deployed and record
        the app as failed (it no longer counts against the scheduler's app cap)."""
        try:
            await self._undeploy(rec)
        finally:
            await self._save(rec)

    def warnings(self, rec: AppRecord) -> list[str]:
        """What the submitter should know about ``rec`` now that it runs: checkpoints
        wider than the ring are lowered to fit it (``checkpoints.fit_code``)."""
        code = _checkpointing(self._spec_of(rec))
        holders = len(self.directory.names()) - 1  # a peer's fragments go to the others
        if code is None or sum(code) <= holders:
            return []
        fitted = fit_code(*code, holders)
        if fitted is None:
            return [f"{rec.app_id}: no other peer known to hold checkpoint fragments"]
        return [
            f"{rec.app_id}: the ring has {holders + 1} peers known here, too few for "
            f"checkpoints with m={code[0]}, k={code[1]} ({sum(code)} holders besides the "
            f"operator's peer): they use m={fitted[0]}, k={fitted[1]} (set checkpoint.m "
            "and checkpoint.k to choose)"
        ]

    async def submit(self, source: Any, overrides: Overrides = ()) -> AppRecord:
        spec, where = await self.validate(source, overrides)
        app_id = f"{spec.name}-{secrets.token_hex(3)}"
        rec = AppRecord(
            app_id=app_id,
            name=spec.name,
            spec=spec.to_dict(),
            state="deploying",
            scheduler=self.address(),
            scheduler_name=self.name,
            submitted_at=time.time(),
            sources={s.id: s.peer for s in spec.sources},
            sinks={k.id: k.peer for k in spec.sinks},
        )
        self.apps[app_id] = rec
        self._sinks_done[app_id] = {}
        try:
            await self._save(rec)
            await self.records.add(apps_index(utc_day(rec.submitted_at)), app_id)
            await self.records.add(record_key("scheduling", self.name), app_id)
            await self._deploy(rec, spec, where)
        except (Exception, asyncio.CancelledError) as exc:
            # whatever stopped it (a store that failed, a host that refused, the CLI
            # that went away), an app is never left "deploying" for ever
            known = isinstance(exc, AgiledartError)
            rec.state = "failed"
            rec.error = str(exc) if known else f"submit did not complete: {exc!r}"
            await asyncio.shield(self._give_up(rec))
            if not known:
                raise
            problems = _code_problems(spec, exc)
            if problems:  # this scheduler's copy was good, a host's download was not
                raise SpecError(problems, name=spec.name) from exc
            msg = f"app {app_id} could not be deployed: {exc}"
            raise DeployError(msg, no_capacity=isinstance(exc, NoCapacity)) from exc
        return rec

    async def _deploy(
        self, rec: AppRecord, spec: AppSpec, where: dict[str, tuple[int, Address]]
    ) -> None:
        if spec.placement == "join-routing":
            seen: dict[str, Address] = {}
            paths = await self._join_paths(rec.app_id, spec, where, seen)
            infos, addresses = await self._path_peers(paths, seen)
            placement = _place_somewhere(spec, paths, infos)
        else:  # agiledart.strategies, over a survey of the ring
            topology, addresses = await survey(
                names=self.directory.names(),
                pinned=sorted(where),
                resolve=self.directory.resolve,
                request=self.links.request,
                link_model=self.link_model,
            )
            placement = place_with(spec.placement, spec, topology)
        for name, (_, addr) in where.items():
            addresses[name] = addr
        rec.placement = {op: list(ps) for op, ps in placement.operators.items()}
        rec.paths = [list(p) for p in placement.paths.values()]
        rec.strategy = placement.strategy
        if self.trace is not None:
            self.trace.emit(
                "placement",
                app=rec.app_id,
                name=spec.name,
                strategy=placement.strategy,
                placement=rec.placement,
                paths=rec.paths,
            )
        await self._install(rec, spec, _hosts(placement), addresses, placement.deploy_order)

    async def _install(
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
            await self._call(addresses[peer], "deploy", wire, timeout=30.0)
        await asyncio.gather(
            *(self._call(addresses[p], "start", {"app_id": rec.app_id}) for p in peers)
        )
        rec.state = "running"
        log.info(
            "app %s running (generation %d): %s",
            rec.app_id, rec.generation,
            ", ".join(f"{op} @ {'+'.join(ps)}" for op, ps in hosts.items()),
        )  # fmt: skip
        await self._save(rec)
        self._follow_checkpoints(rec)

    async def _join_paths(
        self,
        app_id: str,
        spec: AppSpec,
        where: dict[str, tuple[int, Address]],
        seen: dict[str, Address],
    ) -> dict[tuple[str, str], list[Hop]]:
        """One JOIN path per (source, sink) pair; ``seen`` gets the path peers' addresses."""
        pairs = sorted({(c[0], sink) for sink, cs in chains(spec).items() for c in cs})
        peer_of = {s.id: s.peer for s in spec.sources} | {k.id: k.peer for k in spec.sinks}

        async def join(source: str, sink: str) -> tuple[tuple[str, str], list[Hop]]:
            src_peer, sink_peer = peer_of[source], peer_of[sink]
            body = {
                "app_id": app_id,
                "to": f"{where[sink_peer][0]:040x}",
                "source": source,
                "sink": sink,
            }
            res = await self._call(where[src_peer][1], "join", body, timeout=20.0)
            hops = [
                Hop(h["name"], int(h["node_id"], 16), h.get("rtt_ms") or 0.0, h["capacity"])
                for h in res["path"]
            ]
            if not hops or hops[-1].peer != sink_peer:
                msg = (
                    f"the JOIN from source {source!r} ended at "
                    f"{hops[-1].peer if hops else 'nowhere'}, not at sink peer {sink_peer!r}"
                )
                raise DeployError(msg)
            for h in res["path"]:
                seen[h["name"]] = (h["host"], int(h["port"]))
            return (source, sink), hops

        return dict(await asyncio.gather(*(join(s, k) for s, k in pairs)))

    async def _path_peers(
        self, paths: Mapping[tuple[str, str], list[Hop]], seen: dict[str, Address]
    ) -> tuple[dict[str, PeerInfo], dict[str, Address]]:
        """What placement weighs: the path peers' spare capacity (as their JOIN hops
        recorded it) and leaf sets, and the spare capacity of those leaf-set peers (as
        the path peer last heard it), for overflow; and every address they know."""
        addresses = dict(seen)
        names = sorted({h.peer for hops in paths.values() for h in hops})

        async def ring(name: str) -> dict[str, Any] | None:
            try:
                reply = await self.links.request(addresses[name], "ring", {}, timeout=5.0)
            except (AgiledartError, KeyError):
                return None
            return reply if isinstance(reply, dict) else None

        rings = dict(zip(names, await asyncio.gather(*(ring(n) for n in names)), strict=True))
        return path_peer_infos(paths, rings, addresses), addresses

    async def _call(
        self, address: Address, type: str, body: dict[str, Any], *, timeout: float = 10.0
    ) -> Any:
        try:
            return await self.links.request(address, type, body, timeout=timeout)
        except AgiledartError as exc:
            msg = f"{type} at {address[0]}:{address[1]} failed: {exc}"
            raise DeployError(msg) from exc

    async def _undeploy(self, rec: AppRecord) -> None:
        addresses = {p: (str(a[0]), int(a[1])) for p, a in rec.addresses.items()}
        await asyncio.gather(
            *(self._quiet(a, "undeploy", {"app_id": rec.app_id}) for a in addresses.values())
        )

    async def _quiet(self, address: Address, type: str, body: dict[str, Any]) -> Any:
        try:
            return await self.links.request(address, type, body, timeout=10.0)
        except AgiledartError as exc:
            log.warning("%s to %s failed: %s", type, address, exc)
            return None

    async def _save(self, rec: AppRecord) -> bool:
        """Store ``rec`` in the DHT; False (logged) when the store refused or failed."""
        if rec.state not in LIVE_STATES:
            self._specs.pop(rec.app_id, None)
        try:
            stored = await self.records.put(record_key("app", rec.app_id), rec.to_wire())
        except AgiledartError as exc:
            log.warning("could not store the record of %s: %s", rec.app_id, exc)
            return False
        if not stored:  # a newer write is there: this one must not count as saved
            log.warning("the record of %s was refused as older than the one stored", rec.app_id)
            return False
        if rec.state not in LIVE_STATES and self.apps.get(rec.app_id) is rec:
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
            if rec is None or rec.state in LIVE_STATES:
                continue  # revived meanwhile (adopted again): not ended any more
            self._forget(old)

    def _forget(self, app_id: str) -> None:
        """Drop what this peer holds in memory of ``app_id``."""
        self.apps.pop(app_id, None)
        for per_app in (
            self._sinks_done,
            self._pending,
            self._next_epoch,
            self._specs,
            self._recovering,
            self._unsaved_holders,
        ):
            per_app.pop(app_id, None)

    # -- following --------------------------------------------------------------------

    async def sink_done(
        self, app_id: str, sink: str, info: dict[str, Any], *, generation: int = 0
    ) -> bool:
        """A sink of ``app_id`` ended; False: this peer does not know the app."""
        rec = self.apps.get(app_id)
        if rec is None:
            return False
        if rec.state not in LIVE_STATES or generation != rec.generation:
            return True
        done = self._sinks_done.setdefault(app_id, {})
        done[sink] = info
        if set(done) >= set(rec.sinks) and await self._end(rec, "finished"):
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
        if rec.state not in LIVE_STATES or generation != rec.generation:
            return True
        if lost is not None and lost not in rec.hosts():
            return True  # about a peer that no longer hosts it (recovered from meanwhile)
        if lost is not None:
            if not await self._answers(rec, lost):
                # the instance could not reach a peer that is gone: recover, do not fail
                self._spawn(self.recover(app_id, lost))
                return True
            if not await self._runs(rec, lost):
                # it answers but lost its instances: it restarted (a power cut, a crash
                # and a supervisor faster than the failure detector); it keeps its part
                self._spawn(self.recover(app_id, lost, restarted=True, generation=generation))
                return True
        await self._fail(rec, f"on {peer}: {error}")
        return True

    async def _fail(self, rec: AppRecord, error: str) -> None:
        await self._end(rec, "failed", error)

    async def _end(self, rec: AppRecord, state: str, error: str | None = None) -> bool:
        """End a live ``rec`` in ``state``: its final statistics gathered once, the record
        saved, its instances undeployed. False (once that end is recorded) if it has ended
        or is ending already: a second sink's end, a repeated report or a stop racing the
        gather must not gather again and replace the totals a status has shown."""
        ending = self._ending.get(rec.app_id)
        if ending is not None:  # the other caller's end is the end
            await ending.wait()
        if rec.state not in LIVE_STATES:
            return False
        ending = self._ending[rec.app_id] = asyncio.Event()
        try:
            rec.final = await self.gather(rec)
            rec.state = state
            if error is not None:
                rec.error = error
            rec.finished_at = time.time()
            await self._save(rec)
        finally:
            del self._ending[rec.app_id]
            ending.set()
        await self._undeploy(rec)
        holders = holders_of(rec.checkpoint) | self._unsaved_holders.pop(rec.app_id, set())
        if holders:  # its fragments are of no use now (holders sweep what is missed)
            self._spawn(forget(self.links, holders, rec.app_id))
        return True

    # -- checkpoints (agiledart.runtime.epochs) ------------------------------------------

    def _spec_of(self, rec: AppRecord) -> AppSpec:
        """``rec``'s spec, parsed once while the app lives (every checkpoint report and
        scaling request reads it; a record's spec is replaced, never changed in place)."""
        cached = self._specs.get(rec.app_id)
        if cached is not None and cached[0] is rec.spec:
            return cached[1]
        spec = parse_spec(rec.spec)
        if rec.state in LIVE_STATES:  # _save forgets it when the app ends
            self._specs[rec.app_id] = (rec.spec, spec)
        return spec

    def _follow_checkpoints(self, rec: AppRecord) -> None:
        """Start cutting epochs of ``rec`` if it checkpoints and nothing cuts them yet."""
        if _checkpointing(self._spec_of(rec)) is not None and rec.app_id not in self._cp_loops:
            self._cp_loops[rec.app_id] = asyncio.ensure_future(self._checkpoint_loop(rec.app_id))

    async def _checkpoint_loop(self, app_id: str) -> None:
        """Cut an epoch every ``interval_ms`` while the app lives: barriers into its
        sources; the next one only once the last committed (or timed out)."""
        try:
            while True:
                rec = self.apps.get(app_id)
                if rec is None or rec.state not in LIVE_STATES:
                    return
                spec = self._spec_of(rec)
                interval = spec.checkpoint.interval_ms / 1000.0
                await asyncio.sleep(interval)
                if rec.state not in LIVE_STATES or self.apps.get(app_id) is not rec:
                    return
                pending = self._pending.get(app_id)
                if pending is not None and time.monotonic() - pending.started < max(
                    10.0, 3 * interval
                ):
                    continue
                waited = await self._checkpoint_turn()
                if rec.state not in LIVE_STATES or self.apps.get(app_id) is not rec:
                    return
                if self._pending.get(app_id) is not pending:
                    continue  # an epoch was cut meanwhile (a rescale's)
                first = 1 + (rec.checkpoint or {}).get("epoch", 0)
                epoch = max(self._next_epoch.get(app_id, first), first)
                self._next_epoch[app_id] = epoch + 1
                self._pending[app_id] = _Epoch(epoch, time.monotonic(), rec.generation, waited)
                body = {"app_id": app_id, "epoch": epoch, "generation": rec.generation}
                peers = sorted(set(rec.sources.values()))
                await asyncio.gather(
                    *(self._quiet(_addr(rec, p), "app_barrier", body) for p in peers)
                )
        finally:
            self._cp_loops.pop(app_id, None)

    async def _checkpoint_turn(self) -> float:
        """Wait for this scheduler's next checkpoint slot (:class:`Pacer`); the seconds
        waited."""
        wait = self.pacer.reserve(time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)
        return wait

    async def checkpoint_report(
        self, app_id: str, report: dict[str, Any], *, generation: int = 0
    ) -> None:
        """A source, a stateful instance or a sink reached the end of an epoch."""
        rec = self.apps.get(app_id)
        pending = self._pending.get(app_id)
        if (
            rec is None
            or rec.state not in LIVE_STATES
            or pending is None
            or generation != rec.generation
            or pending.generation != rec.generation
            or report.get("epoch") != pending.epoch
        ):
            return
        kind = report.get("kind")
        if kind == "state_failed":
            await self._abandon(rec, pending, report)
            return
        if kind == "state":
            pending.states[str(report.get("instance"))] = report
        elif kind == "source":
            pending.sources[str(report.get("id"))] = report
        elif kind == "sink":
            pending.sinks[str(report.get("id"))] = report
        if self._complete(rec, pending):
            await self._commit(rec, pending)

    async def _abandon(self, rec: AppRecord, pending: _Epoch, report: dict[str, Any]) -> None:
        """A stateful instance could not store its state of ``pending``'s epoch: the
        epoch can never commit. Say so in the record (status, metrics) and let the next
        epoch be cut without waiting for this one to time out."""
        self._pending.pop(rec.app_id, None)
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
        await self._save(rec)

    def _complete(self, rec: AppRecord, pending: _Epoch) -> bool:
        spec = self._spec_of(rec)
        if set(pending.sources) < set(rec.sources):
            return False
        done = set(self._sinks_done.get(rec.app_id, {}))
        if not set(rec.sinks) - done <= set(pending.sinks):
            return False
        covered = {(op, r.get("peer")) for r in pending.states.values() for op in r["ops"]}
        needed = {
            (o.id, peer) for o in spec.operators if o.stateful for peer in rec.placement[o.id]
        }
        return needed <= covered

    async def _commit(self, rec: AppRecord, pending: _Epoch) -> None:
        del self._pending[rec.app_id]
        states = [
            {k: r[k] for k in ("peer", "ops", "instance", "holders", "m", "k", "bytes")}
            for r in pending.states.values()
        ]
        old = rec.checkpoint
        rec.checkpoint = {
            "epoch": pending.epoch,
            "sources": {sid: int(r.get("offset", 0)) for sid, r in pending.sources.items()},
            "sinks": {sid: r.get("commit") for sid, r in pending.sinks.items()},
            "states": states,
            "bytes": sum(int(r["bytes"]) for r in states),
            "store_s": max(
                (float(r.get("seconds", 0.0)) for r in pending.states.values()), default=0.0
            ),
            "cut_s": round(time.monotonic() - pending.started, 3),
            "waited_s": round(pending.waited, 3),
            "at": time.time(),
        }
        rec.checkpoints += 1
        rec.checkpoint_error = None
        saved = await self._save(rec)
        if self.trace is not None:
            m = states[0]["m"] if states else 0
            k = states[0]["k"] if states else 0
            self.trace.emit(
                "checkpoint",
                app=rec.app_id,
                epoch=pending.epoch,
                bytes=rec.checkpoint["bytes"],
                duration_ms=rec.checkpoint["cut_s"] * 1000.0,
                m=m,
                k=k,
                committed=True,
            )
        # older epochs' fragments go only once the record naming this epoch is stored:
        # until then a peer adopting the app reads the older commit and restores from it
        unsaved = self._unsaved_holders.setdefault(rec.app_id, set())
        unsaved.update(holders_of(old))
        if not saved:
            return
        # two-phase sinks (sql, http) send the epoch's output now that it is committed
        done = {"app_id": rec.app_id, "epoch": pending.epoch, "generation": rec.generation}
        waiting = {k.peer for k in self._spec_of(rec).sinks if k.connector in ("sql", "http")}
        for peer in sorted(waiting & set(rec.addresses)):
            self._spawn(self._quiet(_addr(rec, peer), "app_committed", done))
        holders = unsaved | holders_of(rec.checkpoint)
        self._unsaved_holders.pop(rec.app_id, None)
        body = {"app": rec.app_id, "below": pending.epoch}
        for address in holders:  # older epochs are not needed any more
            self._spawn(self._dropped(address, body))

    async def _dropped(self, address: Address, body: dict[str, Any]) -> None:
        await self._quiet(address, "frag_drop", body)

    # -- recovery ------------------------------------------------------------------------

    async def peer_dead(self, name: str) -> None:
        """The failure detector declared ``name`` dead: recover the apps it hosted."""
        for app_id, rec in list(self.apps.items()):
            if rec.state in LIVE_STATES and name in rec.hosts():
                await self.recover(app_id, name)

    async def adopt_from(self, dead: str) -> None:
        """``dead`` scheduled apps and this peer is its closest neighbour: take over
        the live ones (their records are in the DHT) and restart them, so that their
        instances report here (and whatever ``dead`` hosted runs elsewhere)."""
        ids = await self.records.get(record_key("scheduling", dead))
        for app_id in ids if isinstance(ids, list) else []:
            try:
                raw = await self.records.get(record_key("app", str(app_id)))
                rec = AppRecord.from_wire(raw)
            except AgiledartError as exc:
                log.warning("cannot adopt app %s of %s: %s", app_id, dead, exc)
                continue
            if rec.state not in LIVE_STATES or rec.scheduler_name != dead:
                continue
            if self.schedules(rec.app_id):
                continue  # adopted here already, or this peer never stopped scheduling it
            if await self.still_scheduled(rec.scheduler, rec.app_id):
                # declared dead by a peer that was cut off, or by one that lost it for a
                # moment: adopting would give the app two schedulers
                log.warning("not adopting app %s: %s still schedules it", rec.app_id, dead)
                if dead not in self._revisiting:
                    self._revisiting.add(dead)
                    self._spawn(self._revisit(dead, rec.scheduler, rec.app_id))
                continue
            log.info("adopting app %s: its scheduler %s died", rec.app_id, dead)
            rec.scheduler, rec.scheduler_name = self.address(), self.name
            self.apps[rec.app_id] = rec
            self._sinks_done[rec.app_id] = {}
            await self.records.add(record_key("scheduling", self.name), rec.app_id)
            async with self._recovering.setdefault(rec.app_id, asyncio.Lock()):
                started = time.monotonic()
                lost, restarted = dead, False
                if dead not in rec.hosts():  # nothing of it ran there: it runs on,
                    silent = await self._silent_hosts(rec)
                    if silent:
                        # unless a host died too: its death was news while nobody
                        # scheduled the app, and its instances told the dead scheduler
                        lost = silent[0]
                    else:
                        # or restarted: it told the dead scheduler, and answers now
                        # without its instances
                        lost = next(iter(await self._restarted_hosts(rec)), "")
                        if not lost:
                            await self._rebind(rec)
                            continue
                        restarted = True
                if await self._ended_meanwhile(rec, dead):
                    # the old scheduler, only slow, ended the app while this peer
                    # looked (its hosts undeployed it): restarting would run it again
                    log.warning("not adopting app %s: it ended meanwhile", rec.app_id)
                    self._forget(rec.app_id)
                    continue
                if not restarted and (lost in rec.sources.values() or lost in rec.sinks.values()):
                    await self._fail(rec, f"peer {lost}, which hosts a source or sink, died")
                    continue
                try:
                    await self._restart_without(rec, lost, started, restarted=restarted)
                except AgiledartError as exc:
                    await self._fail(rec, f"recovery from the loss of {lost} failed: {exc}")

    async def _silent_hosts(self, rec: AppRecord) -> list[str]:
        """The hosts of ``rec`` that do not answer (other than this peer)."""
        hosts = sorted(p for p in rec.hosts() if p != self.name)
        answers = await asyncio.gather(*(self._answers(rec, p) for p in hosts))
        return [p for p, ok in zip(hosts, answers, strict=True) if not ok]

    async def _ended_meanwhile(self, rec: AppRecord, dead: str) -> bool:
        """Whether the stored record of ``rec``, adopted from ``dead``, says it ended (or
        a third peer took it) since this peer read it."""
        try:
            now = AppRecord.from_wire(await self.records.get(record_key("app", rec.app_id)))
        except AgiledartError:
            return False
        return now.state not in LIVE_STATES or now.scheduler_name not in (dead, self.name)

    async def _restarted_hosts(self, rec: AppRecord) -> list[str]:
        """The hosts of ``rec`` (other than this peer) that answer but no longer run
        their instances: they restarted since the app was deployed."""
        hosts = sorted(p for p in rec.hosts() if p != self.name)
        runs = await asyncio.gather(*(self._runs(rec, p) for p in hosts))
        return [p for p, ok in zip(hosts, runs, strict=True) if not ok]

    async def resume_own(self) -> int:
        """This peer restarted: the live apps it scheduled before (their records name
        it, no other peer adopted them meanwhile) are its again, and restart from their
        last committed checkpoint where it hosted a part of them."""
        ids = await self.records.get(record_key("scheduling", self.name))
        resumed = 0
        for app_id in ids if isinstance(ids, list) else []:
            if str(app_id) in self.apps:
                continue
            try:
                rec = AppRecord.from_wire(await self.records.get(record_key("app", str(app_id))))
            except AgiledartError as exc:
                log.warning("cannot resume app %s: %s", app_id, exc)
                continue
            if rec.state not in LIVE_STATES or rec.scheduler_name != self.name:
                continue
            log.info("resuming app %s, scheduled here before this peer restarted", app_id)
            resumed += 1
            rec.scheduler = self.address()
            self.apps[rec.app_id] = rec
            self._sinks_done[rec.app_id] = {}
            async with self._recovering.setdefault(rec.app_id, asyncio.Lock()):
                try:
                    await self._restart_without(
                        rec, self.name, time.monotonic(), restarted=self.name in rec.hosts()
                    )
                except AgiledartError as exc:
                    await self._fail(rec, f"resuming after a restart failed: {exc}")
        return resumed

    async def _revisit(self, dead: str, address: Address, app_id: str) -> None:
        """An adoption declined because ``dead`` still answered is tried again once it
        stops answering: a peer declared dead a moment before it really died never
        comes back to be declared dead again, so nobody else would adopt its apps."""
        try:
            for _ in range(REVISITS):
                await asyncio.sleep(REVISIT_S)
                if not await self.still_scheduled(address, app_id):
                    break
            else:
                return
        finally:
            self._revisiting.discard(dead)
        await self.adopt_from(dead)

    def schedules(self, app_id: str) -> bool:
        """Whether this peer schedules ``app_id`` and it is live."""
        rec = self.apps.get(app_id)
        return rec is not None and rec.state in LIVE_STATES and rec.scheduler_name == self.name

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

    async def _rebind(self, rec: AppRecord) -> None:
        """An adopted app whose instances all live: tell every host to report here,
        and record the new scheduler; its checkpoints resume from here. When every
        host that answers refuses (the old scheduler answers them that it still
        schedules the app), the adoption is undone."""
        body = {"app_id": rec.app_id, "scheduler": list(self.address())}
        replies = await asyncio.gather(
            *(self._quiet(_addr(rec, p), "app_rebind", body) for p in sorted(rec.addresses))
        )
        if False in replies and True not in replies:
            log.warning("app %s: its hosts still follow their scheduler; not adopted", rec.app_id)
            self._forget(rec.app_id)
            return
        await self._save(rec)
        self._follow_checkpoints(rec)

    async def answers(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer``, a host of ``rec``, answers a ``ring`` request now."""
        return await self._answers(rec, peer)

    async def _answers(self, rec: AppRecord, peer: str) -> bool:
        address = rec.addresses.get(peer)
        if address is None:
            return False
        try:
            await self.links.request((str(address[0]), int(address[1])), "ring", {}, timeout=3.0)
        except AgiledartError:
            return False
        return True

    async def _runs(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer`` (which answers) still runs its instances of ``rec``."""
        address = rec.addresses.get(peer)
        if address is None:
            return False
        body = {"app_id": rec.app_id}
        try:
            stats = await self.links.request(_addr(rec, peer), "app_stats", body, timeout=5.0)
        except AgiledartError:
            return True  # not known to be gone: the failure stands
        return stats is not None

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
        lock = self._recovering.setdefault(app_id, asyncio.Lock())
        async with lock:
            rec = self.apps.get(app_id)
            if rec is None or rec.state not in LIVE_STATES or dead not in rec.hosts():
                return  # done already, or nothing of it there
            if generation is not None and generation != rec.generation:
                return  # a restart reported of a generation recovered from meanwhile
            if generation is None and await self._runs_now(rec, dead):
                # declared dead after a restart it was recovered from meanwhile (it kept
                # its part and runs this generation): nothing is left to recover
                return
            started = time.monotonic()
            pinned = dead in rec.sources.values() or dead in rec.sinks.values()
            if pinned and not restarted:
                restarted = await self._comes_back(rec, dead)
                if not restarted:
                    await self._fail(
                        rec,
                        f"peer {dead}, which hosts a source or sink, died (not back "
                        f"within {self.pinned_grace_s:g} s)",
                    )
                    return
            try:
                await self._restart_without(rec, dead, started, restarted=restarted)
            except AgiledartError as exc:
                log.warning("recovery of %s from the loss of %s failed: %s", app_id, dead, exc)
                await self._fail(rec, f"recovery from the loss of {dead} failed: {exc}")

    async def _runs_now(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer`` answers and runs the current generation of ``rec``."""
        address = rec.addresses.get(peer)
        if address is None:
            return False
        body = {"app_id": rec.app_id}
        try:
            stats = await self.links.request(_addr(rec, peer), "app_stats", body, timeout=1.5)
        except AgiledartError:
            return False
        return isinstance(stats, dict) and stats.get("generation") == rec.generation

    async def _comes_back(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer`` answers again within :attr:`pinned_grace_s`."""
        deadline = time.monotonic() + self.pinned_grace_s
        while time.monotonic() < deadline:
            if await self._answers(rec, peer):
                log.info("app %s: %s is back; it keeps its part", rec.app_id, peer)
                return True
            await asyncio.sleep(1.0)
        return False

    async def _restart_without(
        self, rec: AppRecord, dead: str, started: float, *, restarted: bool = False
    ) -> None:
        """Roll the whole app back: to its last committed checkpoint when it has one
        (states restored from their fragments, sources replayed from their offsets,
        file sinks cut back to their committed size), else to its beginning. What
        ``dead`` hosted, and any other host that no longer answers (several may die at
        once), moves to the live peer closest to the dead one's id; a ``restarted``
        peer keeps its part."""
        spec = self._spec_of(rec)
        others = sorted(p for p in rec.hosts() if p not in (dead, self.name))
        answers = await asyncio.gather(*(self._answers(rec, p) for p in others))
        gone = {p for p, ok in zip(others, answers, strict=True) if not ok}
        if not restarted:
            gone.add(dead)
        pinned = sorted(gone & (set(rec.sources.values()) | set(rec.sinks.values())))
        if pinned:
            msg = f"peer {pinned[0]}, which hosts a source or sink, died"
            raise DeployError(msg)
        moved: dict[str, str] = {}
        addresses = {p: (str(a[0]), int(a[1])) for p, a in rec.addresses.items() if p not in gone}
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
        await self._undeploy(rec)
        if rec.state not in LIVE_STATES or rec.app_id in self._ending:
            # every sink ended meanwhile (their reports were held up while this peer
            # was frozen or busy): the output is whole, and a new generation would
            # start the file sinks over under an app that then ends
            log.info("app %s ended while it was being recovered", rec.app_id)
            return
        rec.placement = {
            op: list(dict.fromkeys(moved.get(p, p) for p in peers))
            for op, peers in rec.placement.items()
        }
        for lost, by in moved.items():
            rec.paths = [_replaced(path, lost, by) for path in rec.paths]
        rec.generation += 1
        self._sinks_done[rec.app_id] = {}
        self._pending.pop(rec.app_id, None)
        hosts: dict[str, tuple[str, ...]] = {s.id: (s.peer,) for s in spec.sources}
        hosts |= {k.id: (k.peer,) for k in spec.sinks}
        hosts |= {op: tuple(peers) for op, peers in rec.placement.items()}
        plan = _restore_plan(rec.checkpoint, moved) if rec.checkpoint else None
        order = _consumers_first(spec, hosts)
        await self._install(rec, spec, hosts, addresses, order, restore=plan)
        seconds = round(time.monotonic() - started, 3)
        epoch = 0 if plan is None else int(plan["epoch"])
        events = {**moved, dead: dead} if restarted else moved
        for lost, by in sorted(events.items()):
            rec.recoveries.append(
                {
                    "dead": lost,
                    "by": self.name,
                    "takeover": by,
                    "operators": hosted.get(lost, []),
                    "restarted": lost == by,
                    "mode": "restart" if plan is None else "checkpoint",
                    "epoch": epoch,
                    "at": time.time(),
                    "seconds": seconds,
                }
            )
            if self.trace is not None:
                self.trace.emit(
                    "recovery",
                    app=rec.app_id,
                    dead_peer=lost,
                    epoch=epoch,
                    phase="resumed",
                    duration_ms=seconds * 1000.0,
                    operators=sorted(op for op, ps in rec.placement.items() if by in ps),
                )
        await self._save(rec)

    async def _takeover(self, dead: str, *, exclude: set[str]) -> tuple[str, Address] | None:
        """The live peer whose id is closest to the dead one's (its leaf-set neighbour)."""
        found = await self.directory.resolve(dead)
        dead_id = found[0] if found is not None else 0
        candidates = []
        for name in self.directory.names():
            if name in exclude:
                continue
            where = await self.directory.resolve(name)
            if where is not None:
                candidates.append((where[0] ^ dead_id, name, where[1]))
        for _, name, address in sorted(candidates):
            if name == self.name:
                return name, address
            try:
                await self.links.request(address, "ring", {}, timeout=3.0)
            except AgiledartError:
                continue
            return name, address
        return None

    # -- elastic scaling (agiledart.runtime.elastic) -----------------------------------

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
        """``peer``'s controller of ``operators`` asks for a scale-out (stateless: one
        more instance on a leaf-set peer of it) or a migration (stateful: its instance
        moves there, with its state). Carried out in the background; False if the app
        or its generation is not (any more) the one asked about."""
        rec = self.apps.get(app_id)
        if (
            rec is None
            or rec.state not in LIVE_STATES
            or generation != rec.generation
            or action not in ("scale-out", "migrate")
            or not operators
            or any(peer not in rec.placement.get(op, ()) for op in operators)
        ):
            return False
        cooldown = self._spec_of(rec).scaling.cooldown_ms / 1000.0
        recent = [
            e
            for e in rec.rescales
            if "refused" not in e
            and set(e["operators"]) & set(operators)
            and time.time() - float(e["at"]) < cooldown
        ]
        if recent:  # moved a moment ago: its new host has not settled yet
            return False
        self._spawn(self._rescale(app_id, list(operators), action, peer, generation, reason))
        return True

    async def _rescale(
        self, app_id: str, ops: list[str], action: str, peer: str, generation: int, reason: str
    ) -> None:
        """Cut a checkpoint, then redeploy the app from it with ``ops`` on a leaf-set
        peer of ``peer`` (the recovery path: sources replay from their offsets, file
        sinks are cut back to what was committed, states restored where they run)."""
        async with self._recovering.setdefault(app_id, asyncio.Lock()):
            rec = self.apps.get(app_id)
            if rec is None or rec.state not in LIVE_STATES or rec.generation != generation:
                return
            started = time.monotonic()
            event: dict[str, Any] = {
                "action": action,
                "operators": ops,
                "from": peer,
                "reason": reason,
                "at": time.time(),
            }
            target = await self._elastic_peer(rec, peer)
            epoch = None if target is None else await self._cut_now(rec)
            if target is None or epoch is None or rec.state not in LIVE_STATES:
                event["refused"] = "no leaf-set peer free" if target is None else "no checkpoint"
                rec.rescales.append(event)
                await self._save(rec)
                return
            name, address = target
            for op in ops:
                peers = rec.placement[op]
                rec.placement[op] = (
                    [name if p == peer else p for p in peers]
                    if action == "migrate"
                    else [*peers, name]
                )
            addresses = {p: (str(a[0]), int(a[1])) for p, a in rec.addresses.items()}
            addresses[name] = address
            await self._undeploy(rec)
            rec.generation += 1
            self._sinks_done[app_id] = {}
            self._pending.pop(app_id, None)
            spec = self._spec_of(rec)
            hosts: dict[str, tuple[str, ...]] = {s.id: (s.peer,) for s in spec.sources}
            hosts |= {k.id: (k.peer,) for k in spec.sinks}
            hosts |= {op: tuple(peers) for op, peers in rec.placement.items()}
            assert rec.checkpoint is not None
            plan = _restore_plan(rec.checkpoint, {})
            if action == "migrate":  # the moved operators' states go with them
                plan["states"] += [
                    {**e, "peer": name}
                    for e in plan["states"]
                    if e["peer"] == peer and set(e["ops"]) & set(ops)
                ]
            for i, path in enumerate(rec.paths):
                if action == "migrate" and peer not in rec.hosts():
                    rec.paths[i] = _replaced(path, peer, name)
            order = _consumers_first(spec, hosts)
            try:
                await self._install(rec, spec, hosts, addresses, order, restore=plan)
            except AgiledartError as exc:
                log.warning("app %s: %s to %s failed: %s", app_id, action, name, exc)
                await self._fail(rec, f"{action} of {', '.join(ops)} to {name} failed: {exc}")
                return
            event |= {"to": name, "epoch": epoch, "seconds": round(time.monotonic() - started, 3)}
            rec.rescales.append(event)
            log.info("app %s: %s of %s from %s to %s", app_id, action, ops, peer, name)
            await self._save(rec)

    async def _elastic_peer(self, rec: AppRecord, peer: str) -> tuple[str, Address] | None:
        """The closest leaf-set peer of ``peer`` that hosts nothing of ``rec`` and answers."""
        try:
            ring = await self.links.request(_addr(rec, peer), "ring", {}, timeout=5.0)
        except AgiledartError:
            return None
        known: dict[str, Address] = {}
        for p in ring.get("peers", ()):
            host, _, port = str(p.get("address", "")).rpartition(":")
            if host and port.isdigit():
                known[str(p.get("name"))] = (host, int(port))
        busy = rec.hosts()
        for name in ring.get("leaf_set", ()):
            address = known.get(str(name))
            if name in busy or address is None:
                continue
            try:
                await self.links.request(address, "ring", {}, timeout=3.0)
            except AgiledartError:
                continue
            return str(name), address
        return None

    async def _cut_now(self, rec: AppRecord, timeout: float = 30.0) -> int | None:
        """Cut an epoch now (after the one being cut, if any) and wait for its commit;
        its number, or None if it did not commit in time."""
        app_id = rec.app_id
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 2 / 0.05)):  # an epoch being cut: after it
            if app_id not in self._pending:
                break
            await asyncio.sleep(0.05)
        first = 1 + int((rec.checkpoint or {}).get("epoch", 0))
        epoch = max(self._next_epoch.get(app_id, first), first)
        self._next_epoch[app_id] = epoch + 1
        self._pending[app_id] = _Epoch(epoch, time.monotonic(), rec.generation)
        body = {"app_id": app_id, "epoch": epoch, "generation": rec.generation}
        peers = sorted(set(rec.sources.values()))
        await asyncio.gather(*(self._quiet(_addr(rec, p), "app_barrier", body) for p in peers))
        while time.monotonic() < deadline and rec.state in LIVE_STATES:
            if (rec.checkpoint or {}).get("epoch", 0) >= epoch:
                return epoch
            await asyncio.sleep(0.05)
        pending = self._pending.get(app_id)
        if pending is not None and pending.epoch == epoch:
            del self._pending[app_id]
        return None

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def gather(self, rec: AppRecord) -> dict[str, Any]:
        """Every hosting peer's statistics of ``rec``'s instance."""
        addresses = {p: (str(a[0]), int(a[1])) for p, a in rec.addresses.items()}

        async def one(peer: str) -> tuple[str, Any]:
            if peer == self.name:
                return peer, await self._local_stats(rec.app_id)
            return peer, await self._quiet(addresses[peer], "app_stats", {"app_id": rec.app_id})

        got = await asyncio.gather(*(one(p) for p in sorted(addresses)))
        return {p: s for p, s in got if s is not None}

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
        if rec.state in LIVE_STATES and rec.scheduler_name != self.name:
            try:  # the scheduler has the live view
                return dict(
                    await self.links.request(
                        rec.scheduler, "status", {"app_id": app_id, "local": True}
                    )
                )
            except AgiledartError:
                pass
        stats = rec.final if rec.state not in LIVE_STATES else await self.gather(rec)
        return status_view(rec, stats or {})

    async def stop(self, app_id: str) -> AppRecord:
        rec = await self.record(app_id)
        if rec.scheduler_name != self.name and rec.state in LIVE_STATES:
            try:
                raw = await self.links.request(
                    rec.scheduler, "stop", {"app_id": app_id, "local": True}
                )
                return AppRecord.from_wire(raw)
            except AgiledartError as exc:
                log.warning("scheduler of %s unreachable (%s); stopping it from here", app_id, exc)
        if not await self._end(rec, "stopped"):
            await self._undeploy(rec)  # ended already: whatever is left of it goes
        return rec

    async def list_apps(
        self, *, days: int = APPS_DAYS, limit: int = APPS_LIMIT
    ) -> list[dict[str, Any]]:
        """The apps submitted in the last ``days`` days (UTC), newest first, at most
        ``limit`` of them; each record is read from the DHT (this peer's own from memory)."""
        today = utc_day(time.time())
        keys = [apps_index(today - datetime.timedelta(days=d)) for d in range(days)]
        indices = await asyncio.gather(*(self.records.get(k) for k in keys))
        ids: list[Any] = []
        for index in indices:  # newest day first, newest app first within a day
            ids.extend(reversed(index) if isinstance(index, list) else ())
        ids = list(dict.fromkeys(ids))[:limit]
        limiter = asyncio.Semaphore(32)  # thousands of apps: a few dozen lookups at a time

        async def get(app_id: Any) -> Any:
            if str(app_id) in self.apps:
                return None  # ours: the record is in memory
            async with limiter:
                return await self.records.get(record_key("app", str(app_id)))

        recs = await asyncio.gather(*(get(i) for i in ids), return_exceptions=True)
        out = []
        for app_id, raw in zip(ids, recs, strict=True):
            rec = self.apps.get(str(app_id))
            if rec is None and not isinstance(raw, BaseException) and raw is not None:
                with contextlib.suppress(UnknownApp):  # a malformed record: unknown
                    rec = AppRecord.from_wire(raw)
            if rec is None:
                out.append({"app_id": app_id, "name": "?", "state": "unknown"})
                continue
            out.append(
                {
                    "app_id": rec.app_id,
                    "name": rec.name,
                    "state": rec.state,
                    "scheduler": rec.scheduler_name,
                    "submitted_at": rec.submitted_at,
                }
            )
        return out


@dataclass
class _Epoch:
    """An epoch being cut: what has reported its end so far."""

    epoch: int
    started: float
    generation: int
    waited: float = 0.0  #: seconds it waited for the scheduler's checkpoint budget
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)


def _checkpointing(spec: AppSpec) -> tuple[int, int] | None:
    """(m, k) if the app checkpoints its state (mode erasure or replication, or auto
    with a stateful operator and a source that does not end), else None."""
    cp = spec.checkpoint
    if not spec.checkpointed:
        return None
    return (1, cp.k) if cp.mode == "replication" else (cp.m, cp.k)


def _restore_plan(cp: dict[str, Any], moved: Mapping[str, str]) -> dict[str, Any]:
    """A deployment's ``restore`` from a committed checkpoint, dead peers' states given
    to the peers that took over from them."""
    return {
        "epoch": cp["epoch"],
        "sources": dict(cp["sources"]),
        "sinks": {k: v for k, v in cp["sinks"].items() if v is not None},
        "states": [{**e, "peer": moved.get(e["peer"], e["peer"])} for e in cp["states"]],
    }


def _check_commit(cp: dict[str, Any]) -> None:
    """TypeError unless ``cp`` has the shape of a committed epoch (what recovery reads
    from it: :func:`_restore_plan`, :func:`~agiledart.runtime.checkpoints.holders_of`)."""
    if type(cp.get("epoch")) is not int:
        msg = "checkpoint needs an integer 'epoch'"
        raise TypeError(msg)
    if not isinstance(cp.get("sources"), dict) or not isinstance(cp.get("sinks"), dict):
        msg = "checkpoint needs 'sources' and 'sinks' maps"
        raise TypeError(msg)
    states = cp.get("states")
    if not isinstance(states, list):
        msg = "checkpoint needs a 'states' list"
        raise TypeError(msg)
    for entry in states:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("peer"), str)
            and isinstance(entry.get("ops"), list)
            and isinstance(entry.get("holders"), list)
            and all(
                isinstance(h, list | tuple)
                and len(h) == 2
                and isinstance(h[1], list | tuple)
                and len(h[1]) == 2
                and isinstance(h[1][0], str)
                and type(h[1][1]) is int
                for h in entry["holders"]
            )
        ):
            msg = f"malformed checkpoint state {entry!r:.200}"
            raise TypeError(msg)


def _addr(rec: AppRecord, peer: str) -> Address:
    a = rec.addresses[peer]
    return (str(a[0]), int(a[1]))


def _replaced(path: list[str], dead: str, by: str) -> list[str]:
    """A JOIN path with ``dead`` swapped for ``by`` (a peer appears once in a row)."""
    out: list[str] = []
    for peer in (by if p == dead else p for p in path):
        if not out or out[-1] != peer:
            out.append(peer)
    return out


def _consumers_first(spec: AppSpec, hosts: Mapping[str, Sequence[str]]) -> list[str]:
    """Hosting peers, those of the last nodes in topological order first."""
    order: list[str] = []
    for node in reversed(topological_order(spec)):
        for peer in hosts.get(node, ()):
            if peer not in order:
                order.append(peer)
    return order


def _hosts(placement: Placement) -> dict[str, tuple[str, ...]]:
    hosts: dict[str, tuple[str, ...]] = {s: (p,) for s, p in placement.sources.items()}
    hosts |= {k: (p,) for k, p in placement.sinks.items()}
    hosts |= dict(placement.operators)
    return hosts


def status_view(rec: AppRecord, stats: dict[str, Any]) -> dict[str, Any]:
    """The ``status --json`` object: record fields plus totals over the peers' stats."""
    sources: dict[str, Any] = {}
    sinks: dict[str, Any] = {}
    operators: dict[str, Any] = {}
    uptime = 0.0
    for peer_stats in stats.values():
        if not isinstance(peer_stats, dict):
            continue
        uptime = max(uptime, float(peer_stats.get("uptime_s", 0.0)))
        sources.update(peer_stats.get("sources", {}))
        sinks.update(peer_stats.get("sinks", {}))
        operators.update(peer_stats.get("operators", {}))
    problems = _problems(stats)
    emitted = sum(s.get("emitted", 0) for s in sources.values())
    # recent end-to-end latencies of every sink, merged (then dropped from the peers' part)
    recent = sorted(x for s in sinks.values() for x in s.get("latency_recent_ms", ()))
    paths = list(dict.fromkeys(tuple(p) for p in rec.paths))
    return {
        "app_id": rec.app_id,
        "name": rec.name,
        "state": rec.state,
        "error": rec.error,
        "scheduler": rec.scheduler_name,
        "placement": rec.placement,
        "strategy": rec.strategy,
        "sources": rec.sources,
        "sinks": rec.sinks,
        "paths": [list(p) for p in paths],
        "generation": rec.generation,
        "recoveries": rec.recoveries,
        "checkpoint": None
        if rec.checkpoint is None
        else {
            **{k: rec.checkpoint[k] for k in ("epoch", "bytes", "store_s", "cut_s", "at")},
            "waited_s": rec.checkpoint.get("waited_s", 0.0),  # older records lack it
        },
        "problems": problems,
        "checkpoints": rec.checkpoints,
        "checkpoint_failures": rec.checkpoint_failures,
        "checkpoint_error": rec.checkpoint_error,
        "scaling": _scaling_view(stats),
        "rescales": rec.rescales,
        "totals": {
            "source_records": emitted,
            "sink_records": sum(s.get("records", 0) for s in sinks.values()),
            "delayed": sum(s.get("delayed", 0) for s in sources.values()),
            "shed": sum(s.get("shed", 0) for s in sources.values()),
            "late": sum(o.get("late", 0) for o in operators.values()),
            "errors": sum(p["errors"] for p in problems.values())
            + sum(s.get("errors", 0) for s in sinks.values()),
            "dropped": sum(s.get("dropped", 0) for s in sinks.values()),
            "source_rate": round(emitted / uptime, 1) if uptime > 0 else 0.0,
            "latency_p50_ms": quantile(recent, 0.5),
            "latency_p99_ms": quantile(recent, 0.99),
            "latency_samples": len(recent),
        },
        "peers": _without_samples(stats),
    }


def _problems(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per operator with errors (or a dead-letter sink in trouble), over every peer
    running it: how many records it dropped, and its recent distinct errors (type,
    message, a record that raised it, the peer, how often), the most frequent first;
    with ``on_error: dead_letter`` also the letters written and each peer's sink."""
    out: dict[str, dict[str, Any]] = {}
    for peer, peer_stats in stats.items():
        if not isinstance(peer_stats, dict):
            continue
        for op, st in (peer_stats.get("operators") or {}).items():
            if not isinstance(st, dict):
                continue
            errors = int(st.get("errors", 0))
            letters = st.get("dead_letter_sink")
            letters = letters if isinstance(letters, dict) else None
            if not errors and not (letters and letters.get("problem")):
                continue
            view = out.setdefault(op, {"errors": 0, "recent": []})
            view["errors"] += errors
            view["recent"].extend(e for e in st.get("recent_errors", ()) if isinstance(e, dict))
            if letters is not None:
                view["dead_letters"] = view.get("dead_letters", 0) + int(st.get("dead_letters", 0))
                view.setdefault("dead_letter_sinks", {})[peer] = letters
    for view in out.values():
        view["recent"].sort(key=lambda e: -int(e.get("count", 1)))
        del view["recent"][RECENT_ERRORS:]
    return out


def _scaling_view(stats: dict[str, Any]) -> dict[str, Any]:
    """Per operator (group): its instances in all (summed over its peers) and each
    hosting peer's controller view (agiledart.runtime.elastic)."""
    out: dict[str, Any] = {}
    for peer, peer_stats in sorted(stats.items()):
        scaling = peer_stats.get("scaling") if isinstance(peer_stats, dict) else None
        if not isinstance(scaling, dict):
            continue
        for op, view in scaling.items():
            if not isinstance(view, dict):
                continue
            entry = out.setdefault(op, {"instances": 0, "peers": {}})
            entry["instances"] += int(view.get("instances", 1))
            entry["peers"][peer] = view
    return out


def _without_samples(stats: dict[str, Any]) -> dict[str, Any]:
    """A copy of the peers' statistics without the raw latency samples (merged above)."""
    out: dict[str, Any] = {}
    for peer, peer_stats in stats.items():
        if isinstance(peer_stats, dict) and isinstance(peer_stats.get("sinks"), dict):
            sinks = {
                k: {f: v for f, v in s.items() if f != "latency_recent_ms"}
                if isinstance(s, dict)
                else s
                for k, s in peer_stats["sinks"].items()
            }
            peer_stats = {**peer_stats, "sinks": sinks}
        out[peer] = peer_stats
    return out


def path_peer_infos(
    paths: Mapping[tuple[str, str], Sequence[Hop]],
    rings: Mapping[str, dict[str, Any] | None],
    addresses: dict[str, Address],
) -> dict[str, PeerInfo]:
    """Placement's view of the path peers and their leaf sets from the path peers'
    ``ring`` replies (``None``: it did not answer; it keeps its hop's capacity and has
    no leaf set). A leaf-set peer gets the spare capacity its path peer last heard
    (so it is a candidate for overflow, as the paper's rule has it), and ``addresses``
    every address the replies name; an entry without a usable address is no candidate."""
    recorded: dict[str, float] = {}
    for hops in paths.values():
        for hop in hops:  # as placement reads hops: a peer on two paths, the larger
            recorded[hop.peer] = max(recorded.get(hop.peer, 0.0), hop.capacity)
    infos = {name: PeerInfo(capacity=capacity) for name, capacity in recorded.items()}
    heard: dict[str, float] = {}
    for name, reply in sorted(rings.items()):
        if reply is None or name not in infos:
            continue
        for p in reply.get("peers", ()):
            try:
                host, _, port = str(p["address"]).rpartition(":")
                address = (host, int(port))
                capacity = float(p.get("capacity", 1.0))
            except (KeyError, TypeError, ValueError):
                continue
            if not p.get("name") or not host or capacity != capacity or p.get("suspect"):
                continue  # unnamed, no host, a NaN, or missing heartbeats: not a candidate
            addresses.setdefault(str(p["name"]), address)
            heard.setdefault(str(p["name"]), min(max(capacity, 0.0), 1.0))
        members = reply.get("leaf_set", ())
        leaf_set = tuple(str(n) for n in members) if isinstance(members, list) else ()
        infos[name] = PeerInfo(leaf_set=leaf_set, capacity=infos[name].capacity)
    for name, capacity in heard.items():
        if name not in infos:
            infos[name] = PeerInfo(capacity=capacity)
    return infos


def _place_somewhere(
    spec: AppSpec, paths: dict[tuple[str, str], list[Hop]], infos: dict[str, PeerInfo]
) -> Placement:
    """Place with the default slot limit; a ring too small for it (one peer, a few
    gateways) doubles the limit until the app fits: peers share operators then, which
    their worker pools schedule, rather than the app being refused."""
    limit = DEFAULT_SLOT_LIMIT
    while True:
        try:
            return place(spec, paths, infos, slot_limit=limit)
        except PlacementError as exc:
            if not isinstance(exc, NoCapacity) or limit >= len(spec.operators):
                raise
            limit *= 2


#: how far down an error's causes :func:`_code_problems` looks
_CHAIN_LIMIT = 8


def _code_problems(spec: AppSpec, error: BaseException) -> list[Problem]:
    """The operator fields whose code a deployment error was caused by (a
    :class:`CodeError` with its ``code_id``, from a host or from here), so a bundle found
    corrupt or missing by a host, after this scheduler validated its own good copy, is
    reported against the field as validation would have."""
    cause: BaseException | None = error
    for _ in range(_CHAIN_LIMIT):
        if cause is None or (isinstance(cause, CodeError) and cause.code_id):
            break
        cause = cause.__cause__ or cause.__context__
    if not isinstance(cause, CodeError):
        return []
    code_id = cause.code_id
    return [
        Problem(f"operators[{i}].fn", str(error))
        for i, o in enumerate(spec.operators)
        if o.fn and not o.fn.startswith("builtin:") and o.fn.partition(":")[0] == code_id
    ]
