"""One peer's place in the ring: the driver around the pure pieces.

:class:`OverlayNode` owns a UDP endpoint (real or fake), kademlia's routing table, the
leaf set, the failure detector and every background task (heartbeats, bucket refresh,
reconnection to the dead), all children of one ``asyncio.TaskGroup``::

    async with OverlayNode(node_id=..., key=..., name="gw-1") as node:
        await node.listen_udp("0.0.0.0", 4000)
        await node.bootstrap([("10.0.0.2", 4000)])
        result = await node.route(target_id, "join", {"app": "a1"})

Recursive routing (:meth:`route`): each hop acks the message, appends itself to its
path and forwards it with the decision of ``routing.next_hops``; a hop that does not
ack in time is suspected and the next candidate tried. The peer closest to the key
calls the handler registered for the message kind and reports the path to the origin.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from . import ids
from .auth import ClusterKey, DatagramAuth
from .config import OverlayConfig
from .envelope import Envelope, Hop, RouteResult
from .errors import BadMessage, ClockSkewError, MalformedError, ReplayError, RouteError
from .failure import FailureDetector, Health
from .leafset import LeafSet, Membership, MembershipEvent
from .lookup import Lookup
from .protocol import Address, OverlayProtocol, Source, check_contact
from .routing import Contact, next_hops
from .table import Node, make_node

log = logging.getLogger(__name__)

Handler = Callable[["Delivery"], Any]
Listener = Callable[[MembershipEvent], None]

__all__ = ["Delivery", "OverlayNode"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """A routed message at the peer closest to its key."""

    key: int
    kind: str
    payload: Any
    path: tuple[Hop, ...]


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
        self.router = self.protocol.router
        self.leaf_set = LeafSet(node_id, self.config.leaf_set_size)
        self.detector = FailureDetector(misses_to_dead=self.config.misses_to_dead)
        self.contacts: dict[int, Contact] = {}
        self.address: Address = ("0.0.0.0", 0)
        self.stats: Counter[str] = Counter()
        #: forwarding steps of the routes this peer originated, by count (metrics)
        self.route_hops: Counter[int] = Counter()
        self._graveyard: OrderedDict[int, tuple[Contact, float]] = OrderedDict()
        self._handlers: dict[str, Handler] = {}
        self._listeners: list[Listener] = []
        self._pending: dict[bytes, asyncio.Future[RouteResult]] = {}
        self._seen_routes: OrderedDict[bytes, None] = OrderedDict()
        self._verifying: set[int] = set()
        self._joining = False
        self._bootstrap: list[Address] = []
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
        for loop_fn in (self._heartbeat_loop, self._refresh_loop, self._graveyard_loop):
            self.spawn(loop_fn(), guard=False)

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
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RouteError("the overlay node is closing"))
        self._pending.clear()

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
        contacts, graveyard, ttl = self.contacts, self._graveyard, self.config.graveyard_ttl_s
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
            self._graveyard.pop(nid, None)
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
            self._graveyard[nid] = (contact, asyncio.get_running_loop().time())
            self._graveyard.move_to_end(nid)
            while len(self._graveyard) > self.config.graveyard_size:
                self._graveyard.popitem(last=False)
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
        return [c for c, at in reversed(self._graveyard.values()) if at >= since]

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
        self._bootstrap = list(addresses)
        self._joining = True  # the lookups' fresh answers build our neighbourhood
        try:
            return await self._join()
        finally:
            self._joining = False

    async def _join(self) -> int:
        answers = await asyncio.gather(*(self.ping(a) for a in self._bootstrap))
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
        """Re-learn the id space around us (Kademlia §2.3's bucket refresh).

        For every prefix level ``j`` above the leaf set's reach, ask the closest contact
        we know for the neighbours of a random id that differs from ours first at bit
        ``j``: one RPC per level fills the subtree at distance [2^j, 2^(j+1)). Levels
        below the farthest leaf-set member are the leaf set's, kept by heartbeats; and
        our two closest neighbours are asked for theirs of our own id, which closes the
        gaps that peers joining at the same moment leave in each other's leaf sets.
        """
        members = self.leaf_set.members()
        reach = (members[-1].node_id ^ self.node_id).bit_length() if members else 0
        queries = []
        for level in range(ids.ID_BITS - 1, max(reach - 2, -1), -1):
            noise = self.rng.getrandbits(level) if level else 0
            target = make_node(self.node_id ^ (1 << level) ^ noise)
            near = self.router.find_neighbors(target, k=1)
            if near:
                queries.append(self.protocol.call_find_node(near[0], target))
        for near in self.router.find_neighbors(self.kad_node, k=2):
            queries.append(self.protocol.call_find_node(near, self.kad_node))
        await asyncio.gather(*queries)

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_s
        beat = 0
        while True:
            await asyncio.sleep(interval * (0.9 + 0.2 * self.rng.random()))
            beat += 1
            # leaf sets are exchanged every few beats, and on every beat while ours is short
            exchange = beat % 4 == 0 or len(self.leaf_set) < self.leaf_set.size
            for contact in self.leaf_set.members():
                self.spawn(self._heartbeat(contact, exchange))

    async def _heartbeat(self, contact: Contact, exchange: bool) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ok, res = await self.protocol.call(
            contact.address,
            "heartbeat",
            ids.to_bytes(self.node_id),
            self.capacity(),
            exchange,
            self.name,
            timeout=min(self.config.rpc_timeout_s, self.config.heartbeat_interval_s),
            to=contact.node_id,
        )
        nid = contact.node_id
        if not ok:
            if self.detector.on_miss(nid) is Health.DEAD:
                self.declare_dead(nid)
            return
        try:
            raw, cap, name, members = res
            if ids.from_bytes(raw) != nid:
                msg = "heartbeat answered by another id"
                raise MalformedError(msg)
            learned = [check_contact(m) for m in members[: 4 * self.config.leaf_set_size]]
        except (BadMessage, TypeError, ValueError):
            self.reject(MalformedError("bad heartbeat response"), contact.address)
            return
        contact.observe_rtt((loop.time() - t0) * 1000)
        if isinstance(cap, float | int):
            contact.capacity = float(cap)
        if isinstance(name, str) and name:
            contact.name = name
        self.detector.on_ack(nid)
        self.learn(learned)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_interval_s * (0.9 + 0.2 * self.rng.random()))
            self.spawn(self._crawl_self())
            self.spawn(self.refresh())

    async def _crawl_self(self) -> None:
        seeds = self.router.find_neighbors(self.kad_node, k=self.config.alpha)
        if seeds:
            await Lookup(
                self.protocol, self.kad_node, seeds, self.config.ksize, self.config.alpha
            ).find()

    async def _graveyard_loop(self) -> None:
        """Probe a few recently dead peers (and the bootstrap list when alone): heals
        partitions, since after one both sides have declared each other dead."""
        while True:
            await asyncio.sleep(self.config.graveyard_probe_interval_s)
            now = asyncio.get_running_loop().time()
            while self._graveyard:
                _, (_, since) = next(iter(self._graveyard.items()))
                if now - since < self.config.graveyard_ttl_s:
                    break
                self._graveyard.popitem(last=False)
            graves = [(c.address, c.node_id) for c, _ in self._graveyard.values()]
            picks: list[tuple[Address, int | None]] = self.rng.sample(
                graves, min(len(graves), self.config.graveyard_probes)
            )
            if not self.contacts:
                picks += [(addr, None) for addr in self._bootstrap]
            for addr, nid in picks:
                self.spawn(self.ping(addr, nid))

    # -- routing --------------------------------------------------------------------------

    def on_deliver(self, kind: str, handler: Handler) -> None:
        """Handle routed messages of ``kind`` that end at this peer."""
        self._handlers[kind] = handler

    def _self_hop(self, rtt_ms: float | None) -> Hop:
        return Hop(
            self.node_id,
            self.address[0],
            self.address[1],
            self.name,
            rtt_ms,
            float(self.capacity()),
        )

    async def route(
        self, key: int, kind: str, payload: Any = None, *, timeout: float | None = None
    ) -> RouteResult:
        """Route a message to the peer closest to ``key``; its path and handler result."""
        loop = asyncio.get_running_loop()
        msg_id = self.rng.randbytes(8)
        env = Envelope(msg_id, key, kind, payload, self._self_hop(None), ttl=self.config.max_hops)
        fut: asyncio.Future[RouteResult] = loop.create_future()
        self._pending[msg_id] = fut
        try:
            await self._forward(env.with_hop(self._self_hop(None)))
            async with asyncio.timeout(timeout or self.config.route_timeout_s):
                return await fut
        except TimeoutError:
            msg = f"no delivery report for {kind} toward {ids.short(key)}"
            raise RouteError(msg) from None
        finally:
            self._pending.pop(msg_id, None)

    def accept_route(self, env: Envelope, rtt: object) -> list[Any]:
        """A previous hop hands us a message: ack now, forward in the background."""
        if env.msg_id in self._seen_routes:  # a retry whose first ack was lost
            self.count("route_duplicates")
            return self.self_info()
        self._seen_routes[env.msg_id] = None
        if len(self._seen_routes) > 8192:
            self._seen_routes.popitem(last=False)
        rtt_ms = float(rtt) if isinstance(rtt, int | float) else None
        self.spawn(self._forward(env.with_hop(self._self_hop(rtt_ms))))
        return self.self_info()

    async def _forward(self, env: Envelope) -> None:
        loop = asyncio.get_running_loop()
        on_path = {h.node_id for h in env.path}
        misses: Counter[int] = Counter()
        given_up: set[int] = set()
        for _ in range(self.config.route_attempts if env.ttl > 0 else 0):
            hops = next_hops(
                self.node_id,
                env.key,
                self._candidates(),
                exclude=on_path | given_up,
                slack_bits=self.config.proximity_slack_bits,
                exact_within=self._leaf_radius(),
            )
            if not hops:
                break
            nxt = hops[0]
            # one lost datagram is not a dead peer: each candidate gets two tries
            misses[nxt.node_id] += 1
            if misses[nxt.node_id] >= 2:
                given_up.add(nxt.node_id)
            if nxt.rtt_ms is None and await self.ping(nxt.address, nxt.node_id) != nxt.node_id:
                # never measured: a ping first, so the path records a real RTT
                self.count("route_hop_failures")
                self.note_failure(nxt.node_id)
                continue
            t0 = loop.time()
            ok, ack = await self.protocol.call(
                nxt.address,
                "route",
                ids.to_bytes(self.node_id),
                env.wire(),
                nxt.rtt_ms,
                timeout=self.config.route_hop_timeout_s,
                to=nxt.node_id,
            )
            if ok:
                self.count("routes_forwarded")
                nxt.observe_rtt((loop.time() - t0) * 1000)
                with contextlib.suppress(TypeError, ValueError, IndexError):
                    nxt.capacity = float(ack[1])
                return
            self.count("route_hop_failures")
            self.note_failure(nxt.node_id)
        await self._deliver(env)

    def _leaf_radius(self) -> int:
        members = self.leaf_set.members()
        if len(members) < self.leaf_set.size:
            return ids.ID_SPACE  # a small ring: we know everyone
        return members[-1].node_id ^ self.node_id

    def _candidates(self) -> Iterable[Contact]:
        contacts = self.contacts
        for n in self.router.nodes():
            c = contacts.get(n.long_id)
            if c is not None:
                yield c
        for c in self.leaf_set.members():
            if not self.router.contains(make_node(c.node_id)):
                yield c

    async def _deliver(self, env: Envelope) -> None:
        self.count("routes_delivered")
        handler = self._handlers.get(env.kind)
        error: str | None = None
        result: Any = None
        if handler is None:
            error = f"no handler for {env.kind!r} at {self.name or ids.short(self.node_id)}"
        else:
            try:
                result = handler(Delivery(env.key, env.kind, env.payload, env.path))
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                log.exception("route handler for %s failed", env.kind)
                error = f"{type(exc).__name__}: {exc}"
        report = [env.msg_id, ids.to_bytes(env.key), [h.wire() for h in env.path], result, error]
        if env.origin.node_id == self.node_id:
            self.route_done(report)
            return
        for _ in range(3):
            ok, _ = await self.protocol.call(
                (env.origin.host, env.origin.port),
                "route_done",
                ids.to_bytes(self.node_id),
                report,
                to=env.origin.node_id,
            )
            if ok:
                return

    def route_done(self, report: object) -> None:
        if not (isinstance(report, list) and len(report) == 5 and isinstance(report[2], list)):
            msg = "bad route report"
            raise MalformedError(msg)
        msg_id, key, path, result, error = report
        fut = self._pending.get(msg_id) if isinstance(msg_id, bytes) else None
        if fut is None or fut.done():
            return
        if error is not None:
            fut.set_exception(RouteError(str(error)))
            return
        hops = tuple(Hop.from_wire(h) for h in path)
        self.route_hops[max(0, len(hops) - 1)] += 1
        fut.set_result(RouteResult(ids.from_bytes(key), hops, result))
