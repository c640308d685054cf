"""The UDP RPC layer: kademlia's protocol with authentication and a closed RPC set.

``rpcudp`` dispatches any ``rpc_*`` attribute a datagram names, unpacks with a decoder
whose errors escape as exceptions, and fires handlers with ``ensure_future``. This
subclass keeps kademlia's handler names and ``call_*`` helpers (the iterative crawler
uses them) but replaces the wire layer: every datagram is sealed with the cluster key
(``auth.py``), decoded within hard limits (``codec.py``), dispatched only to the names
in :data:`RPCS`, and served as a task owned by the node. Arguments are checked before
use; a peer that sends the wrong shape gets nothing back and is counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from kademlia.protocol import KademliaProtocol

from . import codec
from .auth import ANYONE, MAX_DATAGRAM
from .envelope import Envelope
from .errors import BadMessage, MalformedError
from .ids import ID_BYTES, to_bytes
from .table import Node, OverlayRoutingTable
from .timers import wheel_for

if TYPE_CHECKING:
    from .node import OverlayNode

log = logging.getLogger(__name__)

RPCS = frozenset({"ping", "find_node", "heartbeat", "route", "route_done"})
Address = tuple[str, int]
Reply = tuple[bool, Any]

__all__ = ["RPCS", "OverlayProtocol", "Source", "check_contact", "check_id"]


class Source(NamedTuple):  # a tuple: one per request, made fast
    """Where an authentic request came from, and what it says of itself."""

    address: Address  #: the UDP source address (not authenticated)
    to_us: bool  #: sealed for this peer's id, not for anyone
    port: int  #: the port the sender says (under the MAC) it listens on

    @property
    def vouched(self) -> bool:
        """Sealed for us and sent from the port its sender listens on: a datagram
        replayed to another peer, or from another address, is neither."""
        return self.to_us and self.port == self.address[1]


def check_id(raw: object) -> bytes:
    if not isinstance(raw, bytes) or len(raw) != ID_BYTES:
        msg = "a node id is 20 bytes"
        raise MalformedError(msg)
    return raw


def check_contact(raw: object) -> tuple[bytes, str, int, str]:
    """``[id, host, port, name]`` from the wire, or :class:`MalformedError`."""
    if not isinstance(raw, list | tuple) or len(raw) != 4:
        msg = "a contact is [id, host, port, name]"
        raise MalformedError(msg)
    nid, host, port, name = raw
    if not (isinstance(host, str) and 0 < len(host) <= 255):
        msg = "bad contact host"
        raise MalformedError(msg)
    if not (isinstance(port, int) and 0 < port < 65536):
        msg = "bad contact port"
        raise MalformedError(msg)
    if not (isinstance(name, str) and len(name) <= 64):
        msg = "bad contact name"
        raise MalformedError(msg)
    return check_id(nid), host, port, name


class OverlayProtocol(KademliaProtocol):  # type: ignore[misc]
    def __init__(self, owner: OverlayNode) -> None:
        # KademliaProtocol.__init__ would build an upstream RoutingTable; set fields here.
        self.owner = owner
        self.source_node = owner.kad_node
        self.router = OverlayRoutingTable(owner.kad_node, owner.config.ksize, owner.ping_head)
        self.storage: dict[bytes, bytes] = {}
        self.transport: asyncio.DatagramTransport | None = None
        self._outstanding: dict[bytes, tuple[asyncio.Future[Reply], Address]]
        self._outstanding = {}
        self._wait_timeout = owner.config.rpc_timeout_s

    def __getattr__(self, name: str) -> Any:
        # rpcudp turns every unknown attribute into a remote call; we do not.
        raise AttributeError(name)

    # -- wire -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for fut, _ in self._outstanding.values():
            if not fut.done():
                fut.set_result((False, None))
        self._outstanding.clear()

    def error_received(self, exc: Exception) -> None:
        log.debug("datagram error: %s", exc)

    def datagram_received(self, data: bytes, addr: Address) -> None:
        owner = self.owner
        try:
            opened = owner.auth.open(data)
            msg = codec.decode_rpc(opened.payload, max_len=MAX_DATAGRAM)
        except BadMessage as exc:
            owner.reject(exc, addr)
            return
        if isinstance(msg, codec.Request):
            self._serve(msg, Source(addr, opened.to_us, opened.port))
            return
        pending = self._outstanding.get(msg.msg_id)
        if pending is None or pending[1] != addr or not opened.to_us:
            owner.count("unexpected_responses")
            return
        del self._outstanding[msg.msg_id]
        fut, _ = pending
        if not fut.done():
            fut.set_result((True, msg.result))

    def _serve(self, req: codec.Request, source: Source) -> None:
        """Every handler is synchronous (work that waits is spawned by the node), so a
        request costs no task of its own. The reply is sealed for the requester's id
        (every request's first argument)."""
        addr = source.address
        if req.name not in RPCS:
            self.owner.reject(MalformedError(f"no RPC named {req.name[:32]!r}"), addr)
            return
        handler: Callable[..., Any] = getattr(self, f"rpc_{req.name}")
        try:
            result = handler(source, *req.args)
            requester = check_id(req.args[0])
        except BadMessage as exc:
            self.owner.reject(exc, addr)
            return
        except TypeError:
            self.owner.reject(MalformedError(f"wrong arguments for {req.name}"), addr)
            return
        self._send(codec.encode_response(req.msg_id, result), addr, requester)

    def _send(self, payload: bytes, addr: Address, to: bytes = ANYONE) -> None:
        if self.transport is None:
            return
        try:
            sealed = self.owner.auth.seal(payload, to=to, port=self.owner.address[1])
            self.transport.sendto(sealed, addr)
        except BadMessage as exc:
            log.warning("not sending to %s: %s", addr, exc)

    def call(
        self,
        addr: Address,
        name: str,
        *args: Any,
        timeout: float | None = None,
        to: int | None = None,
    ) -> asyncio.Future[Reply]:
        """Send a request; the future resolves to ``(True, result)`` or ``(False, None)``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Reply] = loop.create_future()
        if self.transport is None:
            fut.set_result((False, None))
            return fut
        msg_id = self.owner.rng.randbytes(codec.MSG_ID_BYTES)
        wait = self._wait_timeout if timeout is None else timeout
        wheel_for(loop).call_later(wait, self._timeout, msg_id)
        self._outstanding[msg_id] = (fut, addr)
        recipient = ANYONE if to is None else to_bytes(to)
        self._send(codec.encode_request(msg_id, name, args), addr, recipient)
        return fut

    def _timeout(self, msg_id: bytes) -> None:
        pending = self._outstanding.pop(msg_id, None)
        if pending is not None and not pending[0].done():
            pending[0].set_result((False, None))

    # -- client side used by kademlia's crawler ----------------------------------------

    async def call_find_node(self, node_to_ask: Node, node_to_find: Node) -> Reply:
        address = (node_to_ask.ip, node_to_ask.port)
        nodeid, key = self.source_node.id, node_to_find.id
        result = await self.find_node(address, nodeid, key, to=node_to_ask.long_id)
        return self.handle_call_response(result, node_to_ask)

    async def find_node(
        self, address: Address, nodeid: bytes, key: bytes, *, to: int | None = None
    ) -> Reply:
        ok, result = await self.call(address, "find_node", nodeid, key, self.owner.name, to=to)
        if not ok:
            return (False, None)
        try:
            contacts = [check_contact(c) for c in result]
        except (BadMessage, TypeError):
            self.owner.reject(MalformedError("bad find_node response"), address)
            return (False, None)
        self.owner.learn([c for c in contacts])
        return (True, [(nid, host, port) for nid, host, port, _ in contacts])

    def handle_call_response(self, result: Reply, node: Node) -> Reply:
        if result[0]:
            self.owner.note_alive(node.long_id, (node.ip, node.port))
        else:
            self.owner.note_failure(node.long_id)
        return result

    def welcome_if_new(self, node: Node) -> None:
        self.owner.note_alive(node.long_id, (node.ip, node.port))

    # -- server side ---------------------------------------------------------------------

    def rpc_ping(self, sender: Source, nodeid: object, name: object = "") -> list[Any]:
        self.owner.heard_from(check_id(nodeid), sender, name)
        return self.owner.self_info()

    def rpc_find_node(
        self, sender: Source, nodeid: object, key: object, name: object = ""
    ) -> list[Any]:
        self.owner.heard_from(check_id(nodeid), sender, name)
        return self.owner.neighbours_of(check_id(key))

    def rpc_heartbeat(
        self,
        sender: Source,
        nodeid: object,
        capacity: object,
        exchange: object = True,
        name: object = "",
    ) -> list[Any]:
        contact = self.owner.heard_from(check_id(nodeid), sender, name)
        if isinstance(capacity, float | int) and contact is not None:
            contact.capacity = float(capacity)
        raw = check_id(nodeid)
        near = self.owner.neighbours_of(raw, k=self.owner.config.leaf_set_size) if exchange else []
        return [*self.owner.self_info(), near]

    def rpc_route(self, sender: Source, nodeid: object, env: object, rtt: object) -> list[Any]:
        raw = check_id(nodeid)
        envelope = Envelope.from_wire(env)  # validated before anything is acted upon
        self.owner.heard_from(raw, sender, None)
        return self.owner.routing.accept_route(envelope, rtt)

    def rpc_route_done(self, sender: Source, nodeid: object, report: object) -> bool:
        raw = check_id(nodeid)
        self.owner.routing.route_done(report)
        self.owner.heard_from(raw, sender, None)
        return True
