"""A peer's background jobs (reports to schedulers, reactions to deaths, manifests)
are supervised: one that raises is logged and counted, and the peer goes on serving.
Before, they ran bare in the peer's root task group, where any exception other than
the project's own cancelled the whole peer."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from support.processes import free_port

from agiledart.overlay.auth import ClusterKey
from agiledart.peer import Peer, PeerConfig
from agiledart.runtime.links import Links

KEY = ClusterKey.generate(random.Random("test-cluster-key-0123456789"))


async def test_a_background_job_that_raises_never_ends_the_peer(tmp_path: Path) -> None:
    config = PeerConfig(listen=("127.0.0.1", free_port()), state_dir=tmp_path, workers=0, name="p")
    async with Peer(config, KEY) as peer:

        async def malformed_record() -> None:
            raise KeyError("a field the record should have had")

        peer.runtime._background(malformed_record())
        for _ in range(500):  # 5 s at most: a broken build must not hang
            if peer.runtime.dropped["background_errors"]:
                break
            await asyncio.sleep(0.01)
        assert peer.runtime.dropped["background_errors"] == 1
        links = Links(KEY, "cli")
        try:
            ring = await links.request(peer.address, "ring", {}, timeout=10)
        finally:
            await links.aclose()
        assert ring["self"] == "p"


SPEC = {
    "name": "half",
    "sources": [
        {
            "id": "src",
            "peer": "p",
            "connector": "generator",
            "params": {"dataset": "counter", "count": 10, "rate": 10},
        }
    ],
    "sinks": [{"id": "out", "peer": "p", "connector": "discard", "inputs": ["src"]}],
}


async def test_a_submit_that_breaks_half_way_leaves_no_app_deploying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = PeerConfig(listen=("127.0.0.1", free_port()), state_dir=tmp_path, workers=0, name="p")
    async with Peer(config, KEY) as peer:
        scheduler = peer.runtime.scheduler

        async def broken_index(key: int, *members: object) -> None:
            raise RuntimeError("the index store broke")

        monkeypatch.setattr(scheduler.records, "add", broken_index)
        with pytest.raises(RuntimeError, match="index store broke"):
            await scheduler.submit(SPEC)
        (rec,) = scheduler.apps.values()
        assert rec.state == "failed"
        assert "index store broke" in (rec.error or "")
        assert peer.zoning is None or peer.zoning.held() == 0  # not counted against the cap
        stored = await scheduler.record(rec.app_id)
        assert stored.state == "failed"


async def test_mqtt_logs_left_by_a_killed_peer_are_removed_at_start(tmp_path: Path) -> None:
    stale = tmp_path / "mqtt" / "plant-0a1b2c"
    stale.mkdir(parents=True)
    (stale / "0.log").write_bytes(b"x" * 1000)  # a kill -9 left it; nothing reads it again
    config = PeerConfig(listen=("127.0.0.1", free_port()), state_dir=tmp_path, workers=0, name="p")
    async with Peer(config, KEY):
        assert not (tmp_path / "mqtt").exists()
