"""Checkpoint fragments over the network: real peers hold them (``frag_*`` requests);
any m of n rebuild the state, also with k holders killed, a corrupt fragment on disk is
detected and a spare used, garbage is refused with typed errors, and a restarted
holder still has what it held."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from support.processes import formed_cluster

from agiledart.emulation import LocalCluster
from agiledart.overlay.errors import MalformedError
from agiledart.runtime.links import Links
from agiledart.runtime.recovery import CheckpointError, Holder, load, save

pytestmark = [pytest.mark.processes]

PEERS = 6
M, K = 4, 2
APP = "counter-app-1a2b3c"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path_factory.mktemp("fragments"), PEERS, ["--workers", "0"]) as c:
        yield c


def holders(site: LocalCluster) -> list[Holder]:
    return [Holder(site.name(i), site.address(i)) for i in range(PEERS)]


def state(size: int, seed: int) -> bytes:
    return bytes((i * 131 + seed) % 251 for i in range(size))


async def roundtrip(site: LocalCluster, data: bytes, instance: str, epoch: int) -> bytes:
    links = Links(site.key, "tester")
    try:
        receipt = await save(
            links, holders(site), data, app=APP, instance=instance, epoch=epoch, m=M, k=K
        )
        assert receipt.holders == tuple(site.name(i) for i in range(PEERS))
        assert receipt.bytes == len(data)
        return await load(links, holders(site), app=APP, instance=instance, epoch=epoch, m=M)
    finally:
        await links.aclose()


def test_a_state_comes_back_whole(site: LocalCluster) -> None:
    data = state(3 * 1024 * 1024 + 17, seed=1)  # several stripes of 1 MiB blocks
    assert asyncio.run(roundtrip(site, data, "per-key#0", 1)) == data
    assert asyncio.run(roundtrip(site, b"", "empty#0", 1)) == b""


def test_a_corrupt_fragment_on_disk_is_skipped_for_a_spare(site: LocalCluster) -> None:
    data = state(200_000, seed=2)
    asyncio.run(roundtrip(site, data, "corrupt#0", 3))
    assert site.workdir is not None
    # flip a byte in the block of holder 0's fragment (the one load asks first)
    folder = site.workdir / site.name(0) / "fragments"
    name = f"{b'corrupt#0'.hex()}-3-0-"  # <instance hex>-<epoch>-<stripe>-<index>.frag
    (path,) = [p for p in folder.rglob("*.frag") if p.name.startswith(name)]
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF
    path.write_bytes(bytes(raw))

    async def again() -> bytes:
        links = Links(site.key, "tester")
        try:
            return await load(links, holders(site), app=APP, instance="corrupt#0", epoch=3, m=M)
        finally:
            await links.aclose()

    assert asyncio.run(again()) == data


def test_garbage_fragments_are_refused(site: LocalCluster) -> None:
    async def probe() -> None:
        for body in ({"f": b"\x93garbage"}, {"f": "text"}, {}):
            with pytest.raises((CheckpointError, MalformedError)) as info:
                await site.request(1, "frag_put", body)
            assert info.value.remote_peer == site.name(1)  # the holder refused, as itself
        with pytest.raises(MalformedError) as refused:
            await site.request(1, "frag_get", {"app": APP, "instance": 3, "epoch": "x"})
        assert refused.value.remote_peer == site.name(1)
        reply = await site.request(1, "frag_get", {"app": APP, "instance": "none", "epoch": 1})
        assert reply == {"fragments": [], "next": None, "held": False}

    asyncio.run(probe())


def test_old_epochs_are_dropped(site: LocalCluster) -> None:
    for epoch in (10, 11, 12):
        asyncio.run(roundtrip(site, state(1000, epoch), "gc#0", epoch))

    async def gc() -> list[dict[str, list[int]]]:
        for i in range(PEERS):
            await site.request(i, "frag_drop", {"app": APP, "instance": "gc#0", "below": 12})
        return [(await site.request(i, "frag_held", {"app": APP}))["held"] for i in range(PEERS)]

    for held in asyncio.run(gc()):
        assert held["gc#0"] == [12]


def test_any_m_holders_suffice_when_k_die_and_a_restart_keeps_fragments(
    site: LocalCluster,
) -> None:
    """Last in the module: it kills peers."""
    data = state(1_500_000, seed=4)
    asyncio.run(roundtrip(site, data, "killed#0", 7))
    site.kill(0)  # k = 2 holders die at once, the first ones load would ask
    site.kill(2)

    async def after() -> bytes:
        links = Links(site.key, "tester")
        try:
            return await load(links, holders(site), app=APP, instance="killed#0", epoch=7, m=M)
        finally:
            await links.aclose()

    assert asyncio.run(after()) == data
    site.kill(3)  # a third: fewer than m remain

    with pytest.raises(CheckpointError, match="cannot rebuild"):
        asyncio.run(after())
    site.procs[2] = site.start(2)  # holder 2 restarts: its fragments are still there

    async def restarted() -> bytes:
        for _ in range(100):
            try:
                return await after()
            except CheckpointError:
                await asyncio.sleep(0.2)
        return await after()

    assert asyncio.run(restarted()) == data
