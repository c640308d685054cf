"""Submission (docs/architecture.md): validate, record, JOIN-route, place, deploy.

In order; nothing is deployed before every check passed:

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
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agiledart.app.errors import Problem, SpecError
from agiledart.app.functions import bind
from agiledart.app.graph import chains
from agiledart.app.parse import Overrides, parse_spec
from agiledart.app.spec import AppSpec
from agiledart.errors import AgiledartError
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
from agiledart.placement.survey import survey
from agiledart.runtime.appstate import AppRecord, AppState, apps_index, utc_day
from agiledart.runtime.code import code_ids_in
from agiledart.runtime.epochs import checkpointing
from agiledart.runtime.errors import CodeError, DeployError
from agiledart.runtime.links import Address
from agiledart.runtime.records import record_key
from agiledart.runtime.recovery import fit_code

if TYPE_CHECKING:
    from agiledart.runtime.scheduler import Scheduler

__all__ = ["Submission", "code_problems", "path_peer_infos", "place_somewhere"]


class Submission:
    """The scheduler's submit: from a spec to a running app (or a clear error)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler

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
        found = await asyncio.gather(*(self.s.directory.resolve(p) for p in pinned))
        where = {p: f for p, f in zip(pinned, found, strict=True) if f is not None}
        if len(where) < len(pinned):
            known = set(self.s.directory.names()) | set(where)
            spec = parse_spec(source, overrides=overrides, known_peers=known)
        await self._check_code(spec)
        return spec, where

    async def _check_code(self, spec: AppSpec) -> None:
        problems: list[Problem] = []
        ids = code_ids_in(o.fn for o in spec.operators)
        for code_id in sorted(ids):
            try:
                await self.s.code.fetch([code_id])
            except CodeError as exc:
                for i, o in enumerate(spec.operators):
                    if o.fn and o.fn.startswith(code_id):
                        problems.append(Problem(f"operators[{i}].fn", str(exc)))
        if problems:
            raise SpecError(problems)
        resolve = self.s.code.resolver()
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
            await self.s.hosts.undeploy(rec)
        finally:
            await self.s.save(rec)

    def warnings(self, rec: AppRecord) -> list[str]:
        """What the submitter should know about ``rec`` now that it runs: checkpoints
        wider than the ring are lowered to fit it (``checkpoints.fit_code``)."""
        code = checkpointing(self.s.spec_of(rec))
        holders = len(self.s.directory.names()) - 1  # a peer's fragments go to the others
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
            state=AppState.DEPLOYING,
            scheduler=self.s.address(),
            scheduler_name=self.s.name,
            submitted_at=time.time(),
            sources={s.id: s.peer for s in spec.sources},
            sinks={k.id: k.peer for k in spec.sinks},
        )
        self.s.hold(rec)
        try:
            await self.s.save(rec)
            await self.s.records.add(apps_index(utc_day(rec.submitted_at)), app_id)
            await self.s.records.add(record_key("scheduling", self.s.name), app_id)
            await self._deploy(rec, spec, where)
        except (Exception, asyncio.CancelledError) as exc:
            # whatever stopped it (a store that failed, a host that refused, the CLI
            # that went away), an app is never left "deploying" for ever
            known = isinstance(exc, AgiledartError)
            if rec.live:  # (a stop may have ended it meanwhile)
                rec.move_to(AppState.FAILED)
            rec.error = str(exc) if known else f"submit did not complete: {exc!r}"
            await asyncio.shield(self._give_up(rec))
            if not known:
                raise
            problems = code_problems(spec, exc)
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
            placement = place_somewhere(spec, paths, infos)
        else:  # agiledart.placement, over a survey of the ring
            topology, addresses = await survey(
                names=self.s.directory.names(),
                pinned=sorted(where),
                resolve=self.s.directory.resolve,
                request=self.s.links.request,
                link_model=self.s.link_model,
            )
            placement = place_with(spec.placement, spec, topology)
        for name, (_, addr) in where.items():
            addresses[name] = addr
        rec.placement = {op: list(ps) for op, ps in placement.operators.items()}
        rec.paths = [list(p) for p in placement.paths.values()]
        rec.strategy = placement.strategy
        if self.s.trace is not None:
            self.s.trace.emit(
                "placement",
                app=rec.app_id,
                name=spec.name,
                strategy=placement.strategy,
                placement=rec.placement,
                paths=rec.paths,
            )
        await self.s.install(
            rec, spec, placement_hosts(placement), addresses, placement.deploy_order
        )

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
            res = await self.s.hosts.call(where[src_peer][1], "join", body, timeout=20.0)
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
                reply = await self.s.links.request(addresses[name], "ring", {}, timeout=5.0)
            except (AgiledartError, KeyError):
                return None
            return reply if isinstance(reply, dict) else None

        rings = dict(zip(names, await asyncio.gather(*(ring(n) for n in names)), strict=True))
        return path_peer_infos(paths, rings, addresses), addresses


def placement_hosts(placement: Placement) -> dict[str, tuple[str, ...]]:
    hosts: dict[str, tuple[str, ...]] = {s: (p,) for s, p in placement.sources.items()}
    hosts |= {k: (p,) for k, p in placement.sinks.items()}
    hosts |= dict(placement.operators)
    return hosts


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


def place_somewhere(
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


#: how far down an error's causes :func:`code_problems` looks
_CHAIN_LIMIT = 8


def code_problems(spec: AppSpec, error: BaseException) -> list[Problem]:
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
