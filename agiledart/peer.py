"""One agiledart peer: the overlay on PORT/udp and the frame server on PORT/tcp.

A :class:`Peer` is an ``async with`` object owning one :class:`asyncio.TaskGroup`;
the overlay node, the frame server with one task per connection, and the bootstrap
retry loop are its children. ``agiledart peer`` runs one until SIGINT or SIGTERM.

Control RPCs served over TCP frames (the CLI's and other peers' way in):

``ring``   what this peer knows: itself, its contacts, its leaf set, counters
``route``  route a probe toward a key or a peer's id and return the path it took
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agiledart.overlay import ids
from agiledart.overlay.address import Address
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.config import OverlayConfig
from agiledart.overlay.errors import ConfigError, UnknownPeer
from agiledart.overlay.node import Delivery, OverlayNode
from agiledart.overlay.tcp import ConnectionInfo, FrameServer, key_differs_at
from agiledart.runtime.central import CentralMaster
from agiledart.runtime.confine import DataPolicy
from agiledart.runtime.epochs import CHECKPOINT_RATE
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.failover import PINNED_GRACE_S
from agiledart.runtime.hosting import REPORT_TIMEOUT_S
from agiledart.runtime.links import Links
from agiledart.runtime.service import AppRuntime
from agiledart.runtime.zones import ZoneAgent
from agiledart.statedir import StateDirLock, default_state_dir
from agiledart.traces import NullTraceWriter, TraceWriter

if TYPE_CHECKING:
    from agiledart.runtime.linkmodel import LinkModel
    from agiledart.site import Site

log = logging.getLogger(__name__)

__all__ = ["Peer", "PeerConfig", "UnknownPeer"]


@dataclass(frozen=True, kw_only=True)
class PeerConfig:
    listen: Address
    bootstrap: Sequence[Address] = ()
    name: str = ""
    zone: str = "default"
    #: None: ``./state/<name>`` (or ``./state`` where it already holds a node id)
    state_dir: Path | None = None
    trace_dir: Path | None = None
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    scheduler: str = "edgewise"  #: edgewise | random | os | lachesis
    turn: int = 50  #: tuples per scheduling turn, at most
    lachesis_policy: str = "qs"
    offload_us: float = 10.0  #: operators costing more per record go to the workers
    metrics_port: int | None = None  #: Prometheus metrics (agiledart.site)
    #: where metrics are served; None: a loopback address (agiledart.site.metrics_host)
    metrics_host: str | None = None
    metrics_token_file: Path | None = None  #: else $AGILEDART_METRICS_TOKEN, else none
    dashboard_port: int | None = None  #: the web dashboard (agiledart.site), off by default
    dashboard_host: str = "127.0.0.1"
    advertise: str | None = None
    links: Path | None = None  #: emulated link model (docs/bandit-graphs.md format)
    #: who schedules submitted apps: ``zones`` (zone schedulers, paper §VI), ``local``
    #: (the peer receiving the submit), ``central`` (the ``master`` peer, FCFS baseline)
    scheduling: str = "zones"
    master: str = ""  #: the master's peer name, with ``scheduling="central"``
    #: emulation: round-trip time added to every control request to another peer
    control_rtt_ms: float = 0.0
    #: checkpoint epochs this peer's scheduler starts per second, at most
    checkpoint_rate: float = CHECKPOINT_RATE
    #: how long the peer of a source or sink that died is waited for before its apps fail
    pinned_grace_s: float = PINNED_GRACE_S
    #: how long a sink's end or a failure waits for the scheduler before it is sent again
    report_timeout_s: float = REPORT_TIMEOUT_S
    overlay: OverlayConfig = field(default_factory=OverlayConfig)
    #: what app specs may reach on this peer (agiledart.runtime.confine): file sources
    #: and sinks under the data root (None: the state dir) or an allowed folder, and the
    #: environment variables named AGILEDART_SECRET_* or allowed here
    data_root: Path | None = None
    allow_paths: tuple[Path, ...] = ()
    allow_env: tuple[str, ...] = ()


class Peer:
    def __init__(self, config: PeerConfig, key: ClusterKey) -> None:
        self.config = config
        self.key = key
        _host, port = config.listen
        self.name = config.name or f"{socket.gethostname()}:{port}"
        self.state_dir = config.state_dir or default_state_dir(self.name)
        self.node_id = ids.load_or_create_node_id(self.state_dir)
        self.overlay = OverlayNode(
            node_id=self.node_id, key=key, name=self.name, config=config.overlay
        )
        self.frames = FrameServer(key=key, name=self.name)
        self.links = Links(key, self.name, rtt_s=config.control_rtt_ms / 1000.0)
        self.trace: TraceWriter | NullTraceWriter = NullTraceWriter()
        if config.trace_dir is not None:
            self.trace = TraceWriter(
                config.trace_dir, self.name, node_id=f"{self.node_id:040x}", zone=config.zone
            )
        self.link_model = _link_model(config.links, self.name)
        self.runtime = AppRuntime(
            name=self.name,
            overlay=self.overlay,
            frames=self.frames,
            links=self.links,
            state_dir=self.state_dir,
            execution=EngineConfig(
                scheduler=config.scheduler,
                workers=config.workers,
                turn=config.turn,
                policy=config.lachesis_policy,
                offload_us=config.offload_us,
            ),
            link_model=self.link_model,
            trace=self.trace,
            checkpoint_rate=config.checkpoint_rate,
            data=DataPolicy.of(
                config.data_root or self.state_dir,
                allow_paths=config.allow_paths,
                allow_env=config.allow_env,
            ),
        )
        self.runtime.scheduler.pinned_grace_s = config.pinned_grace_s
        self.runtime.hosting.report_timeout_s = config.report_timeout_s
        self.zoning: ZoneAgent | None = None
        self.central: CentralMaster | None = None
        self._setup_scheduling()
        self._joined = asyncio.Event()
        self.frames.route("ring", self._ring)
        self.frames.route("route", self._route)
        self.overlay.on_deliver("probe", _probe)
        self._stack = contextlib.AsyncExitStack()  #: owns the task group and the overlay node
        self._group: asyncio.TaskGroup | None = None
        self._stopped = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self.site: Site | None = None  #: metrics endpoint and dashboard, when configured
        self._lock: StateDirLock | None = None

    async def start(self) -> None:
        """Listen, and start every task of the peer in its task group (entered through
        an exit stack, with the overlay node: :meth:`aclose` leaves both)."""
        host, port = self.config.listen
        self._lock = StateDirLock.acquire(self.state_dir, name=self.name)
        self._group = await self._stack.enter_async_context(asyncio.TaskGroup())
        try:
            await self._stack.enter_async_context(self.overlay)
            try:
                await self.overlay.listen_udp(host, port, advertise=self._advertised_host())
            except OSError as exc:
                msg = f"cannot listen on {host}:{port}/udp: {exc.strerror or exc}"
                raise ConfigError(msg) from exc
            port = self.overlay.address[1]
            await self.frames.start(self._group, host, port)
            if self.config.metrics_port is not None or self.config.dashboard_port is not None:
                from agiledart.site import Site

                self.site = await Site.start(self, self._group)
        except BaseException:
            await self.aclose()
            raise
        await self.trace.start()
        self._group.create_task(self._join_loop())
        self.runtime.start(self._group, self._joined)
        if self.zoning is not None:
            self._loops.append(self._group.create_task(self.zoning.gossip_loop()))
        if self.central is not None and self.central.is_master:
            self._loops.append(self._group.create_task(self.central.run()))
        # the CLI prints "peer NAME listening on ..." for people; the id is for debugging
        log.debug("peer %s (%s) listening on %s:%d", self.name, ids.short(self.node_id), host, port)

    async def aclose(self) -> None:
        """Stop: close the parts that own connections, then the overlay node and the task
        group (waiting for every task), then release the state directory."""
        self._stopped.set()
        for loop in self._loops:  # endless: the task group would wait for them forever
            loop.cancel()
        if self.site is not None:
            await self.site.aclose()
        await self.runtime.aclose()
        await self.trace.aclose()
        await self.links.aclose()
        await self.frames.aclose()
        await self._stack.aclose()  # the overlay node, then the task group
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    async def __aenter__(self) -> Peer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def address(self) -> Address:
        return self.overlay.address

    def stop(self) -> None:
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def _advertised_host(self) -> str:
        host = self.config.listen[0]
        if self.config.advertise:
            return self.config.advertise
        if host in ("0.0.0.0", "::", ""):
            try:
                return socket.gethostbyname(socket.gethostname())
            except OSError:
                return "127.0.0.1"
        return host

    def _setup_scheduling(self) -> None:
        """Zone schedulers or the central master take over ``submit`` (see PeerConfig)."""
        mode, runtime = self.config.scheduling, self.runtime
        if mode == "zones":
            self.zoning = ZoneAgent(
                name=self.name,
                zone=self.config.zone,
                overlay=self.overlay,
                links=self.links,
                records=runtime.records,
                scheduler=runtime.scheduler,
                hosted=lambda: len(runtime.instances),
                trace=self.trace,
            )
            handlers = self.zoning.handlers()
            runtime.submitter = self.zoning.submit
            runtime.adopter = self.zoning.adopt
            zoning = self.zoning
            runtime.on_resumed = lambda: zoning.become_scheduler("resumed")
        elif mode == "central":
            if not self.config.master:
                msg = "--scheduling central needs --master NAME (the master peer)"
                raise ConfigError(msg)
            self.central = CentralMaster(
                name=self.name,
                master=self.config.master,
                scheduler=runtime.scheduler,
                links=self.links,
                resolve=runtime.resolve,
            )
            handlers = self.central.handlers()
            runtime.submitter = self.central.submit
        elif mode == "local":
            return
        else:
            msg = f"--scheduling must be zones, central or local, not {mode!r}"
            raise ConfigError(msg)
        for type, handler in handlers.items():
            self.frames.route(type, handler)

    async def _join_loop(self) -> None:
        """Join through the bootstrap peers, retrying with back-off until one answers
        (peers of a site start in any order)."""
        if not self.config.bootstrap:
            self._joined.set()
            self._trace_joined()
            return
        delay = 0.5
        while not self._stopped.is_set():
            addresses = await self._resolve(self.config.bootstrap)
            known = await self.overlay.bootstrap(addresses) if addresses else 0
            if known:
                log.info("joined the ring: %d peers known", known)
                self._joined.set()
                self._trace_joined()
                return
            why = ""
            for host, port in addresses:  # a wrong key looks like silence over UDP
                differs = await key_differs_at(host, port, key=self.key, name=self.name)
                if differs is not None:
                    why = f" ({differs})"
                    break
            log.warning("no bootstrap peer answered%s; retrying in %.1f s", why, delay)
            try:
                async with asyncio.timeout(delay):
                    await self._stopped.wait()
            except TimeoutError:
                delay = min(delay * 2, 30.0)

    def _trace_joined(self) -> None:
        self.trace.emit(
            "peer",
            event="join",
            subject=self.name,
            node_id=f"{self.node_id:040x}",
            zone=self.config.zone,
        )

    async def _resolve(self, addresses: Sequence[Address]) -> list[Address]:
        loop = asyncio.get_running_loop()
        out = []
        for host, port in addresses:
            try:
                infos = await loop.getaddrinfo(
                    host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM
                )
            except OSError as exc:
                log.warning("cannot resolve bootstrap peer %s: %s", host, exc)
                continue
            out.append((str(infos[0][4][0]), port))
        return out

    # -- control RPCs ---------------------------------------------------------------------

    def ring_info(self) -> dict[str, Any]:
        node = self.overlay
        leaf = node.leaf_set.members()
        return {
            "self": self.name,
            "node_id": f"{self.node_id:040x}",
            "address": f"{node.address[0]}:{node.address[1]}",
            "zone": self.config.zone,
            "scheduling": self._scheduling_info(),
            "peers": [
                {
                    "name": c.name,
                    "node_id": f"{c.node_id:040x}",
                    "address": f"{c.host}:{c.port}",
                    "rtt_ms": None if c.rtt_ms is None else round(c.rtt_ms, 3),
                    "capacity": c.capacity,
                    "suspect": c.failures > 0,
                }
                for c in node.known_peers()
            ],
            "leaf_set": [c.name or f"{c.node_id:040x}" for c in leaf],
            "stats": dict(node.stats),
            "apps": sorted(self.runtime.instances),
            "records": {
                "count": len(self.runtime.records.local),
                "bytes": self.runtime.records.local.bytes,
                "upkeep": dict(self.runtime.records.stats),
            },
            "code_loaded": self.runtime.code.loaded,
            "query_groups": self.runtime.query_groups(),
            "frames": dataclasses.asdict(self.frames.statistics()),
            "mqtt": dataclasses.asdict(self.runtime.brokers.statistics()),
            "execution": self.runtime.engine.info(),
            "relay": None if self.runtime.relay is None else self.runtime.relay.info(),
            "traces": {"written": self.trace.written, "dropped": self.trace.dropped}
            if self.trace.enabled
            else None,
        }

    def _scheduling_info(self) -> dict[str, Any]:
        if self.zoning is not None:
            return {"mode": "zones", **self.zoning.info()}
        if self.central is not None:
            return self.central.info()
        return {"mode": "local"}

    async def _ring(self, request: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        return self.ring_info()

    async def _route(self, request: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        """Route a probe to a key (40 hex digits) or to the id of a named peer."""
        target = request.get("to")
        if not isinstance(target, str) or not target:
            msg = "route needs 'to': a peer name or a 40-hex-digit key"
            raise ConfigError(msg)
        key = await self._key_of(target)
        result = await self.overlay.route(key, "probe", None)
        return {
            "key": f"{key:040x}",
            "hops": result.hops,
            "path": [
                {
                    "name": h.name,
                    "node_id": f"{h.node_id:040x}",
                    "address": f"{h.host}:{h.port}",
                    "rtt_ms": h.rtt_ms,
                    "capacity": h.capacity,
                }
                for h in result.path
            ],
        }

    async def _key_of(self, target: str) -> int:
        """A key, or the id of a peer named so, known here or in the records store."""
        if len(target) == 2 * ids.ID_BYTES:
            try:
                return int(target, 16)
            except ValueError:
                pass
        found = await self.runtime.resolve(target)
        if found is None:
            msg = f"no peer named {target!r} is in the ring (see `agiledart ring`)"
            raise UnknownPeer(msg)
        return found[0]


def _link_model(path: Path | None, name: str) -> LinkModel | None:
    """The emulated network from ``--links``; a file that does not name this peer is
    refused (the peer would silently bypass it)."""
    if path is None:
        return None
    from agiledart.bandit.errors import GraphError
    from agiledart.runtime.linkmodel import LinkModel

    try:
        model = LinkModel.load(path)
    except GraphError as exc:
        msg = f"--links {path}: {exc}"
        raise ConfigError(msg) from None
    if not model.covers(name):
        msg = f"--links {path}: the link model has no node named {name!r} (this peer)"
        raise ConfigError(msg)
    return model


def _probe(delivery: Delivery) -> int:
    return len(delivery.path)
