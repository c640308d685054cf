"""The scheduler role (DESIGN §3 steps 3-4): validate, record, JOIN-route, place, deploy.

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
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agiledart.app.errors import Problem, SpecError
from agiledart.app.functions import bind
from agiledart.app.graph import chains
from agiledart.app.parse import Overrides, parse_spec
from agiledart.app.spec import AppSpec
from agiledart.errors import AgiledartError
from agiledart.overlay.errors import OverlayError
from agiledart.placement import (
    DEFAULT_SLOT_LIMIT,
    Hop,
    PeerInfo,
    Placement,
    PlacementError,
    place,
)
from agiledart.runtime.code import CodeStore, code_ids_in
from agiledart.runtime.errors import CodeError, DeployError, UnknownApp
from agiledart.runtime.instance import Deployment
from agiledart.runtime.links import Address, Links
from agiledart.runtime.metrics import quantile
from agiledart.runtime.records import Records, record_key

log = logging.getLogger(__name__)

__all__ = ["AppRecord", "PeerDirectory", "Scheduler", "SchedulerRole"]

APPS_INDEX = record_key("index", "apps")
LIVE_STATES = ("deploying", "running")


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
    ) -> None:
        self.name = name
        self.address = address
        self.records = records
        self.links = links
        self.code = code
        self.directory = directory
        self._local_stats = stats_of
        self.apps: dict[str, AppRecord] = {}  #: apps this peer schedules
        self._sinks_done: dict[str, dict[str, dict[str, Any]]] = {}
        self._lock = asyncio.Lock()

    # -- submit -----------------------------------------------------------------------

    async def validate(
        self, source: Any, overrides: Overrides = ()
    ) -> tuple[AppSpec, dict[str, tuple[int, Address]]]:
        """The validated spec and where its pinned peers are; SpecError otherwise."""
        spec = parse_spec(source, overrides=overrides)
        pinned = sorted({s.peer for s in spec.sources} | {k.peer for k in spec.sinks})
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
        await self._save(rec)
        await self.records.add(APPS_INDEX, app_id)
        try:
            await self._deploy(rec, spec, where)
        except AgiledartError as exc:
            rec.state, rec.error = "failed", str(exc)
            await self._undeploy(rec)
            await self._save(rec)
            msg = f"app {app_id} could not be deployed: {exc}"
            raise DeployError(msg) from exc
        return rec

    async def _deploy(
        self, rec: AppRecord, spec: AppSpec, where: dict[str, tuple[int, Address]]
    ) -> None:
        seen: dict[str, Address] = {}
        paths = await self._join_paths(rec.app_id, spec, where, seen)
        infos, addresses = await self._path_peers(paths, seen)
        for name, (_, addr) in where.items():
            addresses[name] = addr
        placement = _place_somewhere(spec, paths, infos)
        rec.placement = {op: list(ps) for op, ps in placement.operators.items()}
        rec.paths = [list(p) for p in placement.paths.values()]
        hosts = _hosts(placement)
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
        )
        wire = deployment.to_wire()
        order = list(placement.deploy_order)
        order += sorted(set(rec.addresses) - set(order))
        for peer in order:  # along the reversed paths: consumers are ready first
            await self._call(addresses[peer], "deploy", wire, timeout=30.0)
        await asyncio.gather(
            *(self._call(addresses[p], "start", {"app_id": rec.app_id}) for p in order)
        )
        rec.state = "running"
        await self._save(rec)

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
        """Leaf sets of the path peers (for overflow) and every address they know."""
        addresses = dict(seen)
        names = sorted({h.peer for hops in paths.values() for h in hops})

        async def info(name: str) -> tuple[str, PeerInfo]:
            try:
                ring = await self.links.request(addresses[name], "ring", {}, timeout=5.0)
            except (OverlayError, KeyError):
                return name, PeerInfo(capacity=1.0)
            for p in ring.get("peers", ()):
                host, _, port = str(p["address"]).rpartition(":")
                addresses.setdefault(p["name"], (host, int(port)))
            return name, PeerInfo(leaf_set=tuple(ring.get("leaf_set", ())), capacity=1.0)

        return dict(await asyncio.gather(*(info(n) for n in names))), addresses

    async def _call(
        self, address: Address, type: str, body: dict[str, Any], *, timeout: float = 10.0
    ) -> Any:
        try:
            return await self.links.request(address, type, body, timeout=timeout)
        except OverlayError as exc:
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
        except OverlayError as exc:
            log.warning("%s to %s failed: %s", type, address, exc)
            return None

    async def _save(self, rec: AppRecord) -> None:
        try:
            await self.records.put(record_key("app", rec.app_id), rec.to_wire())
        except AgiledartError as exc:
            log.warning("could not store the record of %s: %s", rec.app_id, exc)

    # -- following --------------------------------------------------------------------

    async def sink_done(self, app_id: str, sink: str, info: dict[str, Any]) -> None:
        rec = self.apps.get(app_id)
        if rec is None or rec.state not in LIVE_STATES:
            return
        done = self._sinks_done.setdefault(app_id, {})
        done[sink] = info
        if set(done) >= set(rec.sinks):
            rec.final = await self.gather(rec)
            rec.state = "finished"
            rec.finished_at = time.time()
            await self._save(rec)
            await self._undeploy(rec)
            log.info("app %s finished", app_id)

    async def failed(self, app_id: str, peer: str, error: str) -> None:
        rec = self.apps.get(app_id)
        if rec is None or rec.state not in LIVE_STATES:
            return
        rec.final = await self.gather(rec)
        rec.state, rec.error = "failed", f"on {peer}: {error}"
        await self._save(rec)
        await self._undeploy(rec)

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
            except OverlayError:
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
            except OverlayError as exc:
                log.warning("scheduler of %s unreachable (%s); stopping it from here", app_id, exc)
        if rec.state in LIVE_STATES:
            rec.final = await self.gather(rec)
            rec.state = "stopped"
            rec.finished_at = time.time()
        await self._undeploy(rec)
        await self._save(rec)
        return rec

    async def list_apps(self) -> list[dict[str, Any]]:
        ids = await self.records.get(APPS_INDEX)
        ids = ids if isinstance(ids, list) else []
        limit = asyncio.Semaphore(32)  # thousands of apps: a few dozen lookups at a time

        async def get(app_id: Any) -> Any:
            if str(app_id) in self.apps:
                return None  # ours: the record is in memory
            async with limit:
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
        "sources": rec.sources,
        "sinks": rec.sinks,
        "paths": [list(p) for p in paths],
        "totals": {
            "source_records": emitted,
            "sink_records": sum(s.get("records", 0) for s in sinks.values()),
            "delayed": sum(s.get("delayed", 0) for s in sources.values()),
            "shed": sum(s.get("shed", 0) for s in sources.values()),
            "late": sum(o.get("late", 0) for o in operators.values()),
            "errors": sum(o.get("errors", 0) for o in [*operators.values(), *sinks.values()]),
            "dropped": sum(s.get("dropped", 0) for s in sinks.values()),
            "source_rate": round(emitted / uptime, 1) if uptime > 0 else 0.0,
            "latency_p50_ms": quantile(recent, 0.5),
            "latency_p99_ms": quantile(recent, 0.99),
            "latency_samples": len(recent),
        },
        "peers": _without_samples(stats),
    }


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
            if "no capacity" not in str(exc) or limit >= len(spec.operators):
                raise
            limit *= 2
