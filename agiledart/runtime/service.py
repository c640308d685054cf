"""A peer's application runtime: the frame handlers behind apps, code and records.

:class:`AppRuntime` is owned by a :class:`~agiledart.peer.Peer`. It installs, on the
peer's frame server:

* client-facing requests: ``register``, ``submit``, ``apps``, ``status``, ``stop``;
* checkpoint fragments it holds for others: ``frag_put|frag_get|frag_drop|frag_held``;
* peer-facing requests: ``kv_put|kv_add|kv_get`` (records store), ``join`` (route a
  JOIN for the scheduler), ``deploy``, ``start``, ``undeploy``, ``app_stats``,
  ``app_sink_done``, ``app_failed``, ``app_rebind`` (an adopted app's new scheduler,
  refused while the app's scheduler answers that it still schedules it),
  ``app_scheduled`` (whether this peer schedules an app);
* data streams: ``data`` and ``wm`` in, ``credit`` back (on the outgoing links, or,
  for data relayed over an emulated network, on a connection of its own);
* with a link model (``--links``): ``relay`` in, ``relay_ack`` back, ``relay_done``
  from a packet's destination to its origin
  (:mod:`agiledart.runtime.relay`).

It publishes ``peer:<name>`` (node id, address) in the records store once the peer has
joined the ring, and again every ``publish_interval_s`` (owners change as peers come
and go), so schedulers anywhere can resolve the peers an app names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agiledart.app.errors import ExecutionError
from agiledart.app.parse import parse_spec
from agiledart.dataplane import ProtocolError
from agiledart.dataplane.frames import BarrierFrame, CreditFrame, DataFrame, WatermarkFrame
from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError, OverlayError
from agiledart.overlay.leafset import Membership, MembershipEvent
from agiledart.overlay.node import Delivery, OverlayNode
from agiledart.overlay.routing import Contact
from agiledart.overlay.tcp import ConnectionInfo, FrameServer
from agiledart.runtime.checkpoints import SWEEP_S, FragmentStore, Holder, Uplink
from agiledart.runtime.code import Bundle, CodeStore, code_ids_in, identifier
from agiledart.runtime.confine import DataPolicy
from agiledart.runtime.deployment import Deployment, InstanceOptions
from agiledart.runtime.edges import Origin, ReplyChannel
from agiledart.runtime.epochs import CHECKPOINT_RATE
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import make_engine
from agiledart.runtime.instance import AppInstance
from agiledart.runtime.links import Address, Links
from agiledart.runtime.metrics import Buckets
from agiledart.runtime.mqtt import BrokerPool
from agiledart.runtime.records import Records, record_key
from agiledart.runtime.scheduler import APPS_DAYS, APPS_LIMIT, Scheduler
from agiledart.traces import NullTraceWriter
from agiledart.traces.writer import TraceWriter

if TYPE_CHECKING:
    from agiledart.runtime.linkmodel import LinkModel
    from agiledart.runtime.relay import Relay

log = logging.getLogger(__name__)

__all__ = ["AppRuntime", "left_to"]

TAKE_BACK_TRIES = 3  #: reads of the apps a restarted peer scheduled
TAKE_BACK_WAIT_S = 1.5  #: seconds before each
REPORT_FOR_S = 180.0  #: seconds a sink's end or a failure is reported for until taken
DEATHS_REVISITED_S = 60.0  #: how long a death's adopter is recomputed on later deaths

_NODE_ID_RE = re.compile(r"[0-9a-fA-F]{40}")


class AppRuntime:
    def __init__(
        self,
        *,
        name: str,
        overlay: OverlayNode,
        frames: FrameServer,
        links: Links,
        state_dir: Path,
        options: InstanceOptions | None = None,
        publish_interval_s: float = 30.0,
        execution: EngineConfig | None = None,
        link_model: LinkModel | None = None,
        trace: TraceWriter | NullTraceWriter | None = None,
        checkpoint_rate: float = CHECKPOINT_RATE,
        data: DataPolicy | None = None,
    ) -> None:
        self.name = name
        #: what app specs may reach here: the data root, allowed folders and variables
        self.data = data or DataPolicy.of(state_dir)
        self.trace = trace or NullTraceWriter()
        self.overlay = overlay
        self.links = links
        self.state_dir = state_dir
        self.options = options or InstanceOptions()
        self.publish_interval_s = publish_interval_s
        self.records = Records(overlay, links, state_dir=state_dir)
        self.code = CodeStore(self.records, state_dir / "code")
        #: how this peer runs operator instances (worker pool and scheduler)
        self.engine = make_engine(execution or EngineConfig(workers=0), state_dir / "code")
        self.instances: dict[str, AppInstance] = {}
        #: the peer's MQTT connections, one per broker, shared by all its apps
        self.brokers = BrokerPool(client_id=f"agiledart-{name}", trace=self.trace)
        self.scheduler = Scheduler(
            name=name,
            address=lambda: self.overlay.address,
            records=self.records,
            links=links,
            code=self.code,
            directory=self,
            stats_of=self._stats_of,
            trace=self.trace,
            link_model=link_model,
            checkpoint_rate=checkpoint_rate,
        )
        self.dropped: dict[str, int] = {
            "data_unknown_app": 0,
            "credit_unknown_edge": 0,
            "data_stale": 0,  #: frames of an app from before its last recovery
            "malformed_frames": 0,  #: data-plane frames that broke the protocol
            "background_errors": 0,  #: background jobs that raised (logged with traceback)
        }
        self._group: asyncio.TaskGroup | None = None
        self._publisher: asyncio.Task[None] | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._offerer: asyncio.Task[None] | None = None
        self._tracer: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._reports: set[asyncio.Task[None]] = set()
        #: who schedules submits here (zone schedulers, a central master); None: this peer
        self.submitter: Callable[[Any, list[str]], Awaitable[dict[str, Any]]] | None = None
        #: called once this peer resumed apps it scheduled before it restarted
        self.on_resumed: Callable[[], Awaitable[None]] | None = None
        #: who adopts a dead scheduler's apps when this peer is its closest neighbour
        self.adopter: Callable[[str], Coroutine[Any, Any, None]] | None = None
        #: dead peers whose apps this peer took care of, and when (see _left_to_me)
        self._took_over: dict[str, float] = {}
        #: apps whose scheduler changed since deployment (adopted): where reports go now
        self.rebound: dict[str, Address] = {}
        for type, handler in self.records.handlers().items():
            frames.route(type, handler)
        #: checkpoint fragments this peer holds for others (agiledart.runtime.checkpoints)
        cap = None if link_model is None else link_model.bandwidth_mbit
        self.uplink = None if cap is None else Uplink(cap * 1e6 / 8)  #: emulated upload rate
        self.fragments = FragmentStore(state_dir / "fragments", uplink=self.uplink)
        #: snapshots stored from this peer: sizes (bytes) and times to store (s)
        self.checkpoint_bytes = Buckets((1e3, 1e4, 1e5, 1e6, 1e7, 1e8))
        self.checkpoint_seconds = Buckets((0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0))
        #: instances of apps restored on this peer from a committed checkpoint
        self.restored = 0
        #: snapshots of instances here that could not be stored (their epoch abandoned)
        self.checkpoint_failures = 0
        for type, handler in self.fragments.handlers().items():
            frames.route(type, handler)
        routes: dict[str, Callable[[dict[str, Any], ConnectionInfo], Any]] = {
            "register": self._register,
            "submit": self._submit,
            "apps": self._apps,
            "status": self._status,
            "stop": self._stop,
            "join": self._join,
            "deploy": self._deploy,
            "start": self._start,
            "undeploy": self._undeploy,
            "app_stats": self._app_stats,
            "app_sink_done": self._app_sink_done,
            "app_scheduled": self._app_scheduled,
            "app_failed": self._app_failed,
            "app_barrier": self._app_barrier,
            "app_committed": self._app_committed,
            "app_peer_dead": self._app_peer_dead,
            "app_checkpoint": self._app_checkpoint,
            "app_rebind": self._app_rebind,
            "app_scale": self._app_scale,
        }
        for type, handler in routes.items():
            frames.route(type, handler)
        frames.on_stream("data", self._on_data)
        frames.on_stream("wm", self._on_wm)
        frames.on_stream("bar", self._on_barrier)
        links.on_stream("credit", self._on_credit)
        frames.on_stream("credit", self._on_credit)  # from relayed data's destinations
        #: carries data over the emulated network, when there is one
        self.relay: Relay | None = None
        if link_model is not None:
            from agiledart.runtime.relay import Relay  # numpy, the bandit: only if used

            self.relay = Relay(
                name=name,
                model=link_model,
                links=links,
                address=lambda: self.overlay.address,
                resolve=self._address_of,
                deliver=self._relayed,
                trace=self.trace,
            )
            frames.on_stream("relay", self.relay.on_relay)
            links.on_stream("relay_ack", self.relay.on_ack)
            frames.on_stream("relay_done", self.relay.on_done)
        overlay.on_deliver("join", _join_delivered)
        overlay.subscribe(self._membership)

    def start(self, group: asyncio.TaskGroup, joined: asyncio.Event) -> None:
        self._group = group
        # mqtt sources' logs of instances that died with this peer's last process: no
        # instance reads them again (a restarted app's sources start new logs)
        shutil.rmtree(self.data.root / "mqtt", ignore_errors=True)
        self.records.load()  # the peer holds its state directory by now
        self._publisher = group.create_task(self._publish_loop(joined))
        self._upkeep = group.create_task(self.records.upkeep_loop(joined))
        self._offerer = group.create_task(self._offer_cached_code(joined))
        if self.trace.enabled:
            self._tracer = group.create_task(self._opstats_loop())
        self.brokers.start(group)
        self.engine.start(group)
        self._sweeper = group.create_task(self.fragments.sweep_loop(self._ended, SWEEP_S))

    async def _ended(self, app_id: str) -> bool:
        """Whether the record of ``app_id`` says it ended (its fragments may go)."""
        raw = await self.records.get(record_key("app", app_id))
        return isinstance(raw, dict) and raw.get("state") in ("finished", "failed", "stopped")

    async def aclose(self) -> None:
        """Stop publishing and tear down every app instance on this peer."""
        self._group = None
        for loop in (self._publisher, self._upkeep, self._offerer):
            if loop is not None:
                loop.cancel()
        if self._tracer is not None:
            self._tracer.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._reports):
            task.cancel()
        for inst in list(self.instances.values()):
            await inst.stop()
        self.instances.clear()
        if self.relay is not None:
            await self.relay.aclose()
        await self.engine.aclose()
        await self.brokers.aclose()

    def query_groups(self) -> dict[str, int]:
        """Instances here per registered bundle (Pluto's query groups): every query of a
        group runs on this peer's loop with the bundle's one code object."""
        groups: dict[str, int] = {}
        for inst in self.instances.values():
            for code_id in sorted(code_ids_in(o.fn for o in inst.spec.operators)):
                groups[code_id] = groups.get(code_id, 0) + 1
        return groups

    # -- peer directory ---------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted({self.name, *(c.name for c in self.overlay.known_peers() if c.name)})

    async def resolve(self, name: str) -> tuple[int, Address] | None:
        if name == self.name:
            return self.overlay.node_id, self.overlay.address
        for c in self.overlay.known_peers():
            if c.name == name:
                return c.node_id, (c.host, c.port)
        try:
            rec = await self.records.get(record_key("peer", name))
        except AgiledartError:
            return None
        try:
            return int(rec["node_id"], 16), (str(rec["address"][0]), int(rec["address"][1]))
        except (TypeError, KeyError, ValueError, IndexError):
            return None

    async def _publish_loop(self, joined: asyncio.Event) -> None:
        await joined.wait()
        self._background(self._after_restart())
        while True:
            value = {
                "node_id": f"{self.overlay.node_id:040x}",
                "address": list(self.overlay.address),
            }
            try:
                kept = await self.records.put(record_key("peer", self.name), value)
            except AgiledartError as exc:
                log.debug("could not publish peer record: %s", exc)
                kept = False
            # refused (a newer version, say from before a clock step: ours is past it
            # now) or failed: again soon
            await asyncio.sleep(self.publish_interval_s if kept else 2.0)

    async def _offer_cached_code(self, joined: asyncio.Event) -> None:
        """Offer the bundles cached here back to the records store once joined, for
        those that a restart of every holder took out of it."""
        await joined.wait()
        await asyncio.sleep(2.0)  # the ring's first leaf-set exchanges
        try:
            offered = await self.code.offer_cached()
        except AgiledartError as exc:
            log.warning("could not offer the cached bundles to the records store: %s", exc)
            return
        if offered:
            log.info("offered %d cached bundles back to the records store", offered)

    async def _take_apps_back(self) -> None:
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
                ids = await self.records.get(record_key("scheduling", self.name))
            except AgiledartError as exc:
                log.debug("could not read the apps this peer scheduled: %s", exc)
                continue
            if ids:
                break
        else:
            return
        if await self.scheduler.resume_own() and self.on_resumed is not None:
            await self.on_resumed()

    async def _opstats_loop(self, interval_s: float = 1.0) -> None:
        """Trace every operator hosted here once a second (``opstats`` records)."""
        while True:
            await asyncio.sleep(interval_s)
            for app_id, inst in list(self.instances.items()):
                for op, st in inst.statistics()["operators"].items():
                    self.trace.emit(
                        "opstats",
                        app=app_id,
                        operator=op,
                        records_in=int(st.get("records_in", 0)),
                        records_out=int(st.get("records_out", 0)),
                        rate_in=float(st.get("rate") or 0.0),
                        queue=int(st.get("queued", 0)),
                        utilization=st.get("utilization"),
                        service_us=st.get("service_us"),
                    )

    # -- client-facing ----------------------------------------------------------------

    async def _register(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        """A module (``source``: bytes) or a package (``kind: package``, ``name``,
        ``files``: {relative path: bytes}); its code id and whether it was new."""
        if req.get("kind") == "package":
            files, name = req.get("files"), req.get("name")
            if (
                not isinstance(name, str)
                or not isinstance(files, dict)
                or not all(isinstance(k, str) and isinstance(v, bytes) for k, v in files.items())
            ):
                msg = "register of a package needs 'name' and 'files': {path: bytes}"
                raise MalformedError(msg)
            bundle = Bundle.package(name, files)
        else:
            source = req.get("source")
            if not isinstance(source, bytes):
                msg = "register needs 'source': the module's bytes"
                raise MalformedError(msg)
            stem = Path(str(req.get("name") or "bundle.py")).stem
            bundle = Bundle.module(source, identifier(stem))
        code_id, stored = await self.code.register_bundle(bundle)
        return {"code_id": code_id, "stored": stored, "size": len(bundle.content)}

    async def _submit(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        spec = req.get("spec")
        overrides = req.get("set") or []
        if not isinstance(spec, str | dict) or not isinstance(overrides, list):
            msg = "submit needs 'spec' (YAML text or a map) and 'set' (a list of KEY=VALUE)"
            raise MalformedError(msg)
        if self.submitter is not None:
            return await self.submitter(spec, [str(o) for o in overrides])
        rec = await self.scheduler.submit(spec, [str(o) for o in overrides])
        return {
            "app_id": rec.app_id,
            "state": rec.state,
            "placement": rec.placement,
            "warnings": self.scheduler.warnings(rec),
        }

    async def _apps(self, req: dict[str, Any], conn: ConnectionInfo) -> list[dict[str, Any]]:
        days, limit = req.get("days", APPS_DAYS), req.get("limit", APPS_LIMIT)
        if type(days) is not int or type(limit) is not int or not 1 <= days <= 366 or limit < 1:
            msg = "apps takes 'days' (1 to 366) and 'limit' (at least 1), integers"
            raise MalformedError(msg)
        return await self.scheduler.list_apps(days=days, limit=limit)

    async def _status(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        return await self.scheduler.status(_app_id(req))

    async def _stop(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        rec = await self.scheduler.stop(_app_id(req))
        return rec.to_wire()

    # -- peer-facing ------------------------------------------------------------------

    async def _join(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        """Route a JOIN from this (source) peer toward a sink peer's id; the path."""
        to = req.get("to")
        if not isinstance(to, str) or not _NODE_ID_RE.fullmatch(to):
            msg = "join needs 'to': 40 hex digits"
            raise MalformedError(msg)
        payload = {"app": str(req.get("app_id")), "source": str(req.get("source"))}
        result = await self.overlay.route(int(to, 16), "join", payload)
        return {
            "path": [
                {
                    "name": h.name,
                    "node_id": f"{h.node_id:040x}",
                    "host": h.host,
                    "port": h.port,
                    "rtt_ms": h.rtt_ms,
                    "capacity": h.capacity,
                }
                for h in result.path
            ]
        }

    async def _deploy(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        d = Deployment.from_wire(req, parse_spec)
        if d.app_id in self.instances:
            return {"deployed": False}
        await self.code.fetch(code_ids_in(o.fn for o in d.spec.operators))
        if d.app_id in self.instances:  # deployed by a concurrent request meanwhile
            return {"deployed": False}
        if self._group is None:
            msg = "this peer is not running"
            raise ExecutionError(msg)
        try:
            inst = AppInstance(
                d,
                me=self.name,
                links=self.links,
                resolve=self.code.resolver(),
                state_dir=self.state_dir,
                options=self.options,
                on_sink_done=lambda sink, info: self._report_done(d, sink, info),
                on_failed=lambda error, lost: self._report_failed(d, error, lost),
                brokers=self.brokers,
                engine=self.engine,
                relay=self.relay,
                trace=self.trace if self.trace.enabled else None,
                on_checkpoint=lambda report: self._report_checkpoint(d, report),
                holders=self._holders,
                uplink=self.uplink,
                on_scaling=lambda body: self._ask_scaling(d, body),
                data=self.data,
            )
        except AgiledartError:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code (a factory) too
            log.warning("cannot build app %s here", d.app_id, exc_info=True)
            msg = f"app {d.app_id} cannot run on {self.name}: {type(exc).__name__}: {exc}"
            raise ExecutionError(msg) from exc
        inst.launch(self._group)
        self.instances[d.app_id] = inst
        if d.restore is not None:
            self.restored += 1
        self._manifest_changed()
        try:
            await inst.wait_ready()  # "deployed" means ready: workers up, code loaded
        except ExecutionError:
            self.instances.pop(d.app_id, None)
            await inst.stop()
            raise
        return {"deployed": True, "operators": inst.local_ops}

    async def _start(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        self._instance(req).start_sources()
        return {"started": True}

    async def _undeploy(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        inst = self.instances.pop(_app_id(req), None)
        self.rebound.pop(_app_id(req), None)
        if inst is not None:
            self._manifest_changed()
            await inst.stop()
            if self.relay is not None:
                self.relay.forget(inst.app_id)
        return {"undeployed": inst is not None}

    async def _app_stats(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any] | None:
        return await self._stats_of(_app_id(req))

    async def _stats_of(self, app_id: str) -> dict[str, Any] | None:
        inst = self.instances.get(app_id)
        return None if inst is None else inst.statistics()

    async def _app_sink_done(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        """False: this peer does not schedule the app (it restarted and has not taken
        its apps back yet); the sink asks again."""
        info = req.get("info") if isinstance(req.get("info"), dict) else {}
        return await self.scheduler.sink_done(
            _app_id(req), str(req.get("sink")), info or {}, generation=_generation(req)
        )

    async def _app_failed(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        lost = req.get("lost")
        return await self.scheduler.failed(
            _app_id(req),
            conn.peer_name,
            str(req.get("error")),
            lost=lost if isinstance(lost, str) and lost else None,
            generation=_generation(req),
        )

    async def _report_done(self, d: Deployment, sink: str, info: dict[str, Any]) -> None:
        body = {"app_id": d.app_id, "sink": sink, "info": info, "generation": d.generation}
        if self._group is not None:
            self._background(self._report_until_taken(d, "app_sink_done", body))

    async def _report_failed(self, d: Deployment, error: str, lost: str | None) -> None:
        body = {"app_id": d.app_id, "error": error, "lost": lost, "generation": d.generation}
        if self._group is not None:
            self._background(self._report_until_taken(d, "app_failed", body))

    async def _report_until_taken(self, d: Deployment, type: str, body: dict[str, Any]) -> None:
        """Report a sink's end or an instance's failure until a scheduler takes it:
        the app's scheduler may be dead (its adopter rebinds the app here meanwhile)
        or restarted and not yet scheduling its apps again; a report lost here would
        leave the app running forever. Given up after :data:`REPORT_FOR_S`, or once
        the instance is undeployed or redeployed (the report is moot then)."""
        deadline = asyncio.get_running_loop().time() + REPORT_FOR_S
        wait = 0.5
        while True:
            to = self._scheduler_of(d)
            try:
                if await self.links.request(to, type, body, timeout=30.0) is not False:
                    return
                problem = "it does not schedule the app (yet)"
            except AgiledartError as exc:
                problem = str(exc)
            inst = self.instances.get(d.app_id)
            if inst is None or inst.deployment is not d:
                return
            if asyncio.get_running_loop().time() + wait > deadline:
                log.warning("app %s: gave up reporting %s to its scheduler", d.app_id, type)
                return
            log.warning("%s to the scheduler failed (%s); again in %.1f s", type, problem, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)

    def _background(self, job: Coroutine[Any, Any, None]) -> None:
        """Run ``job`` in this peer's task group, supervised: whatever it raises is
        logged and counted, never the peer's end (a dead peer mid-request, a malformed
        record in the store, a bug in one app's handling must not take down the rest)."""
        if self._group is None:
            job.close()
            return
        task = self._group.create_task(self._supervised(job))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _supervised(self, job: Coroutine[Any, Any, None]) -> None:
        try:
            await job
        except Exception:
            self.dropped["background_errors"] += 1
            log.exception("%s failed", getattr(job, "__qualname__", "a background job"))

    def _scheduler_of(self, d: Deployment) -> Address:
        return self.rebound.get(d.app_id, d.scheduler)

    async def _app_rebind(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        """The app's scheduler died and ``scheduler`` adopted it: report there now."""
        app_id, to = _app_id(req), req.get("scheduler")
        if not (isinstance(to, list) and len(to) == 2 and isinstance(to[0], str)):
            msg = "app_rebind needs 'scheduler': [host, port]"
            raise MalformedError(msg)
        inst = self.instances.get(app_id)
        if type(to[1]) is not int or inst is None:
            return False
        new, current = (to[0], to[1]), self._scheduler_of(inst.deployment)
        if new != current and await self.scheduler.still_scheduled(current, app_id):
            # a peer that only believes the scheduler dead (it was cut off, or the
            # scheduler was slow) must not take the app over: two schedulers would
            # follow it, and the one the CLI asks would never hear that it ended
            log.warning("app %s: not rebinding to %s, %s still schedules it", app_id, new, current)
            return False
        self.rebound[app_id] = new
        return True

    async def _app_scheduled(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        return self.scheduler.schedules(_app_id(req))

    async def _tell(self, address: Address, type: str, body: dict[str, Any]) -> None:
        for attempt in range(3):
            try:
                await self.links.request(address, type, body, timeout=30.0)
                return
            except AgiledartError as exc:
                log.warning("%s to the scheduler failed (%s), attempt %d", type, exc, attempt + 1)
                await asyncio.sleep(1.0)

    def _instance(self, req: dict[str, Any]) -> AppInstance:
        app_id = _app_id(req)
        inst = self.instances.get(app_id)
        if inst is None:
            msg = f"app {app_id!r} is not deployed on {self.name}"
            raise UnknownApp(msg)
        return inst

    # -- data -------------------------------------------------------------------------

    def _membership(self, event: MembershipEvent) -> None:
        """A leaf-set peer declared dead: the apps this peer schedules that it hosted
        are recovered (their scheduler notices; an instance sending to it may too)."""
        if event.kind is Membership.JOINED and event.contact.name:
            log.info("%s joined this peer's leaf set", event.contact.name)
        if event.kind is not Membership.DEAD or not event.contact.name or self._group is None:
            return
        dead = event.contact
        jobs = [self.scheduler.peer_dead(dead.name)]
        others = [c for c in self.overlay.leaf_set.members() if c.node_id != dead.node_id]
        for gone in self._left_to_me(dead):
            # the dead peer's closest live neighbour takes care of what it left
            adopt = self.adopter or self.scheduler.adopt_from
            jobs.append(adopt(gone))
            jobs.append(self._report_hosted(gone))
        for job in jobs:
            self._background(self._unless_cut_off(others, dead.name, job))

    def _left_to_me(self, dead: Contact) -> list[str]:
        """The dead peers whose apps and hosted parts this peer takes care of, now that
        ``dead`` died (see :func:`left_to`): ``dead`` whenever this peer is its closest
        live neighbour, an earlier death only if not taken care of here already."""
        now = asyncio.get_running_loop().time()
        self._took_over = {n: t for n, t in self._took_over.items() if now - t < DEATHS_REVISITED_S}
        gone = self.overlay.recently_dead(DEATHS_REVISITED_S)
        mine = []
        for c in left_to(self.overlay.node_id, dead, gone, self.overlay.leaf_set.members()):
            if c.node_id != dead.node_id and c.name in self._took_over:
                continue  # taken care of on its own death or an earlier revisit
            self._took_over[c.name] = now
            mine.append(c.name)
        return mine

    async def _unless_cut_off(
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
            others = [c for c in self.overlay.known_peers() if c.name != dead]
        if not others:
            others = [c for c in self.overlay.recently_dead(60.0) if c.name != dead]
        if others:
            try:
                pings = await asyncio.gather(
                    *(self.overlay.ping((c.host, c.port)) for c in others[:4])
                )
            except BaseException:  # cancelled (the peer is stopping): the job never runs
                job.close()
                raise
            if all(answer is None for answer in pings):
                job.close()
                log.warning("no leaf-set peer answers: cut off? not acting on %s's death", dead)
                return
        await job

    async def _after_restart(self) -> None:
        """What this peer ran before it (re)started is gone with its process: the apps
        it scheduled resume from here, and the schedulers of the apps it hosted are
        told, so that they restart them (from their last checkpoint) with this peer
        keeping its part, instead of waiting for data it will never send or take."""
        await self._take_apps_back()
        try:
            manifest = await self.records.get(record_key("hosting", self.name))
        except AgiledartError as exc:
            log.debug("no hosting manifest of this peer: %s", exc)
            return
        apps = manifest.get("apps") if isinstance(manifest, dict) else None
        for app_id in apps if isinstance(apps, list) else []:
            if str(app_id) in self.instances:
                continue  # deployed here again meanwhile
            try:
                rec = await self.scheduler.record(str(app_id))
            except AgiledartError:
                continue
            if rec.state not in ("deploying", "running") or rec.scheduler_name == self.name:
                continue
            log.info("app %s ran here before this peer restarted: telling its scheduler", app_id)
            body = {
                "app_id": rec.app_id,
                "error": f"{self.name} restarted",
                "lost": self.name,
                "generation": rec.generation,
            }
            try:
                await self.links.request(rec.scheduler, "app_failed", body, timeout=10.0)
            except AgiledartError as exc:
                log.warning("scheduler of %s not told of this restart: %s", rec.app_id, exc)

    async def _report_hosted(self, dead: str) -> None:
        """Tell the scheduler of every app ``dead`` hosted (its hosting manifest, kept
        in the DHT) that it died: a scheduler far away in the ring does not see it."""
        try:
            manifest = await self.records.get(record_key("hosting", dead))
        except AgiledartError as exc:
            log.warning("no hosting manifest of %s: %s", dead, exc)
            return
        apps = manifest.get("apps") if isinstance(manifest, dict) else None
        for app_id in apps if isinstance(apps, list) else []:
            try:
                rec = await self.scheduler.record(str(app_id))
            except AgiledartError:
                continue
            if rec.state not in ("deploying", "running") or rec.scheduler_name == dead:
                continue  # over, or adopted with the dead scheduler's other apps
            body = {"app_id": rec.app_id, "dead": dead}
            if rec.scheduler_name == self.name:
                await self.scheduler.recover(rec.app_id, dead)
                continue
            try:
                await self.links.request(rec.scheduler, "app_peer_dead", body, timeout=10.0)
            except AgiledartError as exc:
                log.warning("scheduler of %s not told of %s's death: %s", rec.app_id, dead, exc)

    async def _app_peer_dead(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        dead = req.get("dead")
        if not isinstance(dead, str) or not dead:
            msg = "app_peer_dead needs 'dead': a peer name"
            raise MalformedError(msg)
        app_id = _app_id(req)
        rec = self.scheduler.apps.get(app_id)
        if rec is not None and dead in rec.hosts() and self._group is not None:
            self._background(self._recover_if_silent(app_id, dead))
        return True

    async def _recover_if_silent(self, app_id: str, dead: str) -> None:
        """A death reported second-hand (by a peer that may itself have been cut off)
        is acted on only when ``dead`` does not answer this scheduler either."""
        rec = self.scheduler.apps.get(app_id)
        if rec is not None and await self.scheduler.answers(rec, dead):
            log.warning("%s was reported dead but answers: %s goes on", dead, app_id)
            return
        await self.scheduler.recover(app_id, dead)

    def _manifest_changed(self) -> None:
        """Publish which apps this peer hosts (``hosting:<name>``, replicated with the
        records store), for whoever takes over from it."""
        if self._group is None:
            return
        apps = sorted(self.instances)
        self._background(self._publish_manifest(apps))

    async def _publish_manifest(self, apps: list[str]) -> None:
        try:
            await self.records.put(record_key("hosting", self.name), {"apps": apps})
        except AgiledartError as exc:
            log.debug("hosting manifest not published: %s", exc)

    async def _address_of(self, name: str) -> Address | None:
        found = await self.resolve(name)
        return None if found is None else found[1]

    async def _relayed(self, kind: str, body: dict[str, Any], origin: str, at: Address) -> None:
        """A packet the relay layer carried here, in its flow's order."""
        line = Origin(origin, at, self.links)
        if kind == "data":
            await self._on_data(body, line)
        elif kind == "bar":
            await self._on_barrier(body, line)
        else:
            await self._on_wm(body, line)

    async def _on_data(self, msg: dict[str, Any], conn: ReplyChannel) -> None:
        with self._frame_errors():
            frame = DataFrame.from_wire(msg)
            inst = self.instances.get(frame.app_id)
            if inst is None:
                self.dropped["data_unknown_app"] += 1
                # the sender would wait for a credit for ever: tell it this peer does not
                # run the app (it restarted since deployment, or the app ended here)
                gone = CreditFrame(frame.app_id, frame.batch.edge, 0, frame.generation, True)
                with contextlib.suppress(OverlayError):
                    await conn.send(gone.TYPE, gone.to_wire())
                return
            if frame.generation != inst.generation:  # sent before a recovery
                self.dropped["data_stale"] += 1
                return
            inst.accept_data(frame.producer, frame.batch, conn)

    async def _on_wm(self, msg: dict[str, Any], conn: ReplyChannel) -> None:
        with self._frame_errors():
            frame = WatermarkFrame.from_wire(msg)
        inst = self.instances.get(frame.app_id)
        if inst is not None and frame.generation == inst.generation:
            await inst.accept_wm(frame.producer, frame.watermark, frame.wall, conn.peer_name)

    async def _on_barrier(self, msg: dict[str, Any], conn: ReplyChannel) -> None:
        with self._frame_errors():
            frame = BarrierFrame.from_wire(msg)
        inst = self.instances.get(frame.app_id)
        if inst is not None and frame.generation == inst.generation:
            await inst.accept_barrier(frame.producer, frame.epoch, conn.peer_name)

    @contextlib.contextmanager
    def _frame_errors(self) -> Iterator[None]:
        """A frame that broke the data plane's protocol is counted and dropped, and
        closes the connection it came on (the frame server's answer to a malformed
        frame); the peer and its apps live on."""
        try:
            yield
        except ProtocolError as exc:
            self.dropped["malformed_frames"] += 1
            raise MalformedError(str(exc)) from None

    # -- checkpoints --------------------------------------------------------------------

    def _holders(self, n: int) -> list[Holder]:
        """Where this peer's checkpoint fragments go: its n closest leaf-set peers."""
        return [
            Holder(c.name or f"{c.node_id:040x}", (c.host, c.port))
            for c in self.overlay.leaf_set.members()[:n]
        ]

    async def _app_barrier(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        """The scheduler cuts epoch ``epoch``: barriers into this peer's sources (in the
        background: a source blocked by back-pressure takes its barrier when it moves)."""
        inst = self._instance(req)
        epoch = req.get("epoch")
        if type(epoch) is not int or _generation(req) != inst.generation:
            return {"injected": False}
        # a child of the instance: a downstream peer lost while the barrier goes out
        # fails (and so recovers) the app, never this peer
        return {"injected": inst.spawn(inst.inject_barrier(epoch)) is not None}

    async def _app_committed(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        """The scheduler committed epoch ``epoch``: this peer's sinks of the app that
        wait for it (sql, http) send its output."""
        inst = self._instance(req)
        epoch = req.get("epoch")
        if type(epoch) is not int or _generation(req) != inst.generation:
            return False
        inst.checkpoint_committed(epoch)
        return True

    async def _app_checkpoint(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        report = req.get("report")
        if not isinstance(report, dict) or type(report.get("epoch")) is not int:
            msg = "app_checkpoint needs a 'report' with an integer 'epoch'"
            raise MalformedError(msg)
        await self.scheduler.checkpoint_report(_app_id(req), report, generation=_generation(req))
        return True

    async def _report_checkpoint(self, d: Deployment, report: dict[str, Any]) -> None:
        if report.get("kind") == "state":  # a snapshot stored from here
            self.checkpoint_bytes.observe(float(report.get("bytes", 0)))
            self.checkpoint_seconds.observe(float(report.get("seconds", 0.0)))
        elif report.get("kind") == "state_failed":
            self.checkpoint_failures += 1
        body = {"app_id": d.app_id, "report": report, "generation": d.generation}
        await self._tell(self._scheduler_of(d), "app_checkpoint", body)

    # -- elastic scaling (agiledart.runtime.elastic) ------------------------------------

    async def _ask_scaling(self, d: Deployment, body: dict[str, Any]) -> None:
        """A controller here wants a scale-out or a migration: ask the app's scheduler."""
        try:
            await self.links.request(
                self._scheduler_of(d),
                "app_scale",
                {**body, "generation": d.generation},
                timeout=10.0,
            )
        except AgiledartError as exc:
            log.warning("app_scale of %s to its scheduler failed: %s", d.app_id, exc)

    async def _app_scale(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        ops, action, peer = req.get("operators"), req.get("action"), req.get("peer")
        if not (
            isinstance(ops, list)
            and all(isinstance(o, str) for o in ops)
            and isinstance(action, str)
            and isinstance(peer, str)
        ):
            msg = "app_scale needs 'operators' (names), 'action' and 'peer' strings"
            raise MalformedError(msg)
        accepted = await self.scheduler.rescale(
            _app_id(req),
            ops,
            action,
            peer,
            generation=_generation(req),
            reason=str(req.get("reason", ""))[:200],
        )
        return {"accepted": accepted}

    async def _on_credit(self, msg: dict[str, Any], conn: ConnectionInfo) -> None:
        with self._frame_errors():
            frame = CreditFrame.from_wire(msg)
            inst = self.instances.get(frame.app_id)
            if inst is not None and frame.generation != inst.generation:
                self.dropped["data_stale"] += 1
            elif inst is None or not inst.grant(
                f"{frame.edge}>{conn.peer_name}", frame.credits, gone=frame.gone
            ):
                self.dropped["credit_unknown_edge"] += 1


def _generation(req: dict[str, Any]) -> int:
    g = req.get("generation", 0)
    return g if type(g) is int else 0


def _app_id(req: dict[str, Any]) -> str:
    app_id = req.get("app_id")
    if not isinstance(app_id, str) or not app_id:
        msg = "this request needs 'app_id'"
        raise MalformedError(msg)
    return app_id


def _join_delivered(delivery: Delivery) -> int:
    return len(delivery.path)


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
