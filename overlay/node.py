"""One peer's place in the ring: the driver around the pure pieces.

:class:`OverlayNode` owns a UDP endpoint (real or fake), kademlia's routing table, the
leaf set, the failure detector and every background task (heartbeats, bucket refresh,
reconnection to the dead), all children of one ``asyncio.TaskGroup``::

    async with OverlayNode(node_id=..., key=..., name="gw-1") as node:
        await node.listen_udp("0.0.0.0", 4000)
        await node.bootstrap([("10.0.0.2", 4000)])
        result = await node.route(target_id, "join", {"app": "a1"})

Recursive routing (:meth:`route`, :class:`~.recursive.RecursiveRouting`): each hop
acks the message, appends itself to its path and forwards it with the decision of
``routing.next_hops``; a hop that does not ack in time is suspected and the next
candidate tried. The peer closest to the key calls the handler registered for the
message kind and reports the path to the origin. Heartbeats, bucket refresh and
graveyard probes are :class:`~.upkeep.Upkeep`'s loops; membership (contacts, leaf
set, failure detector, graveyard) stays here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from . import ids
from .auth import ClusterKey, DatagramAuth
from .config import OverlayConfig
from .envelope import RouteResult
from .errors import BadMessage, ClockSkewError, MalformedError, ReplayError
from .failure import FailureDetector
from .leafset import LeafSet, Membership, MembershipEvent
from .lookup import Lookup
from .protocol import Address, OverlayProtocol, Source
from .recursive import Delivery, Handler, RecursiveRouting
from .routing import Contact
from .table import Node, make_node
from .upkeep import Upkeep

log = logging.getLogger(__name__)

Listener = Callable[[MembershipEvent], None]

__all__ = ["Delivery", "OverlayNode"]


class OverlayNode:
    def __init__(
        self,
        *,
        node_id: int,
        key: ClusterKey,
        name: str = "",
        config: OverlayConfig | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        capacity: Callable[[], float] = lambda: 1.0,
    ) -> None:
        self.node_id = node_id
        self.name = name
        self.config = config or OverlayConfig()
        self.rng = rng or random.Random()
        self.auth = DatagramAuth(key, local_id=ids.to_bytes(node_id), clock=clock, rng=self.rng)
        self.capacity = capacity
        self.kad_node = make_node(node_id)
        self.protocol = OverlayProtocol(self)
        self.routing = RecursiveRouting(self)
        self.upkeep = Upkeep(self)
        self.router = self.protocol.router
        self.leaf_set = LeafSet(node_id, self.config.leaf_set_size)
        self.detector = FailureDetector(misses_to_dead=self.config.misses_to_dead)
        self.contacts: dict[int, Contact] = {}
        self.address: Address = ("0.0.0.0", 0)
        self.stats: Counter[str] = Counter()
        #: peers declared dead, and when (probed again by the upkeep; never revived second-hand)
        self.graveyard: OrderedDict[int, tuple[Contact, float]] = OrderedDict()
        self._listeners: list[Listener] = []
        self._verifying: set[int] = set()
        self._joining = False
        self.bootstrap_peers: list[Address] = []  #: where we joined (probed again when alone)
        self._last_log: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stack = contextlib.AsyncExitStack()  #: owns the task group
        self._group: asyncio.TaskGroup | None = None
        self._closing = False

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the task group (through an exit stack, which :meth:`aclose` closes) and
        start the heartbeat, refresh and graveyard loops in it."""
        self._group = await self._stack.enter_async_context(asyncio.TaskGroup())
        for loop in self.upkeep.loops():
            self.spawn(loop, guard=False)

    async def aclose(self) -> None:
        """Stop talking, cancel every task of the node and wait for them."""
        self.close()
        for task in list(self._tasks):
            task.cancel()
        await self._stack.aclose()

    async def __aenter__(self) -> OverlayNode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def close(self) -> None:
        """Stop talking: close the endpoint and fail pending routes."""
        self._closing = True
        if self.protocol.transport is not None:
            self.protocol.transport.close()
            self.protocol.connection_lost(None)
        self.routing.fail_pending()

    async def listen_udp(self, host: str, port: int, *, advertise: str | None = None) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self.protocol, local_addr=(host, port)
        )
        sock = transport.get_extra_info("sockname")
        self.address = (advertise or host, sock[1])

    def attach(self, transport: asyncio.DatagramTransport, address: Address) -> None:
        """Use an already bound transport (the fake network's)."""
        self.protocol.connection_made(transport)
        self.address = address

    def spawn(self, coro: Coroutine[Any, Any, Any], *, guard: bool = True) -> None:
        """Run ``coro`` as a child of this node's task group."""
        if self._group is None or self._closing:
            coro.close()
            return
        task = self._group.create_task(self._guarded(coro) if guard else coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            self.count("task_errors")
            log.exception("overlay task failed")

    # -- accounting -----------------------------------------------------------------------

    def count(self, what: str, n: int = 1) -> None:
        self.stats[what] += n

    def reject(self, exc: BadMessage, addr: Address) -> None:
        """Drop bad input: count it, log it at a bounded rate."""
        self.stats[f"rejected_{exc.reason}"] += 1
        if isinstance(exc, ReplayError):  # networks duplicate datagrams: not worth a warning
            log.debug("dropped a replayed datagram from %s: %s", addr, exc)
            return
        now = time.monotonic()
        if now - self._last_log.get(exc.reason, -1e9) >= self.config.log_interval_s:
            self._last_log[exc.reason] = now
            total = self.stats[f"rejected_{exc.reason}"]
            if isinstance(exc, ClockSkewError):
                log.warning("dropped datagrams from %s: %s (%d so far)", addr, exc, total)
            else:
                log.warning(
                    "dropped %s input from %s: %s (%d so far)", exc.reason, addr, exc, total
                )

    # -- membership -----------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` on every leaf-set event; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _publish(self, events: Iterable[MembershipEvent]) -> None:
        for event in events:
            if event.kind is Membership.JOINED:
                self.detector.watch(event.contact.node_id)
            else:
                self.detector.unwatch(event.contact.node_id)
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:
                    log.exception("membership listener failed")

    def self_info(self) -> list[Any]:
        return [ids.to_bytes(self.node_id), self.capacity(), self.name]

    def heard_from(self, raw_id: bytes, source: Source, name: object) -> Contact | None:
        """An authenticated, fresh request came from this peer: it is alive, and if the
        datagram vouches for its address (sealed for us, from the port the sender
        listens on) it is reachable there. A datagram that does not vouch (replayed to
        us from elsewhere, or a request to anyone) never adds or moves a contact."""
        nid = ids.from_bytes(raw_id)
        if nid == self.node_id:
            return None
        if not source.vouched:
            self.count("unvouched_requests")
            contact = self.contacts.get(nid)
            if contact is not None and contact.address == source.address:
                self.detector.on_ack(nid)
            return contact
        host, port = source.address
        contact = self._welcome(nid, host, port, name if isinstance(name, str) else None)
        self.detector.on_ack(nid)
        return contact

    def note_alive(self, nid: int, addr: Address) -> None:
        if nid != self.node_id:
            self._welcome(nid, addr[0], addr[1], None)
            self.detector.on_ack(nid)

    def note_failure(self, nid: int) -> None:
        contact = self.contacts.get(nid)
        if contact is None:
            return
        contact.failures += 1
        if contact.failures >= self.config.contact_max_failures and nid not in self.leaf_set:
            self._forget(contact, dead=False)

    def learn(self, wire_contacts: Iterable[tuple[bytes, str, int, str]]) -> None:
        """Contacts heard second-hand (lookups, leaf-set exchange): added if new, but
        never trusted to revive a peer we recently declared dead."""
        now = asyncio.get_running_loop().time()
        contacts, graveyard, ttl = self.contacts, self.graveyard, self.config.graveyard_ttl_s
        for raw, host, port, name in wire_contacts:
            nid = int.from_bytes(raw, "big")
            known = contacts.get(nid)
            if known is not None:
                if name and not known.name:
                    known.name = name
                continue
            if nid == self.node_id:
                continue
            grave = graveyard.get(nid)
            if grave is not None and now - grave[1] < ttl:
                continue
            if (
                not self._joining
                and len(self.leaf_set) == self.leaf_set.size
                and self.leaf_set.would_accept(nid)
            ):
                # one that would push out a current neighbour is verified first: a stale
                # leaf set elsewhere must not plant a dead peer among ours
                if nid not in self._verifying:
                    self._verifying.add(nid)
                    self.spawn(self._verify((host, port), nid))
                continue
            self._add(Contact(nid, host, port, name))

    def seed(self, contacts: Iterable[Contact]) -> None:
        """Contacts an outside authority vouches for, as if just heard first-hand: how
        a simulator builds a large ring without running every join
        (:class:`~agiledart.overlay.simulation.SimulatedRing` with ``oracle=True``)."""
        now = asyncio.get_running_loop().time()
        for contact in contacts:
            if contact.node_id != self.node_id and contact.node_id not in self.contacts:
                contact.last_seen = now
                self._add(contact)

    async def _verify(self, addr: Address, nid: int) -> None:
        try:
            if await self.ping(addr, nid) != nid:
                self.note_failure(nid)
        finally:
            self._verifying.discard(nid)

    def _welcome(self, nid: int, host: str, port: int, name: str | None) -> Contact:
        """First-hand evidence that ``nid`` is alive at ``host:port``."""
        contact = self.contacts.get(nid)
        if contact is None:
            self.graveyard.pop(nid, None)
            contact = self._add(Contact(nid, host, port, name or ""))
            contact.last_seen = asyncio.get_running_loop().time()
        else:
            contact.last_seen = asyncio.get_running_loop().time()
            contact.host, contact.port, contact.failures = host, port, 0
            if name:
                contact.name = name
            if self.leaf_set.would_accept(nid):
                self._publish(self.leaf_set.offer(contact))
        return contact

    def _add(self, contact: Contact) -> Contact:
        self.contacts[contact.node_id] = contact
        self.router.add_contact(make_node(contact.node_id, contact.host, contact.port))
        events = self.leaf_set.offer(contact)
        if events:
            self._publish(events)
        return contact

    def _forget(self, contact: Contact, *, dead: bool) -> None:
        nid = contact.node_id
        self.router.remove_contact(make_node(nid))
        events = self.leaf_set.remove(nid, dead=dead)
        if dead:
            self.graveyard[nid] = (contact, asyncio.get_running_loop().time())
            self.graveyard.move_to_end(nid)
            while len(self.graveyard) > self.config.graveyard_size:
                self.graveyard.popitem(last=False)
        self.contacts.pop(nid, None)
        self._publish(events)
        if events:  # refill the leaf set, verifying each candidate first
            for n in self.router.find_neighbors(self.kad_node, k=self.config.leaf_set_size):
                if self.leaf_set.would_accept(n.long_id) and n.long_id not in self._verifying:
                    self._verifying.add(n.long_id)
                    self.spawn(self._verify((n.ip, n.port), n.long_id))

    def declare_dead(self, nid: int) -> None:
        contact = self.contacts.get(nid)
        if contact is not None:
            self.count("peers_declared_dead")
            log.info("peer %s (%s) declared dead", contact.name or ids.short(nid), contact.address)
            self._forget(contact, dead=True)

    def ping_head(self, head: Node) -> None:
        """A bucket is full: check that its least recently seen contact still answers
        (Kademlia §2.2), unless we heard from it within the last heartbeat interval."""
        contact = self.contacts.get(head.long_id)
        now = asyncio.get_running_loop().time()
        if contact is not None and now - contact.last_seen < self.config.heartbeat_interval_s:
            return
        if head.long_id in self._verifying:
            return
        self._verifying.add(head.long_id)
        self.spawn(self._verify((head.ip, head.port), head.long_id))

    def neighbours_of(self, raw_key: bytes, *, k: int | None = None) -> list[Any]:
        """The contacts closest to a key, in wire form (find_node's answer). In a
        heartbeat the key is the caller's id: a neighbour knows the caller's
        neighbourhood best, so leaf sets converge even where lookups lost datagrams."""
        found = self.router.find_neighbors(Node(raw_key), k=k or self.config.ksize)
        out = []
        for n in found:
            c = self.contacts.get(n.long_id)
            out.append([n.id, n.ip, n.port, c.name if c else ""])
        return out

    def known_peers(self) -> list[Contact]:
        return sorted(self.contacts.values(), key=lambda c: c.node_id)

    def recently_dead(self, within_s: float) -> list[Contact]:
        """The peers declared dead in the last ``within_s`` seconds, the latest first."""
        since = asyncio.get_running_loop().time() - within_s
        return [c for c, at in reversed(self.graveyard.values()) if at >= since]

    # -- joining and upkeep ---------------------------------------------------------------

    async def ping(self, addr: Address, nid: int | None = None) -> int | None:
        """Ping an address (sealed for ``nid`` when we know who listens there, else
        for anyone); the peer's id if it answered."""
        t0 = asyncio.get_running_loop().time()
        ok, res = await self.protocol.call(
            addr, "ping", ids.to_bytes(self.node_id), self.name, to=nid
        )
        if not ok:
            return None
        try:
            raw, cap, name = res
            nid = ids.from_bytes(raw)
        except (TypeError, ValueError):
            self.reject(MalformedError("bad ping response"), addr)
            return None
        contact = self._welcome(nid, addr[0], addr[1], name if isinstance(name, str) else None)
        contact.observe_rtt((asyncio.get_running_loop().time() - t0) * 1000)
        if isinstance(cap, float | int):
            contact.capacity = float(cap)
        self.detector.on_ack(nid)
        return nid

    async def bootstrap(self, addresses: Iterable[Address]) -> int:
        """Join through any of ``addresses``; returns how many peers we know afterwards."""
        self.bootstrap_peers = list(addresses)
        self._joining = True  # the lookups' fresh answers build our neighbourhood
        try:
            return await self._join()
        finally:
            self._joining = False

    async def _join(self) -> int:
        answers = await asyncio.gather(*(self.ping(a) for a in self.bootstrap_peers))
        seeds = [self.router_node(n) for n in answers if n is not None]
        if seeds:
            await Lookup(
                self.protocol, self.kad_node, seeds, self.config.ksize, self.config.alpha
            ).find()
            await self.refresh()
        return len(self.contacts)

    def router_node(self, nid: int) -> Node:
        c = self.contacts[nid]
        return make_node(nid, c.host, c.port)

    async def refresh(self) -> None:
        """Re-learn the id space around us (:meth:`.upkeep.Upkeep.refresh`)."""
        await self.upkeep.refresh()

    # -- routing (recursive.py) ------------------------------------------------------------

    def on_deliver(self, kind: str, handler: Handler) -> None:
        """Handle routed messages of ``kind`` that end at this peer."""
        self.routing.on_deliver(kind, handler)

    async def route(
        self, key: int, kind: str, payload: Any = None, *, timeout: float | None = None
    ) -> RouteResult:
        """Route a message to the peer closest to ``key``; its path and handler result."""
        return await self.routing.route(key, kind, payload, timeout=timeout)

    @property
    def route_hops(self) -> Counter[int]:
        """Forwarding steps of the routes this peer originated, by count (metrics)."""
        return self.routing.route_hops
