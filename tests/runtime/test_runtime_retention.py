"""A scheduler forgets ended apps beyond the newest ``ENDED_KEPT`` (their final records
stay in the DHT, where ``status`` reads them), never a live one, and never one whose
final record could not be stored."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from support.apps import running_record

from agiledart.errors import AgiledartError
from agiledart.runtime import scheduler as scheduling
from agiledart.runtime.appstate import AppRecord, AppState
from agiledart.runtime.scheduler import Scheduler


class Store:
    """The DHT records store, in a dict; ``down`` makes every write fail."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.down = False

    async def put(self, key: str, value: Any) -> bool:
        if self.down:
            msg = "no replica answered"
            raise AgiledartError(msg)
        self.data[key] = copy.deepcopy(value)
        return True  # kept (the store's answer when no newer version is there)

    async def get(self, key: str) -> Any:
        return copy.deepcopy(self.data.get(key))


def scheduler(store: Store) -> Scheduler:
    async def no_stats(peer: str) -> None:
        return None

    return Scheduler(
        name="edge-1",
        address=lambda: ("127.0.0.1", 1),
        records=store,  # type: ignore[arg-type]
        links=None,  # type: ignore[arg-type]
        code=None,  # type: ignore[arg-type]
        directory=None,  # type: ignore[arg-type]
        stats_of=no_stats,
    )


def live(s: Scheduler, app_id: str) -> AppRecord:
    rec = running_record(app_id)
    s.hold(rec).epochs.next_epoch = 4
    return rec


async def end(s: Scheduler, rec: AppRecord, state: str = "finished") -> None:
    rec.move_to(AppState(state))
    rec.final = {"sinks": {"out": {"records": 7}}}
    await s.save(rec)


def test_only_the_newest_ended_apps_stay_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduling, "ENDED_KEPT", 3)
    store = Store()
    s = scheduler(store)

    async def run() -> None:
        recs = [live(s, f"q-{i}") for i in range(8)]
        for i, rec in enumerate(recs[:6]):
            await end(s, rec, "stopped" if i % 2 else "finished")
        assert set(s.apps) == {"q-3", "q-4", "q-5", "q-6", "q-7"}  # 3 ended, 2 live
        # an app in memory is one object: its epochs went with the forgotten ones
        assert set(s.scheduled) == set(s.apps)
        assert all(app.epochs.next_epoch == 4 for app in s.scheduled.values())
        # a forgotten app is read back from the DHT, final state and figures included
        old = await s.record("q-0")
        assert old is not s.apps.get("q-0")
        assert (old.state, old.final) == ("finished", {"sinks": {"out": {"records": 7}}})
        assert (await s.status("q-1"))["state"] == "stopped"
        # live apps are never forgotten, however many end after them
        for i in range(8, 20):
            await end(s, live(s, f"q-{i}"))
        assert {"q-6", "q-7"} <= set(s.apps)
        assert len(s.apps) == 2 + 3

    asyncio.run(run())


def test_an_app_whose_final_record_was_not_stored_stays_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduling, "ENDED_KEPT", 1)
    store = Store()
    s = scheduler(store)

    async def run() -> None:
        first, second, third = (live(s, f"q-{i}") for i in range(3))
        store.down = True
        await end(s, first, "failed")  # only memory knows it ended
        store.down = False
        await end(s, second)
        await end(s, third)
        assert set(s.apps) == {"q-0", "q-2"}
        assert (await s.record("q-0")).state == "failed"

    asyncio.run(run())


def test_an_app_ends_once_however_many_ends_race(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sinks' ends and a stop arriving while the final statistics are gathered: one
    gather, one end state, and the totals a status shows never change afterwards."""
    store = Store()
    s = scheduler(store)
    gathers: list[int] = []
    undeploys: list[str] = []

    async def gather(rec: AppRecord) -> dict[str, Any]:
        gathers.append(len(gathers))
        await asyncio.sleep(0.2)  # the peers answering
        uptime = 10.0 + len(gathers)  # a later gather sees a longer uptime
        return {"p": {"uptime_s": uptime, "sources": {"s": {"emitted": 100}}}}

    async def undeploy(rec: AppRecord, *, fenced: bool = False) -> list[Any]:
        undeploys.append(rec.app_id)
        return []

    monkeypatch.setattr(s.hosts, "gather", gather)
    monkeypatch.setattr(s.hosts, "undeploy", undeploy)

    async def run() -> None:
        rec = live(s, "q-0")
        rec.sinks = {"a": "edge-1", "b": "edge-2"}
        await s.sink_done("q-0", "a", {})
        assert gathers == []  # one sink of two: still running
        await asyncio.gather(
            s.sink_done("q-0", "b", {}),
            s.sink_done("q-0", "b", {}),  # the same end, repeated
            s.stop("q-0"),
        )
        assert len(gathers) == 1
        assert rec.state == "finished"
        first = (await s.status("q-0"))["totals"]
        assert first["source_rate"] == 9.1  # 100 records over the first gather's 11 s
        await s.sink_done("q-0", "b", {})
        assert (await s.status("q-0"))["totals"] == first
        assert (await s.stop("q-0")).state == "finished"
        assert len(gathers) == 1

    asyncio.run(run())
