"""The records store: small values (app records, code, peer names) kept in the DHT.

Theory of operation
-------------------
A record lives under a 160-bit key (:func:`record_key`, SHA-1 of a namespaced name) on
its *holders*: the ``replicas + 1`` live peers closest to the key, the closest being its
*owner* (:mod:`agiledart.runtime.holders`). Every access first routes a ``kv`` probe
toward the key with the overlay's recursive routing: the peer it is delivered to is the
owner (the path's last hop). Values then travel over TCP frames, so they may be far
larger than a datagram.

* ``put`` sends the value with a version from the writer's hybrid logical clock to the
  owner, which keeps it if its stamp (version, then value digest) is newer than what it
  has and copies it to the other holders. The answer is the truth: whether the value is
  what the owner now holds, and the version it holds (the writer's clock moves past it).
* ``add`` adds members to a set-valued record at the owner (the apps index); copies of
  a set merge as unions wherever they meet, so no member is lost to a race.
* ``get`` asks the owner; an owner without the record asks the other holders, keeps
  what they have, and answers. When the owner cannot be reached or has nothing, the
  reader asks the holders it knows itself.

The ring changes under the records, so every peer keeps handing its share on
(:class:`~agiledart.runtime.holders.Upkeep`): to a peer that joins near a key
(store-on-join), to the next-closest peer when a holder dies (re-replication), and to
all holders every ``republish_s`` (jittered), offering versions first so that only
values a holder lacks travel, paced to ``upkeep_bytes_per_s``.

Local storage is bounded (:class:`LocalRecords`): a value is at most ``max_value``
bytes and the store at most ``max_bytes``; beyond that the oldest records are evicted.
With a state directory, the share is kept on disk too
(:mod:`~agiledart.runtime.recordfiles`), written before a write is acknowledged and
reloaded when the peer starts.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agiledart.errors import AgiledartError
from agiledart.overlay import ids
from agiledart.overlay.errors import OverlayError
from agiledart.overlay.leafset import Membership, MembershipEvent
from agiledart.overlay.node import Delivery, OverlayNode
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.runtime.errors import StoreError
from agiledart.runtime.holders import HybridClock, Upkeep, digest_of, holders
from agiledart.runtime.links import Address, Links
from agiledart.runtime.localrecords import LocalRecords
from agiledart.runtime.recordfiles import RecordFiles

log = logging.getLogger(__name__)

__all__ = ["LocalRecords", "Records", "record_key"]

_KEY_RE = re.compile(f"[0-9a-fA-F]{{{2 * ids.ID_BYTES}}}")
_OFFER_BATCH = 256  #: (key, stamp) pairs per offer frame, at most


def record_key(namespace: str, name: str) -> int:
    """The DHT key of record ``name`` in ``namespace`` (``app``, ``code``, ``peer``...)."""
    return ids.key_for(f"{namespace}:{name}")


class Records:
    """Records in the DHT, through this peer's overlay node and links."""

    def __init__(
        self,
        overlay: OverlayNode,
        links: Links,
        *,
        replicas: int = 5,
        timeout: float = 5.0,
        clock: Callable[[], int] = time.time_ns,
        state_dir: Path | None = None,
        republish_s: float = 60.0,
        settle_s: float = 0.5,
        retry_s: float = 5.0,
        upkeep_bytes_per_s: float = 2e6,
        rng: random.Random | None = None,
    ) -> None:
        self.overlay = overlay
        self.links = links
        self.local = LocalRecords()
        self.files = None if state_dir is None else RecordFiles(state_dir / "records")
        self.replicas = replicas
        self.timeout = timeout
        self.clock = HybridClock(clock)
        self.upkeep = Upkeep(overlay.node_id, replicas + 1)
        self.republish_s = republish_s
        self.settle_s = settle_s
        self.retry_s = retry_s
        self.upkeep_bytes_per_s = upkeep_bytes_per_s
        self.rng = rng or random.Random()
        #: what upkeep did: offers made, values pushed, records handed to owners
        self.stats: dict[str, int] = {"offered": 0, "pushed": 0, "handed": 0, "disk_errors": 0}
        self._changed = asyncio.Event()
        self._disk = asyncio.Lock()
        self._paced_until = 0.0  #: when the upkeep pushes so far have had their time
        overlay.on_deliver("kv", _owner)
        overlay.subscribe(self._membership)

    @property
    def copies(self) -> int:
        return self.replicas + 1

    def load(self) -> int:
        """Reload this peer's share from its state directory; how many records."""
        if self.files is None:
            return 0
        found = sorted(self.files.load(), key=lambda r: r[1])  # oldest first: evicted first
        for key, version, merge, value in found:
            try:
                self.local.put(key, version, value, merge=merge)
            except StoreError as exc:
                log.warning("records: not reloading %s: %s", ids.short(key), exc)
            self.clock.observe(version)
        self.local.dirty -= {k for k, *_ in found if k in self.local}
        if found:
            log.info("records: reloaded %d records from %s", len(self.local), self.files.root)
        return len(self.local)

    # -- client side ------------------------------------------------------------------

    async def owner(self, key: int) -> tuple[int, Address] | None:
        """The key's owner (id, address); None when it is this peer."""
        result = await self.overlay.route(key, "kv", None)
        last = result.path[-1]
        if last.node_id == self.overlay.node_id:
            return None
        return last.node_id, (last.host, last.port)

    async def put(self, key: int, value: Any) -> bool:
        """Write ``value``; whether it is what the owner holds now (False: a newer write
        is there, whose version this peer's clock has now passed)."""
        reply = await self._call(key, "kv_put", {"v": self.clock.now(), "value": value})
        return self._kept(reply)

    async def add(self, key: int, *members: Any) -> None:
        await self._call(key, "kv_add", {"v": self.clock.now(), "members": list(members)})

    async def get(self, key: int) -> Any:
        """The value under ``key``, or None if no peer has it."""
        try:
            reply = await self._call(key, "kv_get", {})
        except StoreError as exc:
            found = await self._ask_holders(key)
            if found is None:
                raise
            log.debug("records: read %s from a holder: %s", ids.short(key), exc)
            return found[1]
        if reply is None:
            found = await self._ask_holders(key)
            return None if found is None else found[1]
        return reply[1]

    def _kept(self, reply: Any) -> bool:
        if reply is True:  # a peer from before versions were answered
            return True
        if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], int):
            self.clock.observe(reply[1])
            return reply[0] is True
        msg = f"records store: a put was answered with {reply!r}"
        raise StoreError(msg)

    async def _call(self, key: int, type: str, body: dict[str, Any]) -> Any:
        request = {"k": f"{key:040x}", "replicate": True, **body}
        try:
            owner = await self.owner(key)
            if owner is None:
                return await self.serve(type, request)
            return await self.links.request(owner[1], type, request, timeout=self.timeout)
        except AgiledartError as exc:
            msg = f"records store: {type[3:]} of {ids.short(key)} failed: {exc}"
            raise StoreError(msg) from exc

    async def _ask_holders(self, key: int) -> tuple[int, Any] | None:
        """Ask the holders of ``key`` this peer knows directly (the owner was no help)."""
        return await self._search(key, self._holder_contacts(key))

    # -- owner side -------------------------------------------------------------------

    def handlers(self) -> dict[str, Callable[[dict[str, Any], ConnectionInfo], Any]]:
        """Frame request handlers to install on this peer's server."""

        def handler(type: str) -> Callable[[dict[str, Any], ConnectionInfo], Any]:
            async def serve(request: dict[str, Any], conn: ConnectionInfo) -> Any:
                return await self.serve(type, request)

            return serve

        return {t: handler(t) for t in ("kv_put", "kv_add", "kv_get", "kv_offer")}

    async def serve(self, type: str, request: dict[str, Any]) -> Any:
        if type == "kv_offer":
            return self._wanted(request.get("items"))
        key = _parse_key(request.get("k"))
        version = request.get("v", 0)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            msg = "record version must be a non-negative integer"
            raise StoreError(msg)
        replicate = request.get("replicate") is True
        if type == "kv_put":
            value = request.get("value")
            changed = self.local.put(key, version, value)
            await self._persist()
            item = self.local.item(key)
            assert item is not None
            self.clock.observe(item.version)
            if changed and replicate:
                await self._replicate(key)
            return [item.stamp == (version, digest_of(value)), item.version]
        if type == "kv_add":
            members = request.get("members")
            if not isinstance(members, list):
                msg = "kv_add needs a list of members"
                raise StoreError(msg)
            before = self.local.stamp(key)
            self.local.add(key, version, members)
            await self._persist()
            if replicate and self.local.stamp(key) != before:
                await self._replicate(key)
            return True
        if type == "kv_get":
            item = self.local.item(key)
            if item is not None:  # only a set has a third element: a plain record reads as before
                return (
                    [item.version, item.value, True] if item.merge else [item.version, item.value]
                )
            found = await self._search(key, self._holder_contacts(key)) if replicate else None
            return None if found is None else list(found)
        msg = f"unknown records operation {type!r}"
        raise StoreError(msg)

    def _wanted(self, raw: Any) -> list[str]:
        """The offered keys whose values this peer lacks or holds older."""
        if not isinstance(raw, list) or len(raw) > _OFFER_BATCH:
            msg = f"kv_offer needs a list of at most {_OFFER_BATCH} [key, version, digest, merge]"
            raise StoreError(msg)
        wanted = []
        for entry in raw:
            if not (isinstance(entry, list) and len(entry) == 4):
                msg = "kv_offer items are [key, version, digest, merge]"
                raise StoreError(msg)
            hex_key, version, digest, merge = entry
            key = _parse_key(hex_key)
            if not isinstance(version, int) or not isinstance(digest, bytes):
                msg = "kv_offer items are [key, version, digest, merge]"
                raise StoreError(msg)
            mine = self.local.item(key)
            if mine is None:
                wanted.append(hex_key)
            elif merge is True or mine.merge:
                if mine.digest != digest:
                    wanted.append(hex_key)
            elif mine.stamp < (version, digest):
                wanted.append(hex_key)
        return wanted

    def _live_peers(self, *, suspects: bool = False) -> dict[int, Address]:
        """Contacts that answer; with ``suspects``, also those that missed an answer
        (not declared dead: still holders until they are, or a holder would be missed)."""
        return {
            c.node_id: (c.host, c.port)
            for c in self.overlay.known_peers()
            if suspects or c.failures == 0
        }

    def _holder_contacts(self, key: int) -> list[tuple[int, Address]]:
        """The other holders of ``key`` as this peer sees them."""
        peers = self._live_peers()
        me = self.overlay.node_id
        return [(p, peers[p]) for p in holders(key, me, peers, self.copies) if p != me]

    async def _replicate(self, key: int) -> None:
        targets = self._holder_contacts(key)
        await asyncio.gather(*(self._push(p, a, key, replicate=False) for p, a in targets))

    async def _search(self, key: int, targets: list[tuple[int, Address]]) -> tuple[int, Any] | None:
        answers = await asyncio.gather(
            *(self._quiet(a, "kv_get", {"k": f"{key:040x}"}) for _, a in targets)
        )
        best: tuple[int, Any] | None = None
        merge = False
        for a in answers:
            fresh = isinstance(a, list) and len(a) in (2, 3) and isinstance(a[0], int)
            if fresh and (best is None or a[0] > best[0]):
                best, merge = (a[0], a[1]), len(a) == 3 and a[2] is True
        if best is not None:
            try:
                self.local.put(key, best[0], best[1], merge=merge)
            except StoreError as exc:  # a holder's value over our limit: answer it anyway
                log.debug("records: not keeping %s: %s", ids.short(key), exc)
            await self._persist()
        return best

    async def _quiet(self, address: Address, type: str, body: dict[str, Any]) -> Any:
        try:
            return await self.links.request(address, type, body, timeout=self.timeout)
        except AgiledartError as exc:
            log.debug("records: %s to %s failed: %s", type, address, exc)
            return None

    async def _persist(self) -> None:
        """Write what changed to the state directory before answering its writer."""
        if self.files is None:
            self.local.dirty.clear()
            return
        async with self._disk:
            writes, deletes = self.local.drain()
            if not writes and not deletes:
                return
            try:
                await asyncio.to_thread(self.files.apply, writes, deletes)
            except OSError as exc:
                self.stats["disk_errors"] += 1
                log.warning("records: could not write to %s: %s", self.files.root, exc)

    # -- upkeep: store-on-join, re-replication, republish ------------------------------

    def _membership(self, event: MembershipEvent) -> None:
        if event.kind is not Membership.JOINED:
            self.upkeep.forget_peer(event.contact.node_id)
        self._changed.set()

    async def upkeep_loop(self, joined: asyncio.Event) -> None:
        """Hand records on as the ring changes, and republish them all now and then;
        a round that a holder did not answer is followed by another one soon."""
        await joined.wait()
        loop = asyncio.get_running_loop()
        next_full = loop.time() + self.settle_s  # first: offer what was reloaded
        retry_at: float | None = None
        while True:
            wake = next_full if retry_at is None else min(next_full, retry_at)
            try:
                async with asyncio.timeout(max(0.0, wake - loop.time())):
                    await self._changed.wait()
            except TimeoutError:
                pass
            await asyncio.sleep(self.settle_s)  # let a burst of joins or deaths settle
            self._changed.clear()
            full = loop.time() >= next_full
            if full:
                next_full = loop.time() + self.republish_s * (0.8 + 0.4 * self.rng.random())
            try:
                done = await self.upkeep_round(full=full)
            except (AgiledartError, OSError) as exc:
                log.warning("records: upkeep round failed: %s", exc)
                done = False
            retry_at = None if done else loop.time() + self.retry_s * (0.5 + self.rng.random())

    async def upkeep_round(self, *, full: bool) -> bool:
        """One round: offer records to the holders that lack them, and hand records
        this peer holds by no right to their owners; whether every holder answered."""
        peers = self._live_peers(suspects=True)
        plan = self.upkeep.plan(self.local.stamps(), peers, full=full)
        answered = await asyncio.gather(
            *(self._offer(p, peers[p], keys, replicate=False) for p, keys in plan.offers.items())
        )
        handed = [await self._hand_to_owner(key) for key in plan.to_owner]
        return all(answered) and all(handed)

    async def _hand_to_owner(self, key: int) -> bool:
        """Offer a record held by no right to its owner; whether the owner has it."""
        stamp = self.local.stamp(key)
        if stamp is None:
            return True
        try:
            owner = await self.owner(key)
        except OverlayError as exc:
            log.debug("records: no route to the owner of %s: %s", ids.short(key), exc)
            return False
        if owner is None:  # routing says this peer is the owner after all
            await self._offer_all(key)
            self.upkeep.hand(key, stamp)
            return True
        if not await self._offer(owner[0], owner[1], [key], replicate=True):
            return False
        self.upkeep.hand(key, stamp)
        self.stats["handed"] += 1
        return True

    async def _offer_all(self, key: int) -> None:
        await asyncio.gather(
            *(self._offer(p, a, [key], replicate=False) for p, a in self._holder_contacts(key))
        )

    async def _offer(
        self, peer: int, address: Address, keys: list[int], *, replicate: bool
    ) -> bool:
        """Offer ``keys`` to ``peer`` and push the values it wants; whether all went."""
        ok = True
        for i in range(0, len(keys), _OFFER_BATCH):
            batch = [k for k in keys[i : i + _OFFER_BATCH] if k in self.local]
            entries = []
            for k in batch:
                item = self.local.item(k)
                assert item is not None
                entries.append([f"{k:040x}", item.version, item.digest, item.merge])
            self.stats["offered"] += len(entries)
            wanted = await self._quiet(address, "kv_offer", {"items": entries})
            if not isinstance(wanted, list):
                # a contact that does not answer is dropped after a few misses, as a
                # Kademlia contact is, so that the next closest peer becomes a holder
                self.overlay.note_failure(peer)
                return False
            want = {w for w in wanted if isinstance(w, str)}
            for k in batch:
                if f"{k:040x}" in want:
                    pushed = await self._push(peer, address, k, replicate=replicate, pace=True)
                    ok = pushed and ok
                else:
                    stamp = self.local.stamp(k)
                    if stamp is not None:
                        self.upkeep.confirm(peer, k, stamp)
        return ok

    async def _push(
        self, peer: int, address: Address, key: int, *, replicate: bool, pace: bool = False
    ) -> bool:
        item = self.local.item(key)
        if item is None:
            return True
        body: dict[str, Any] = {"k": f"{key:040x}", "v": item.version, "replicate": replicate}
        if item.merge:
            body["members"] = list(item.value)
        else:
            body["value"] = item.value
        reply = await self._quiet(address, "kv_add" if item.merge else "kv_put", body)
        if reply is None:
            return False
        self.upkeep.confirm(peer, key, item.stamp)
        if pace:
            self.stats["pushed"] += 1
            await self._pace(item.size)
        return True

    async def _pace(self, size: int) -> None:
        """Keep upkeep pushes, all together, under ``upkeep_bytes_per_s``."""
        if self.upkeep_bytes_per_s <= 0:
            return
        now = asyncio.get_running_loop().time()
        self._paced_until = max(now, self._paced_until) + size / self.upkeep_bytes_per_s
        await asyncio.sleep(self._paced_until - now)


def _parse_key(raw: Any) -> int:
    if isinstance(raw, str) and _KEY_RE.fullmatch(raw):
        return int(raw, 16)
    msg = f"record key must be {2 * ids.ID_BYTES} hex digits, got {raw!r}"
    raise StoreError(msg)


def _owner(delivery: Delivery) -> bool:
    return True
