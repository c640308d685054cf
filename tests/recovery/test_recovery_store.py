"""The fragment store on disk: a folder per app, one file per fragment; what a restart
finds (this layout and the earlier folder-per-epoch one); what a drop removes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agiledart.recovery import encode
from agiledart.runtime.recovery import CheckpointError, FragmentStore, StoreFull

CONN: Any = None  # the handlers read the connection only to name a refused sender


def put(store: FragmentStore, app: str, instance: str, epoch: int, index: int) -> None:
    fragments = encode(b"state %d" % epoch * 50, m=2, k=1, app=app, instance=instance, epoch=epoch)
    for f in fragments:
        if f.index == index:
            assert asyncio.run(store._put({"f": f.to_bytes()}, CONN)) == {"stored": True}


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_fragments_live_in_one_folder_per_app_and_survive_a_restart(tmp_path: Path) -> None:
    store = FragmentStore(tmp_path)
    for epoch in (1, 2):
        put(store, "app/1", "avg#0", epoch, index=1)
    put(store, "other", "w#0", 5, index=0)
    inst = b"avg#0".hex()
    assert files(tmp_path) == [
        f"{b'app/1'.hex()}/{inst}-1-0-1.frag",
        f"{b'app/1'.hex()}/{inst}-2-0-1.frag",
        f"{b'other'.hex()}/{b'w#0'.hex()}-5-0-0.frag",
    ]
    again = FragmentStore(tmp_path)
    assert again.held("app/1") == {"avg#0": [1, 2]}
    assert again.held("other") == {"w#0": [5]}
    assert again.used_bytes == store.used_bytes > 0


def test_a_drop_removes_the_files_and_the_folders_it_empties(tmp_path: Path) -> None:
    store = FragmentStore(tmp_path)
    for epoch in (1, 2, 3):
        put(store, "a", "x#0", epoch, index=0)
    got = asyncio.run(store._drop({"app": "a", "instance": "x#0", "below": 3}, CONN))
    assert got == {"dropped": 2}
    assert files(tmp_path) == [f"{b'a'.hex()}/{b'x#0'.hex()}-3-0-0.frag"]
    assert asyncio.run(store._drop({"app": "a"}, CONN)) == {"dropped": 1}
    assert list(tmp_path.iterdir()) == []  # the app's folder went with its last fragment
    put(store, "a", "x#0", 4, index=0)  # and comes back with the next
    assert store.held("a") == {"x#0": [4]}


def test_a_store_of_the_earlier_layout_is_read_and_cleaned(tmp_path: Path) -> None:
    """Before, every epoch had its folder: <app hex>/<instance hex>/<epoch>/<stripe>-<index>."""
    (f,) = [
        f for f in encode(b"old" * 99, m=2, k=1, app="a", instance="x#0", epoch=7) if f.index == 2
    ]
    old = tmp_path / b"a".hex() / b"x#0".hex() / "7"
    old.mkdir(parents=True)
    (old / "0-2.frag").write_bytes(f.to_bytes())
    (old / "0-2.tmp").write_bytes(b"half")  # a crash mid-write
    (tmp_path / "stray.frag").write_bytes(b"?")
    store = FragmentStore(tmp_path)
    assert store.held("a") == {"x#0": [7]}
    assert not (old / "0-2.tmp").exists()
    reply = asyncio.run(store._get({"app": "a", "instance": "x#0", "epoch": 7}, CONN))
    assert reply == {"fragments": [f.to_bytes()], "next": None, "held": True}
    asyncio.run(store._drop({"app": "a", "below": 8}, CONN))
    assert files(tmp_path) == ["stray.frag"]
    assert list(tmp_path.iterdir()) == [tmp_path / "stray.frag"]


def fragment(app: str, epoch: int, size: int = 400) -> bytes:
    (f,) = [
        f
        for f in encode(bytes(size), m=2, k=1, app=app, instance="x#0", epoch=epoch)
        if f.index == 0
    ]
    return f.to_bytes()


def test_the_store_takes_at_most_half_of_its_disk(tmp_path: Path) -> None:
    free = [10_000]
    store = FragmentStore(tmp_path / "fragments", free_bytes=lambda _: free[0])
    assert store.limit() == 5_000  # half of the free disk, far below 4 GiB
    one = fragment("a", 1)
    n = 0
    while store.used_bytes + len(one) <= store.limit():  # each one leaves less free space
        asyncio.run(store._put({"f": fragment("a", n + 1)}, CONN))
        free[0] -= len(one)
        n += 1
    assert n > 0
    with pytest.raises(StoreFull, match=r"fragment store full: .* free disk"):
        asyncio.run(store._put({"f": fragment("a", n + 1)}, CONN))
    assert store.used_bytes <= free[0]  # never more than what is left free
    assert store.used_bytes + len(one) > store.limit()
    assert store.held("a") == {"x#0": list(range(1, n + 1))}  # a refused one leaves no trace
    big = FragmentStore(tmp_path / "big", free_bytes=lambda _: 1 << 50)
    assert big.limit() == 4 << 30  # the fixed cap where the disk is large


def test_a_sweep_drops_only_the_apps_that_ended(tmp_path: Path) -> None:
    store = FragmentStore(tmp_path)
    for app in ("ended", "live", "unknown", "unreachable"):
        for epoch in (1, 2):
            put(store, app, "x#0", epoch, index=0)

    async def ended(app: str) -> bool:
        if app == "unreachable":
            raise CheckpointError("no record holder answered")
        return app == "ended"

    assert asyncio.run(store.sweep(ended)) == ["ended"]
    assert store.apps() == ["live", "unknown", "unreachable"]
    assert not (tmp_path / b"ended".hex()).exists()
    again = FragmentStore(tmp_path)  # and a restart does not bring them back
    assert again.apps() == ["live", "unknown", "unreachable"]
    assert again.used_bytes == store.used_bytes
