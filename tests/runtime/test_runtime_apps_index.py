"""The apps index is one set per day (UTC): no record grows with every app ever
submitted (before, ``index:apps`` did, and every submit failed once it reached the
records store's value limit), and ``apps`` reads only the days and the number of apps
it is asked for, newest first (before, it fetched every record ever written)."""

from __future__ import annotations

import datetime
import random
import time
from pathlib import Path

from support.apps import running_record
from support.processes import free_port

from agiledart.overlay.auth import ClusterKey
from agiledart.peer import Peer, PeerConfig
from agiledart.runtime.appstate import apps_index, utc_day
from agiledart.runtime.records import record_key

KEY = ClusterKey.generate(random.Random("test-cluster-key-0123456789"))


async def test_apps_lists_the_days_asked_for_newest_first(tmp_path: Path) -> None:
    config = PeerConfig(listen=("127.0.0.1", free_port()), state_dir=tmp_path, workers=0, name="p")
    async with Peer(config, KEY) as peer:
        records, scheduler = peer.runtime.records, peer.runtime.scheduler
        today = utc_day(time.time())
        for age, names in [(0, ["a0", "a1", "a2"]), (3, ["b0"]), (10, ["c0"])]:
            for name in names:
                await records.put(record_key("app", name), running_record(name).to_wire())
                await records.add(apps_index(today - datetime.timedelta(days=age)), name)

        def ids(listed: list[dict[str, object]]) -> list[object]:
            return [a["app_id"] for a in listed]

        assert ids(await scheduler.list_apps()) == ["a2", "a1", "a0", "b0"]
        assert ids(await scheduler.list_apps(days=11)) == ["a2", "a1", "a0", "b0", "c0"]
        assert ids(await scheduler.list_apps(days=1, limit=2)) == ["a2", "a1"]
        assert await records.get(record_key("index", "apps")) is None  # no ever-growing set
