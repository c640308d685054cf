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
from typing import TYPE_CHECKING, Any

from kademlia.protocol import KademliaProtocol

from . import codec
from .auth import MAX_DATAGRAM
from .envelope import Envelope
from .errors import BadMessage, MalformedError
from .ids import ID_BYTES
from .table import Node, OverlayRoutingTable
from .timers import wheel_for

if TYPE_CHECKING:
    from .node import OverlayNode

log = logging.getLogger(__name__)

RPCS = frozenset({"ping", "find_node", "heartbeat", "route", "route_done"})
Address = tuple[str, int]
Reply = tuple[bool, Any]

__all__ = ["RPCS", "OverlayProtocol", "check_contact", "check_id"]


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
            msg = codec.decode_rpc(owner.auth.open(data), max_len=MAX_DATAGRAM)
        except BadMessage as exc:
            owner.reject(exc, addr)
            return
        if isinstance(msg, codec.Request):
            self._serve(msg, addr)
            return
        pending = self._outstanding.get(msg.msg_id)
        if pending is None or pending[1] != addr:
            owner.count("unexpected_responses")
            return
        del self._outstanding[msg.msg_id]
        fut, _ = pending
        if not fut.done():
            fut.set_result((True, msg.result))

    def _serve(self, req: codec.Request, addr: Address) -> None:
        """Every handler is synchronous (work that waits is spawned by the node), so a
        request costs no task of its own."""
        if req.name not in RPCS:
            self.owner.reject(MalformedError(f"no RPC named {req.name[:32]!r}"), addr)
            return
        handler: Callable[..., Any] = getattr(self, f"rpc_{req.name}")
        try:
            result = handler(addr, *req.args)
        except BadMessage as exc:
            self.owner.reject(exc, addr)
            return
        except TypeError:
            self.owner.reject(MalformedError(f"wrong arguments for {req.name}"), addr)
            return
        self._send(codec.encode_response(req.msg_id, result), addr)

    def _send(self, payload: bytes, addr: Address) -> None:
        if self.transport is None:
            return
        try:
            self.transport.sendto(self.owner.auth.seal(payload), addr)
        except BadMessage as exc:
            log.warning("not sending to %s: %s", addr, exc)

    def call(
        self, addr: Address, name: str, *args: Any, timeout: float | None = None
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
        self._send(codec.encode_request(msg_id, name, args), addr)
        return fut

    def _timeout(self, msg_id: bytes) -> None:
        pending = self._outstanding.pop(msg_id, None)
        if pending is not None and not pending[0].done():
            pending[0].set_result((False, None))

    # -- client side used by kademlia's crawler ----------------------------------------

    async def find_node(self, address: Address, nodeid: bytes, key: bytes) -> Reply:
        ok, result = await self.call(address, "find_node", nodeid, key, self.owner.name)
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

    def rpc_ping(self, sender: Address, nodeid: object, name: object = "") -> list[Any]:
        self.owner.heard_from(check_id(nodeid), sender, name)
        return self.owner.self_info()

    def rpc_find_node(
        self, sender: Address, nodeid: object, key: object, name: object = ""
    ) -> list[Any]:
        self.owner.heard_from(check_id(nodeid), sender, name)
        return self.owner.neighbours_of(check_id(key))

    def rpc_heartbeat(
        self,
        sender: Address,
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

    def rpc_route(self, sender: Address, nodeid: object, env: object, rtt: object) -> list[Any]:
        raw = check_id(nodeid)
        envelope = Envelope.from_wire(env)  # validated before anything is acted upon
        self.owner.heard_from(raw, sender, None)
        return self.owner.accept_route(envelope, rtt)

    def rpc_route_done(self, sender: Address, nodeid: object, report: object) -> bool:
        raw = check_id(nodeid)
        self.owner.route_done(report)
        self.owner.heard_from(raw, sender, None)
        return True
