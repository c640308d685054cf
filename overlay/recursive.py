"""Recursive key-based routing for one overlay node (paper §IV-B).

Theory of operation: a message for key K goes hop by hop. Each hop acks the message at
once (:meth:`RecursiveRouting.accept_route`), appends itself to its path and forwards
it to the next hop that ``routing.next_hops`` picks among the contacts strictly closer
to K; a hop that does not ack in time is tried once more and then skipped (one lost
datagram is not a dead peer). The peer closest to K calls the handler registered for
the message's kind (:meth:`~RecursiveRouting.on_deliver`) and reports the recorded
path, and the handler's result, to the origin (``route_done``), whose
:meth:`~RecursiveRouting.route` call returns it. The node
(:class:`~.node.OverlayNode`) gives this its contacts, its RPCs and its task group.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import ids
from .envelope import Envelope, Hop, RouteResult
from .errors import MalformedError, RouteError
from .routing import Contact, next_hops
from .table import make_node

if TYPE_CHECKING:
    from .node import OverlayNode

#: the node's logger: routing logs under the name it had before the split
log = logging.getLogger(__name__.rpartition(".")[0] + ".node")

Handler = Callable[["Delivery"], Any]

__all__ = ["Delivery", "Handler", "RecursiveRouting"]

#: message ids remembered to recognise a retried hop (its first ack was lost)
SEEN_ROUTES = 8192


@dataclass(frozen=True, slots=True)
class Delivery:
    """A routed message at the peer closest to its key."""

    key: int
    kind: str
    payload: Any
    path: tuple[Hop, ...]


class RecursiveRouting:
    """The routes one node originates, forwards and delivers."""

    def __init__(self, node: OverlayNode) -> None:
        self.node = node
        #: forwarding steps of the routes this peer originated, by count (metrics)
        self.route_hops: Counter[int] = Counter()
        self._handlers: dict[str, Handler] = {}
        self._pending: dict[bytes, asyncio.Future[RouteResult]] = {}
        self._seen_routes: OrderedDict[bytes, None] = OrderedDict()

    def fail_pending(self) -> None:
        """The node is closing: every route still waiting for its report fails."""
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RouteError("the overlay node is closing"))
        self._pending.clear()

    def on_deliver(self, kind: str, handler: Handler) -> None:
        """Handle routed messages of ``kind`` that end at this peer."""
        self._handlers[kind] = handler

    def _self_hop(self, rtt_ms: float | None) -> Hop:
        node = self.node
        return Hop(
            node.node_id,
            node.address[0],
            node.address[1],
            node.name,
            rtt_ms,
            float(node.capacity()),
        )

    async def route(
        self, key: int, kind: str, payload: Any = None, *, timeout: float | None = None
    ) -> RouteResult:
        """Route a message to the peer closest to ``key``; its path and handler result."""
        node = self.node
        loop = asyncio.get_running_loop()
        msg_id = node.rng.randbytes(8)
        env = Envelope(msg_id, key, kind, payload, self._self_hop(None), ttl=node.config.max_hops)
        fut: asyncio.Future[RouteResult] = loop.create_future()
        self._pending[msg_id] = fut
        try:
            await self._forward(env.with_hop(self._self_hop(None)))
            async with asyncio.timeout(timeout or node.config.route_timeout_s):
                return await fut
        except TimeoutError:
            msg = f"no delivery report for {kind} toward {ids.short(key)}"
            raise RouteError(msg) from None
        finally:
            self._pending.pop(msg_id, None)

    def accept_route(self, env: Envelope, rtt: object) -> list[Any]:
        """A previous hop hands us a message: ack now, forward in the background."""
        node = self.node
        if env.msg_id in self._seen_routes:  # a retry whose first ack was lost
            node.count("route_duplicates")
            return node.self_info()
        self._seen_routes[env.msg_id] = None
        if len(self._seen_routes) > SEEN_ROUTES:
            self._seen_routes.popitem(last=False)
        rtt_ms = float(rtt) if isinstance(rtt, int | float) else None
        node.spawn(self._forward(env.with_hop(self._self_hop(rtt_ms))))
        return node.self_info()

    async def _forward(self, env: Envelope) -> None:
        node = self.node
        loop = asyncio.get_running_loop()
        on_path = {h.node_id for h in env.path}
        misses: Counter[int] = Counter()
        given_up: set[int] = set()
        for _ in range(node.config.route_attempts if env.ttl > 0 else 0):
            hops = next_hops(
                node.node_id,
                env.key,
                self._candidates(),
                exclude=on_path | given_up,
                slack_bits=node.config.proximity_slack_bits,
                exact_within=self._leaf_radius(),
            )
            if not hops:
                break
            nxt = hops[0]
            # one lost datagram is not a dead peer: each candidate gets two tries
            misses[nxt.node_id] += 1
            if misses[nxt.node_id] >= 2:
                given_up.add(nxt.node_id)
            if nxt.rtt_ms is None and await node.ping(nxt.address, nxt.node_id) != nxt.node_id:
                # never measured: a ping first, so the path records a real RTT
                node.count("route_hop_failures")
                node.note_failure(nxt.node_id)
                continue
            t0 = loop.time()
            ok, ack = await node.protocol.call(
                nxt.address,
                "route",
                ids.to_bytes(node.node_id),
                env.wire(),
                nxt.rtt_ms,
                timeout=node.config.route_hop_timeout_s,
                to=nxt.node_id,
            )
            if ok:
                node.count("routes_forwarded")
                nxt.observe_rtt((loop.time() - t0) * 1000)
                with contextlib.suppress(TypeError, ValueError, IndexError):
                    nxt.capacity = float(ack[1])
                return
            node.count("route_hop_failures")
            node.note_failure(nxt.node_id)
        await self._deliver(env)

    def _leaf_radius(self) -> int:
        node = self.node
        members = node.leaf_set.members()
        if len(members) < node.leaf_set.size:
            return ids.ID_SPACE  # a small ring: we know everyone
        return members[-1].node_id ^ node.node_id

    def _candidates(self) -> Iterable[Contact]:
        node = self.node
        contacts = node.contacts
        for n in node.router.nodes():
            c = contacts.get(n.long_id)
            if c is not None:
                yield c
        for c in node.leaf_set.members():
            if not node.router.contains(make_node(c.node_id)):
                yield c

    async def _deliver(self, env: Envelope) -> None:
        node = self.node
        node.count("routes_delivered")
        handler = self._handlers.get(env.kind)
        error: str | None = None
        result: Any = None
        if handler is None:
            error = f"no handler for {env.kind!r} at {node.name or ids.short(node.node_id)}"
        else:
            try:
                result = handler(Delivery(env.key, env.kind, env.payload, env.path))
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                log.exception("route handler for %s failed", env.kind)
                error = f"{type(exc).__name__}: {exc}"
        report = [env.msg_id, ids.to_bytes(env.key), [h.wire() for h in env.path], result, error]
        if env.origin.node_id == node.node_id:
            self.route_done(report)
            return
        for _ in range(3):
            ok, _ = await node.protocol.call(
                (env.origin.host, env.origin.port),
                "route_done",
                ids.to_bytes(node.node_id),
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
