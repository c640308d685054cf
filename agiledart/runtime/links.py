"""Outgoing frame connections to other peers, one per address, shared by everything.

Control requests (deploy, store, stats) and data (batches, watermarks) to a peer use
the same :class:`~agiledart.overlay.tcp.FrameClient`, so one TCP connection per pair of
peers carries every app's traffic in order. A broken connection is dropped and the next
use reconnects. Credits come back over the connection they were earned on: the stream
handlers registered with :meth:`Links.on_stream` are installed on every client.

A peer closes its links before its task group ends, so a task can still ask for a
connection afterwards, or be connecting then: once closed, the links refuse
(:class:`~agiledart.overlay.errors.PeerUnreachable`) and close what such a task
connected, instead of keeping a connection no one would close.

An emulated control-plane round-trip time (``rtt_s``, the peer's ``--control-rtt-ms``)
is added to every request: peers on one loopback or one docker bridge answer in a
tenth of a millisecond, where edge devices on WiFi or a WAN take tens, and a protocol
that waits on many round trips one after another (a central master deploying one app
at a time) is only fairly compared on the latency it would meet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.errors import PeerUnreachable
from agiledart.overlay.tcp import FrameClient, StreamHandler

__all__ = ["Address", "Links"]

Address = tuple[str, int]


class Links:
    def __init__(
        self, key: ClusterKey, name: str, *, connect_timeout: float = 5.0, rtt_s: float = 0.0
    ) -> None:
        self.key = key
        self.rtt_s = rtt_s  #: emulated round-trip time added to every request
        self.name = name
        self.connect_timeout = connect_timeout
        self._clients: dict[Address, FrameClient] = {}
        self._connecting: dict[Address, asyncio.Lock] = {}
        self._streams: dict[str, StreamHandler] = {}
        self._closed = False

    def on_stream(self, type: str, handler: StreamHandler) -> None:
        self._streams[type] = handler
        for client in self._clients.values():
            client.on_stream(type, handler)

    async def client(self, address: Address) -> FrameClient:
        """The open connection to ``address``, connecting if needed (PeerUnreachable)."""
        client = self._clients.get(address)
        if client is not None and not client.closed:
            return client
        self._refuse_if_closed(address)
        lock = self._connecting.setdefault(address, asyncio.Lock())
        async with lock:
            client = self._clients.get(address)
            if client is not None and not client.closed:
                return client
            if client is not None:
                await client.aclose()
            self._refuse_if_closed(address)
            host, port = address
            client = await FrameClient.connect(
                host, port, key=self.key, name=self.name, timeout=self.connect_timeout
            )
            if self._closed:
                with contextlib.suppress(Exception):
                    await client.aclose()
                self._refuse_if_closed(address)
            for type, handler in self._streams.items():
                client.on_stream(type, handler)
            self._clients[address] = client
            return client

    async def request(
        self,
        address: Address,
        type: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout: float = 10.0,
    ) -> Any:
        if self.rtt_s > 0:
            await asyncio.sleep(self.rtt_s)
        client = await self.client(address)
        return await client.request(type, body, timeout=timeout)

    async def aclose(self) -> None:
        """Close every connection; later requests are refused."""
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()

    def _refuse_if_closed(self, address: Address) -> None:
        if self._closed:
            host, port = address
            msg = f"no connection to {host}:{port}: {self.name}'s links are closed"
            raise PeerUnreachable(msg)
