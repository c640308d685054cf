"""The records store's upkeep on peers of one process (real loopback sockets): records
are handed to peers that join near their keys, copied again when holders die, and
republished to a holder that lost one; versions, answers and the disk copy."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest
from support.processes import free_port

from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.config import OverlayConfig
from agiledart.overlay.errors import ConfigError
from agiledart.peer import Peer, PeerConfig, UnknownPeer
from agiledart.runtime.holders import HybridClock, Upkeep, holders
from agiledart.runtime.recordfiles import RecordFiles
from agiledart.runtime.records import LocalRecords, record_key

KEY = ClusterKey.generate(random.Random("records-upkeep-test-key-0123456789"))
FAST = OverlayConfig(heartbeat_interval_s=0.5, misses_to_dead=3)


# -- pure pieces ------------------------------------------------------------------------


def test_the_clock_never_goes_back_when_the_wall_clock_does() -> None:
    wall = iter([1000, 2000, 500, 500, 3000, 4000])
    clock = HybridClock(lambda: next(wall))
    versions = [clock.now() for _ in range(5)]
    assert versions == [1000, 2000, 2001, 2002, 3000]
    clock.observe(10_000)
    assert clock.now() == 10_001


def test_a_write_refused_as_older_is_not_kept_and_ties_resolve_the_same_everywhere() -> None:
    a, b = LocalRecords(), LocalRecords()
    assert a.put(1, 10, "new")
    assert not a.put(1, 9, "older")
    assert a.get(1) == (10, "new")
    # the same version with two values: both stores end with the same one, either order
    a.put(2, 5, "left")
    a.put(2, 5, "right")
    b.put(2, 5, "right")
    b.put(2, 5, "left")
    assert a.get(2) == b.get(2)


def test_upkeep_offers_a_record_to_a_peer_that_joins_near_its_key() -> None:
    me, key = 0b1000, 0b1100
    upkeep = Upkeep(me, copies=2)
    stamp = (1, b"d")
    assert upkeep.plan([(key, stamp)], [0b0001], full=False).offers == {0b0001: [key]}
    upkeep.confirm(0b0001, key, stamp)
    assert not upkeep.plan([(key, stamp)], [0b0001], full=False)  # confirmed: quiet
    # 0b1101 joins next to the key: it becomes a holder, and only it is offered the key
    plan = upkeep.plan([(key, stamp)], [0b0001, 0b1101], full=False)
    assert plan.offers == {0b1101: [key]}
    # a republish round offers to every holder, confirmed or not
    upkeep.confirm(0b1101, key, stamp)
    assert upkeep.plan([(key, stamp)], [0b0001, 0b1101], full=True).offers == {0b1101: [key]}


def test_upkeep_copies_a_record_again_when_a_holder_dies() -> None:
    me, key = 0b1000, 0b1000
    upkeep = Upkeep(me, copies=3)
    stamp = (1, b"d")
    peers = [0b1001, 0b1010, 0b0001]
    for p in holders(key, me, peers, 3):
        if p != me:
            upkeep.confirm(p, key, stamp)
    assert not upkeep.plan([(key, stamp)], peers, full=False)
    upkeep.forget_peer(0b1001)  # died: the next closest is a holder now
    plan = upkeep.plan([(key, stamp)], [0b1010, 0b0001], full=False)
    assert plan.offers == {0b0001: [key]}


def test_a_record_held_by_no_right_goes_to_its_owner_once() -> None:
    upkeep = Upkeep(0b0000, copies=1)
    key, stamp = 0b1111, (1, b"d")
    assert upkeep.plan([(key, stamp)], [0b1110], full=False).to_owner == [key]
    upkeep.hand(key, stamp)
    assert not upkeep.plan([(key, stamp)], [0b1110], full=False)
    assert upkeep.plan([(key, (2, b"e"))], [0b1110], full=False).to_owner == [key]


def test_a_set_merges_and_its_digest_does_not_depend_on_the_order() -> None:
    a, b = LocalRecords(), LocalRecords()
    a.add(7, 1, ["x"])
    a.add(7, 2, ["y"])
    b.add(7, 1, ["y"])
    b.add(7, 5, ["x"])
    assert sorted(a.get(7)[1]) == sorted(b.get(7)[1]) == ["x", "y"]  # type: ignore[index]
    assert a.item(7).digest == b.item(7).digest  # type: ignore[union-attr]


def test_records_on_disk_survive_a_reload_and_evictions_leave_the_disk(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path / "records")
    store = LocalRecords(max_bytes=3 * len(msgpack.packb("x" * 50)))
    for k in range(4):
        store.put(k, 10 + k, "x" * 50)
    store.add(9, 1, ["member"])
    files.apply(*store.drain())
    (tmp_path / "records" / f"{5:040x}.rec").write_bytes(b"\xc1 torn")  # not msgpack
    loaded = {k: (v, m, value) for k, v, m, value in files.load()}
    assert set(loaded) == set(store._items)  # the evicted ones are gone from disk too
    assert loaded[9] == (1, True, ["member"])
    assert 0 not in loaded


# -- peers in one process ---------------------------------------------------------------


class Ring:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.peers: dict[str, Peer] = {}
        self._stack = contextlib.AsyncExitStack()
        self._exits: dict[str, contextlib.AsyncExitStack] = {}

    async def start(self, name: str) -> Peer:
        first = next(iter(self.peers.values()), None)
        for attempt in range(5):  # the port may be taken between the check and the bind
            config = PeerConfig(
                listen=("127.0.0.1", free_port()),
                bootstrap=[] if first is None else [first.address],
                name=name,
                state_dir=self.root / name,
                workers=0,
                scheduling="local",
                overlay=FAST,
            )
            stack = contextlib.AsyncExitStack()
            try:
                peer = await stack.enter_async_context(Peer(config, KEY))
                break
            except ConfigError:
                if attempt == 4:
                    raise
        peer.runtime.records.settle_s = 0.2
        self.peers[name], self._exits[name] = peer, stack
        return peer

    async def stop(self, name: str) -> None:
        self.peers.pop(name)
        await self._exits.pop(name).aclose()

    async def aclose(self) -> None:
        for name in list(self.peers):
            await self.stop(name)

    def holding(self, key: int) -> set[str]:
        return {n for n, p in self.peers.items() if key in p.runtime.records.local}

    def closest(self, key: int, copies: int) -> set[str]:
        by_id = {p.node_id: n for n, p in self.peers.items()}
        return {by_id[i] for i in sorted(by_id, key=lambda i: i ^ key)[:copies]}


@contextlib.asynccontextmanager
async def ring(root: Path) -> AsyncIterator[Ring]:
    r = Ring(root)
    try:
        yield r
    finally:
        await r.aclose()


async def settled(r: Ring, keys: list[int], *, timeout: float = 60.0) -> set[int]:
    """Wait until each key is held by its closest live peers; the keys that are not."""
    copies = next(iter(r.peers.values())).runtime.records.copies
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        missing = {k for k in keys if not r.closest(k, copies) <= r.holding(k)}
        if not missing or loop.time() > deadline:
            return missing
        await asyncio.sleep(0.2)


KEYS = [record_key("test", str(i)) for i in range(24)]


@pytest.mark.slow
async def test_records_reach_peers_that_join_and_survive_holders_that_die(
    tmp_path: Path,
) -> None:
    async with ring(tmp_path) as r:
        for i in range(3):
            await r.start(f"p{i}")
        first = r.peers["p0"].runtime.records
        await asyncio.sleep(0.5)
        for i, key in enumerate(KEYS):
            assert await first.put(key, {"n": i})
        for i in range(3, 14):
            await r.start(f"p{i}")
        assert await settled(r, KEYS) == set()  # handed to the peers that joined
        for name in ("p0", "p5", "p9", "p12"):
            await r.stop(name)
        assert await settled(r, KEYS) == set()  # copied again after the deaths
        reader = r.peers["p1"].runtime.records
        assert [await reader.get(k) for k in KEYS] == [{"n": i} for i in range(len(KEYS))]


@pytest.mark.slow
async def test_a_republish_restores_a_copy_a_holder_lost(tmp_path: Path) -> None:
    async with ring(tmp_path) as r:
        for i in range(8):
            await r.start(f"p{i}")
        await asyncio.sleep(1.0)
        writer = r.peers["p0"].runtime.records
        for i, key in enumerate(KEYS):
            await writer.put(key, i)
        assert await settled(r, KEYS) == set()
        key = KEYS[0]
        victim = sorted(r.holding(key))[0]
        r.peers[victim].runtime.records.local._items.pop(key)  # lost, and nobody was told
        others = [p for n, p in r.peers.items() if n != victim and key in p.runtime.records.local]
        await asyncio.sleep(1.0)
        assert key not in r.peers[victim].runtime.records.local  # a quiet ring is quiet
        await others[0].runtime.records.upkeep_round(full=True)
        assert key in r.peers[victim].runtime.records.local


@pytest.mark.slow
async def test_a_put_refused_as_older_answers_false(tmp_path: Path) -> None:
    async with ring(tmp_path) as r:
        for i in range(2):
            await r.start(f"p{i}")
        await asyncio.sleep(0.5)
        a, b = (r.peers[n].runtime.records for n in ("p0", "p1"))
        key = record_key("test", "clock")
        b.clock.wall = lambda: 2_000_000_000_000_000_000  # b's clock is far ahead
        assert await b.put(key, "from b")
        a.clock.wall, a.clock.last = lambda: 1_000_000_000_000_000_000, 0  # a saw nothing
        assert not await a.put(key, "from a, behind")  # the truth, not True
        assert await a.get(key) == "from b"
        assert await a.put(key, "from a, after seeing b's version")
        assert await b.get(key) == "from a, after seeing b's version"


@pytest.mark.slow
async def test_route_finds_a_peer_it_has_no_contact_for_through_the_store(
    tmp_path: Path,
) -> None:
    async with ring(tmp_path) as r:
        for i in range(8):
            await r.start(f"p{i}")
        asker, far = r.peers["p0"], r.peers["p7"]
        key = record_key("peer", "p7")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not any(key in p.runtime.records.local for p in r.peers.values()):
            assert loop.time() < deadline, "p7 never published its name"
            await asyncio.sleep(0.2)
        asker.overlay.contacts.pop(far.node_id, None)  # as if p0 had never heard of p7
        assert all(c.name != "p7" for c in asker.overlay.known_peers())
        routed = await asker._route({"to": "p7"}, None)  # type: ignore[arg-type]
        assert routed["key"] == f"{far.node_id:040x}"  # the name resolved in the store
        with pytest.raises(UnknownPeer, match="no peer named 'p99' is in the ring"):
            await asker._route({"to": "p99"}, None)  # type: ignore[arg-type]
