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
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError
from agiledart.overlay.node import Delivery, OverlayNode
from agiledart.overlay.tcp import ConnectionInfo, FrameServer
from agiledart.runtime.code import Bundle, CodeStore, code_ids_in, identifier
from agiledart.runtime.confine import DataPolicy
from agiledart.runtime.deployment import InstanceOptions
from agiledart.runtime.epochs import CHECKPOINT_RATE
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import make_engine
from agiledart.runtime.hosting import Hosting, app_id_of, generation_of
from agiledart.runtime.instance import AppInstance
from agiledart.runtime.links import Address, Links
from agiledart.runtime.metrics import Buckets
from agiledart.runtime.mqtt import SESSION_EXPIRY_S, BrokerPool
from agiledart.runtime.records import Records, record_key
from agiledart.runtime.recovery import SWEEP_S, FragmentStore, Uplink
from agiledart.runtime.scheduler import APPS_DAYS, APPS_LIMIT, Scheduler
from agiledart.runtime.streams import DataStreams
from agiledart.runtime.takeover import Takeover
from agiledart.traces import NullTraceWriter
from agiledart.traces.writer import TraceWriter

if TYPE_CHECKING:
    from agiledart.runtime.linkmodel import LinkModel
    from agiledart.runtime.relay import Relay

log = logging.getLogger(__name__)

__all__ = ["AppRuntime"]


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
        self.hosting = Hosting(self)  #: the app instances here and their reports
        self.takeover = Takeover(self)  #: deaths of other peers, restarts of this one
        self.streams = DataStreams(self)  #: the data plane's frames in
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
        self.brokers = BrokerPool(
            client_id=f"agiledart-{name}",
            trace=self.trace,
            session_expiry_s=SESSION_EXPIRY_S,
            log_root=state_dir / "mqtt",
        )
        self.scheduler = Scheduler(
            name=name,
            address=lambda: self.overlay.address,
            records=self.records,
            links=links,
            code=self.code,
            directory=self,
            stats_of=self.hosting.stats_of,
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
        #: apps whose scheduler changed since deployment (adopted): where reports go now
        self.rebound: dict[str, Address] = {}
        for type, handler in self.records.handlers().items():
            frames.route(type, handler)
        #: checkpoint fragments this peer holds for others (agiledart.runtime.recovery)
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
            "deploy": self.hosting.deploy,
            "start": self.hosting.start,
            "undeploy": self.hosting.undeploy,
            "app_stats": self.hosting.app_stats,
            "app_sink_done": self._app_sink_done,
            "app_scheduled": self._app_scheduled,
            "app_failed": self._app_failed,
            "app_barrier": self.hosting.app_barrier,
            "app_committed": self.hosting.app_committed,
            "app_peer_dead": self.takeover.app_peer_dead,
            "app_checkpoint": self._app_checkpoint,
            "app_rebind": self.hosting.app_rebind,
            "app_scale": self._app_scale,
        }
        for type, handler in routes.items():
            frames.route(type, handler)
        frames.on_stream("data", self.streams.on_data)
        frames.on_stream("wm", self.streams.on_wm)
        frames.on_stream("bar", self.streams.on_barrier)
        links.on_stream("credit", self.streams.on_credit)
        frames.on_stream("credit", self.streams.on_credit)  # from relayed data's destinations
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
                deliver=self.streams.relayed,
                trace=self.trace,
            )
            frames.on_stream("relay", self.relay.on_relay)
            links.on_stream("relay_ack", self.relay.on_ack)
            frames.on_stream("relay_done", self.relay.on_done)
        overlay.on_deliver("join", _join_delivered)
        overlay.subscribe(self.takeover.membership)

    def start(self, group: asyncio.TaskGroup, joined: asyncio.Event) -> None:
        self._group = group
        self.records.load()  # the peer holds its state directory by now
        self.scheduler.start()
        self._publisher = group.create_task(self._publish_loop(joined))
        self._upkeep = group.create_task(self.records.upkeep_loop(joined))
        self._offerer = group.create_task(self._offer_cached_code(joined))
        if self.trace.enabled:
            self._tracer = group.create_task(self.hosting.opstats_loop())
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
        await self.scheduler.aclose()
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
            await inst.aclose()
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
        self._background(self.takeover.after_restart())
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
        return await self.scheduler.status(app_id_of(req))

    async def _stop(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        rec = await self.scheduler.stop(app_id_of(req))
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

    async def _app_sink_done(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        """False: this peer does not schedule the app (it restarted and has not taken
        its apps back yet); the sink asks again."""
        info = req.get("info") if isinstance(req.get("info"), dict) else {}
        return await self.scheduler.sink_done(
            app_id_of(req), str(req.get("sink")), info or {}, generation=generation_of(req)
        )

    async def _app_failed(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        lost = req.get("lost")
        return await self.scheduler.failed(
            app_id_of(req),
            conn.peer_name,
            str(req.get("error")),
            lost=lost if isinstance(lost, str) and lost else None,
            generation=generation_of(req),
        )

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

    async def _app_scheduled(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        return self.scheduler.schedules(app_id_of(req))

    # -- data -------------------------------------------------------------------------

    async def _address_of(self, name: str) -> Address | None:
        found = await self.resolve(name)
        return None if found is None else found[1]

    # -- checkpoints --------------------------------------------------------------------

    async def _app_checkpoint(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        report = req.get("report")
        if not isinstance(report, dict) or type(report.get("epoch")) is not int:
            msg = "app_checkpoint needs a 'report' with an integer 'epoch'"
            raise MalformedError(msg)
        await self.scheduler.checkpoint_report(
            app_id_of(req), report, generation=generation_of(req)
        )
        return True

    # -- elastic scaling (agiledart.runtime.scaling) ------------------------------------

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
            app_id_of(req),
            ops,
            action,
            peer,
            generation=generation_of(req),
            reason=str(req.get("reason", ""))[:200],
        )
        return {"accepted": accepted}


def _join_delivered(delivery: Delivery) -> int:
    return len(delivery.path)
