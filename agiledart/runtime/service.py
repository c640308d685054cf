"""A peer's application runtime: the frame handlers behind apps, code and records.

:class:`AppRuntime` is owned by a :class:`~agiledart.peer.Peer`. It installs, on the
peer's frame server:

* client-facing requests: ``register``, ``submit``, ``apps``, ``status``, ``stop``;
* peer-facing requests: ``kv_put|kv_add|kv_get`` (records store), ``join`` (route a
  JOIN for the scheduler), ``deploy``, ``start``, ``undeploy``, ``app_stats``,
  ``app_sink_done``, ``app_failed``;
* data streams: ``data`` and ``wm`` in, ``credit`` back (on the outgoing links).

It publishes ``peer:<name>`` (node id, address) in the records store once the peer has
joined the ring, and again every ``publish_interval_s`` (owners change as peers come
and go), so schedulers anywhere can resolve the peers an app names.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agiledart.app.errors import ExecutionError
from agiledart.app.parse import parse_spec
from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError, OverlayError
from agiledart.overlay.node import Delivery, OverlayNode
from agiledart.overlay.tcp import ConnectionInfo, FrameServer
from agiledart.runtime.code import Bundle, CodeStore, code_ids_in, identifier
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import make_engine
from agiledart.runtime.instance import AppInstance, Deployment, InstanceOptions
from agiledart.runtime.links import Address, Links
from agiledart.runtime.mqtt import BrokerPool
from agiledart.runtime.records import Records, record_key
from agiledart.runtime.scheduler import Scheduler

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
    ) -> None:
        self.name = name
        self.overlay = overlay
        self.links = links
        self.state_dir = state_dir
        self.options = options or InstanceOptions()
        self.publish_interval_s = publish_interval_s
        self.records = Records(overlay, links)
        self.code = CodeStore(self.records, state_dir / "code")
        #: how this peer runs operator instances (worker pool and scheduler)
        self.engine = make_engine(execution or EngineConfig(workers=0), state_dir / "code")
        self.instances: dict[str, AppInstance] = {}
        #: the peer's MQTT connections, one per broker, shared by all its apps
        self.brokers = BrokerPool(client_id=f"agiledart-{name}")
        self.scheduler = Scheduler(
            name=name,
            address=lambda: self.overlay.address,
            records=self.records,
            links=links,
            code=self.code,
            directory=self,
            stats_of=self._stats_of,
        )
        self.dropped: dict[str, int] = {"data_unknown_app": 0, "credit_unknown_edge": 0}
        self._group: asyncio.TaskGroup | None = None
        self._publisher: asyncio.Task[None] | None = None
        self._reports: set[asyncio.Task[None]] = set()
        for type, handler in self.records.handlers().items():
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
            "app_failed": self._app_failed,
        }
        for type, handler in routes.items():
            frames.route(type, handler)
        frames.on_stream("data", self._on_data)
        frames.on_stream("wm", self._on_wm)
        links.on_stream("credit", self._on_credit)
        overlay.on_deliver("join", _join_delivered)

    def start(self, group: asyncio.TaskGroup, joined: asyncio.Event) -> None:
        self._group = group
        self._publisher = group.create_task(self._publish_loop(joined))
        self.brokers.start(group)
        self.engine.start(group)

    async def aclose(self) -> None:
        """Stop publishing and tear down every app instance on this peer."""
        self._group = None
        if self._publisher is not None:
            self._publisher.cancel()
        for task in list(self._reports):
            task.cancel()
        for inst in list(self.instances.values()):
            await inst.stop()
        self.instances.clear()
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
        while True:
            value = {
                "node_id": f"{self.overlay.node_id:040x}",
                "address": list(self.overlay.address),
            }
            try:
                await self.records.put(record_key("peer", self.name), value)
            except AgiledartError as exc:
                log.debug("could not publish peer record: %s", exc)
                await asyncio.sleep(2.0)
                continue
            await asyncio.sleep(self.publish_interval_s)

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
        rec = await self.scheduler.submit(spec, [str(o) for o in overrides])
        return {"app_id": rec.app_id, "state": rec.state, "placement": rec.placement}

    async def _apps(self, req: dict[str, Any], conn: ConnectionInfo) -> list[dict[str, Any]]:
        return await self.scheduler.list_apps()

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
                on_failed=lambda error: self._report_failed(d, error),
                brokers=self.brokers,
                engine=self.engine,
            )
        except AgiledartError:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code (a factory) too
            log.warning("cannot build app %s here", d.app_id, exc_info=True)
            msg = f"app {d.app_id} cannot run on {self.name}: {type(exc).__name__}: {exc}"
            raise ExecutionError(msg) from exc
        inst.launch(self._group)
        self.instances[d.app_id] = inst
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
        if inst is not None:
            await inst.stop()
        return {"undeployed": inst is not None}

    async def _app_stats(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any] | None:
        return await self._stats_of(_app_id(req))

    async def _stats_of(self, app_id: str) -> dict[str, Any] | None:
        inst = self.instances.get(app_id)
        return None if inst is None else inst.statistics()

    async def _app_sink_done(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        info = req.get("info") if isinstance(req.get("info"), dict) else {}
        await self.scheduler.sink_done(_app_id(req), str(req.get("sink")), info or {})
        return True

    async def _app_failed(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        await self.scheduler.failed(_app_id(req), conn.peer_name, str(req.get("error")))
        return True

    async def _report_done(self, d: Deployment, sink: str, info: dict[str, Any]) -> None:
        body = {"app_id": d.app_id, "sink": sink, "info": info}
        if self._group is not None:
            task = self._group.create_task(self._tell(d.scheduler, "app_sink_done", body))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)

    async def _report_failed(self, d: Deployment, error: str) -> None:
        await self._tell(d.scheduler, "app_failed", {"app_id": d.app_id, "error": error})

    async def _tell(self, address: Address, type: str, body: dict[str, Any]) -> None:
        for attempt in range(3):
            try:
                await self.links.request(address, type, body, timeout=30.0)
                return
            except OverlayError as exc:
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

    async def _on_data(self, msg: dict[str, Any], conn: ConnectionInfo) -> None:
        app_id, producer, batch = msg.get("a"), msg.get("p"), msg.get("b")
        if not isinstance(app_id, str) or not isinstance(producer, str):
            err = "data frame needs 'a' and 'p' strings"
            raise MalformedError(err)
        if not isinstance(batch, dict) or not isinstance(batch.get("e"), str):
            err = "data frame needs a batch map 'b' with an edge id"
            raise MalformedError(err)
        inst = self.instances.get(app_id)
        if inst is None:
            self.dropped["data_unknown_app"] += 1
            return
        inst.accept_data(producer, batch, conn)

    async def _on_wm(self, msg: dict[str, Any], conn: ConnectionInfo) -> None:
        app_id, producer, wm = msg.get("a"), msg.get("p"), msg.get("w")
        if not isinstance(app_id, str) or not isinstance(producer, str) or type(wm) is not int:
            err = "wm frame needs 'a', 'p' strings and an integer 'w'"
            raise MalformedError(err)
        wall = msg.get("c")
        inst = self.instances.get(app_id)
        if inst is not None:
            clock = float(wall) if isinstance(wall, int | float) else 0.0
            await inst.accept_wm(producer, wm, clock, conn.peer_name)

    async def _on_credit(self, msg: dict[str, Any], conn: ConnectionInfo) -> None:
        app_id, edge, n = msg.get("a"), msg.get("e"), msg.get("n")
        if not isinstance(app_id, str) or not isinstance(edge, str) or type(n) is not int:
            err = "credit frame needs 'a', 'e' strings and an integer 'n'"
            raise MalformedError(err)
        inst = self.instances.get(app_id)
        if inst is None or not inst.grant(f"{edge}>{conn.peer_name}", n):
            self.dropped["credit_unknown_edge"] += 1


def _app_id(req: dict[str, Any]) -> str:
    app_id = req.get("app_id")
    if not isinstance(app_id, str) or not app_id:
        msg = "this request needs 'app_id'"
        raise MalformedError(msg)
    return app_id


def _join_delivered(delivery: Delivery) -> int:
    return len(delivery.path)
