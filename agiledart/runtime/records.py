"""The records store: small values (app records, code, peer names) kept in the DHT.

Theory of operation
-------------------
A record lives under a 160-bit key (:func:`record_key`, SHA-1 of a namespaced name) on
the peer whose id is closest to the key, its *owner*, and on the ``replicas`` leaf-set
peers of the owner closest to the key. Every access first routes a ``kv`` probe toward
the key with the overlay's recursive routing: the peer it is delivered to is the owner
(the path's last hop). Values then travel over TCP frames, so they may be far larger
than a datagram.

* ``put`` sends the value with a version (``time.time_ns()`` of the writer) to the
  owner, which keeps it if newer than what it has and copies it to its replicas.
  Last writer wins; each record has a single writer in practice (an app's scheduler).
* ``add`` adds members to a set-valued record at the owner (the apps index), merged
  the same way at the replicas.
* ``get`` asks the owner; an owner without the record (it joined after the record was
  written, or took over from a dead owner) asks its leaf-set peers closest to the key,
  keeps what they have, and answers.

Local storage is bounded (:class:`LocalRecords`): a value is at most ``max_value``
bytes and the store at most ``max_bytes``; beyond that the oldest records are evicted.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgpack

from agiledart.overlay import ids
from agiledart.overlay.errors import OverlayError
from agiledart.overlay.node import Delivery, OverlayNode
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.runtime.errors import StoreError
from agiledart.runtime.links import Address, Links

log = logging.getLogger(__name__)

__all__ = ["LocalRecords", "Records", "record_key"]

_KEY_RE = re.compile(f"[0-9a-fA-F]{{{2 * ids.ID_BYTES}}}")


def record_key(namespace: str, name: str) -> int:
    """The DHT key of record ``name`` in ``namespace`` (``app``, ``code``, ``peer``...)."""
    return ids.key_for(f"{namespace}:{name}")


class LocalRecords:
    """This peer's share of the records: ``key -> (version, value)``, bounded."""

    def __init__(self, *, max_value: int = 8 << 20, max_bytes: int = 64 << 20) -> None:
        self.max_value = max_value
        self.max_bytes = max_bytes
        self._items: OrderedDict[int, tuple[int, Any, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        """Encoded size of everything held."""
        return self._bytes

    def get(self, key: int) -> tuple[int, Any] | None:
        item = self._items.get(key)
        return None if item is None else (item[0], item[1])

    def put(self, key: int, version: int, value: Any) -> bool:
        """Keep ``value`` if it is newer than what is stored; whether it was kept."""
        old = self._items.get(key)
        if old is not None and old[0] >= version:
            return False
        size = len(msgpack.packb(value, use_bin_type=True))
        if size > self.max_value:
            msg = f"record of {size} bytes exceeds the limit of {self.max_value}"
            raise StoreError(msg)
        if old is not None:
            self._bytes -= old[2]
            del self._items[key]
        self._items[key] = (version, value, size)
        self._bytes += size
        while self._bytes > self.max_bytes and len(self._items) > 1:
            _, (_, _, evicted) = self._items.popitem(last=False)
            self._bytes -= evicted
        return True

    def add(self, key: int, version: int, members: list[Any]) -> list[Any]:
        """Merge ``members`` into the set-valued record at ``key``; the new members."""
        old = self.get(key)
        current = list(old[1]) if old is not None and isinstance(old[1], list) else []
        merged = current + [m for m in members if m not in current]
        self.put(key, max(version, (old[0] + 1) if old else version), merged)
        return merged


class Records:
    """Records in the DHT, through this peer's overlay node and links."""

    def __init__(
        self,
        overlay: OverlayNode,
        links: Links,
        *,
        replicas: int = 2,
        timeout: float = 5.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.overlay = overlay
        self.links = links
        self.local = LocalRecords()
        self.replicas = replicas
        self.timeout = timeout
        self.clock = clock
        overlay.on_deliver("kv", _owner)

    # -- client side ------------------------------------------------------------------

    async def owner(self, key: int) -> Address | None:
        """The address of the key's owner; None when it is this peer."""
        result = await self.overlay.route(key, "kv", None)
        last = result.path[-1]
        if last.node_id == self.overlay.node_id:
            return None
        return (last.host, last.port)

    async def put(self, key: int, value: Any) -> None:
        await self._call(key, "kv_put", {"v": self.clock(), "value": value})

    async def add(self, key: int, *members: Any) -> None:
        await self._call(key, "kv_add", {"v": self.clock(), "members": list(members)})

    async def get(self, key: int) -> Any:
        """The value under ``key``, or None if no peer has it."""
        reply = await self._call(key, "kv_get", {})
        return None if reply is None else reply[1]

    async def _call(self, key: int, type: str, body: dict[str, Any]) -> Any:
        request = {"k": f"{key:040x}", "replicate": True, **body}
        try:
            address = await self.owner(key)
            if address is None:
                return await self.serve(type, request)
            return await self.links.request(address, type, request, timeout=self.timeout)
        except OverlayError as exc:
            msg = f"records store: {type[3:]} of {ids.short(key)} failed: {exc}"
            raise StoreError(msg) from exc

    # -- owner side -------------------------------------------------------------------

    def handlers(self) -> dict[str, Callable[[dict[str, Any], ConnectionInfo], Any]]:
        """Frame request handlers to install on this peer's server."""

        def handler(type: str) -> Callable[[dict[str, Any], ConnectionInfo], Any]:
            async def serve(request: dict[str, Any], conn: ConnectionInfo) -> Any:
                return await self.serve(type, request)

            return serve

        return {t: handler(t) for t in ("kv_put", "kv_add", "kv_get")}

    async def serve(self, type: str, request: dict[str, Any]) -> Any:
        key = _parse_key(request.get("k"))
        version = request.get("v", 0)
        if not isinstance(version, int):
            msg = "record version must be an integer"
            raise StoreError(msg)
        replicate = request.get("replicate") is True
        if type == "kv_put":
            if self.local.put(key, version, request.get("value")) and replicate:
                await self._replicate(key, "kv_put", request)
            return True
        if type == "kv_add":
            members = request.get("members")
            if not isinstance(members, list):
                msg = "kv_add needs a list of members"
                raise StoreError(msg)
            self.local.add(key, version, members)
            if replicate:
                await self._replicate(key, "kv_add", request)
            return True
        if type == "kv_get":
            found = self.local.get(key)
            if found is None and replicate:
                found = await self._search(key)
            return None if found is None else list(found)
        msg = f"unknown records operation {type!r}"
        raise StoreError(msg)

    def _replica_addresses(self, key: int) -> list[Address]:
        members = sorted(self.overlay.leaf_set.members(), key=lambda c: c.node_id ^ key)
        return [(c.host, c.port) for c in members[: self.replicas]]

    async def _replicate(self, key: int, type: str, request: dict[str, Any]) -> None:
        copy = {k: v for k, v in request.items() if k in ("k", "v", "value", "members")}
        await asyncio.gather(
            *(self._quiet(a, type, copy) for a in self._replica_addresses(key)),
        )

    async def _search(self, key: int) -> tuple[int, Any] | None:
        answers = await asyncio.gather(
            *(self._quiet(a, "kv_get", {"k": f"{key:040x}"}) for a in self._replica_addresses(key))
        )
        best: tuple[int, Any] | None = None
        for a in answers:
            fresh = isinstance(a, list) and len(a) == 2 and isinstance(a[0], int)
            if fresh and (best is None or a[0] > best[0]):
                best = (a[0], a[1])
        if best is not None:
            self.local.put(key, best[0], best[1])
        return best

    async def _quiet(self, address: Address, type: str, body: dict[str, Any]) -> Any:
        try:
            return await self.links.request(address, type, body, timeout=self.timeout)
        except OverlayError as exc:
            log.debug("records: %s to %s failed: %s", type, address, exc)
            return None


def _parse_key(raw: Any) -> int:
    if isinstance(raw, str) and _KEY_RE.fullmatch(raw):
        return int(raw, 16)
    msg = f"record key must be {2 * ids.ID_BYTES} hex digits, got {raw!r}"
    raise StoreError(msg)


def _owner(delivery: Delivery) -> bool:
    return True
