"""The scheduler's app lifecycle as a table, one object per app, checkpoint epochs as
plain values, and a scheduler that owns (and stops) every task it starts."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import msgpack
import pytest
from support.apps import running_record

from agiledart.app.errors import AppError
from agiledart.app.parse import parse_spec
from agiledart.runtime import adoption
from agiledart.runtime.appstate import (
    TRANSITIONS,
    AppRecord,
    AppState,
    IllegalTransition,
)
from agiledart.runtime.epochs import Epochs
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.links import Address
from agiledart.runtime.records import record_key
from agiledart.runtime.scheduler import Scheduler
from agiledart.runtime.tasks import TaskOwner


class Store:
    """The DHT records store, in a dict."""

    def __init__(self) -> None:
        self.data: dict[int, Any] = {}

    async def put(self, key: int, value: Any) -> bool:
        self.data[key] = copy.deepcopy(value)
        return True

    async def add(self, key: int, *members: Any) -> None:
        self.data.setdefault(key, []).extend(members)

    async def get(self, key: int) -> Any:
        return copy.deepcopy(self.data.get(key))


def scheduler(store: Store, name: str = "edge-1", port: int = 1) -> Scheduler:
    async def no_stats(peer: str) -> None:
        return None

    return Scheduler(
        name=name,
        address=lambda: ("127.0.0.1", port),
        records=store,  # type: ignore[arg-type]
        links=None,  # type: ignore[arg-type]
        code=None,  # type: ignore[arg-type]
        directory=None,  # type: ignore[arg-type]
        stats_of=no_stats,
    )


ENDED = [AppState.FINISHED, AppState.FAILED, AppState.STOPPED]


@pytest.mark.parametrize("old", list(AppState))
@pytest.mark.parametrize("new", list(AppState))
def test_a_move_succeeds_exactly_when_the_table_allows_it(old: AppState, new: AppState) -> None:
    rec = running_record("q-0")
    rec.state = old
    if new in TRANSITIONS[old]:
        rec.move_to(new)
        assert rec.state is new
    else:
        with pytest.raises(IllegalTransition):
            rec.move_to(new)
        assert rec.state is old


@pytest.mark.parametrize("state", ENDED)
@pytest.mark.parametrize("to", list(AppState))
def test_an_ended_app_moves_nowhere(state: AppState, to: AppState) -> None:
    rec = running_record("q-0")
    rec.move_to(state)
    with pytest.raises(IllegalTransition) as caught:
        rec.move_to(to)
    assert isinstance(caught.value, AppError)
    assert (caught.value.old, caught.value.new) == (state, to)
    assert rec.state is state


def test_a_live_app_runs_again_or_ends_and_never_deploys_again() -> None:
    for state in (AppState.DEPLOYING, AppState.RUNNING):
        assert TRANSITIONS[state] == {AppState.RUNNING, *ENDED}
        rec = running_record("q-0")
        rec.state = state
        with pytest.raises(IllegalTransition):
            rec.move_to(AppState.DEPLOYING)
        rec.move_to(AppState.RUNNING)  # a new generation is deployed
        rec.move_to(AppState.STOPPED)
        assert rec.state is AppState.STOPPED


@pytest.mark.parametrize("state", ["deploying", "running", "finished", "failed", "stopped"])
def test_a_record_written_with_a_plain_state_name_loads_and_is_written_back_alike(
    state: str,
) -> None:
    """Peers restart on their old state directories: records written before the
    states were an enum store them as plain names, and still do."""
    wire = {**running_record("q-0").to_wire(), "state": state}
    rec = AppRecord.from_wire(msgpack.unpackb(msgpack.packb(wire)))
    assert rec.state is AppState(state)
    assert rec.live == (state in ("deploying", "running"))
    again = rec.to_wire()
    assert type(again["state"]) is str
    assert again == wire


def test_a_record_in_an_unknown_state_is_a_typed_error() -> None:
    with pytest.raises(UnknownApp, match="app record has no state 'paused'"):
        AppRecord.from_wire({**running_record("q-0").to_wire(), "state": "paused"})


def test_forgetting_an_app_drops_all_the_scheduler_held_about_it() -> None:
    s = scheduler(Store())
    app = s.hold(running_record("q-0"))
    app.sinks_done["out"] = {}
    app.epochs.cut(None, generation=0, now=1.0)
    assert s.apps["q-0"] is app.record
    s.forget("q-0")
    assert "q-0" not in s.apps
    assert s.scheduled == {}
    # held again (adopted back): a fresh object, nothing of the old one
    again = s.hold(running_record("q-0"))
    assert again is not app
    assert (again.sinks_done, again.epochs.pending) == ({}, None)


def test_holding_a_held_app_again_keeps_its_lock_and_epochs_but_counts_sinks_anew() -> None:
    s = scheduler(Store())
    app = s.hold(running_record("q-0"))
    app.sinks_done["out"] = {}
    app.epochs.next_epoch = 7
    rec = running_record("q-0")
    assert s.hold(rec) is app
    assert (app.record, app.sinks_done, app.epochs.next_epoch) == (rec, {}, 7)


SPEC = parse_spec(
    {
        "name": "t",
        "sources": [
            {
                "id": "src",
                "peer": "p",
                "connector": "generator",
                "params": {"dataset": "urban", "rate": 10, "count": 10},
            }
        ],
        "operators": [
            {
                "id": "c",
                "op": "aggregate",
                "params": {"key": "sensor", "aggregate": "count"},
                "inputs": ["src"],
            }
        ],
        "sinks": [{"id": "out", "peer": "p", "connector": "stdout", "inputs": ["c"]}],
    }
)


def test_an_epoch_commits_once_sources_sinks_and_stateful_instances_reported() -> None:
    epochs = Epochs()
    old = {("10.0.0.9", 1)}
    first = epochs.cut(None, generation=2, now=100.0, waited=0.5)
    assert (first.epoch, first.generation) == (1, 2)
    assert epochs.cut({"epoch": 4}, generation=2, now=101.0).epoch == 5  # after the commit
    pending = epochs.pending
    assert pending is not None
    place = {"c": ["q"]}
    args = (SPEC, ["src"], ["out"], [], place)
    pending.note({"kind": "source", "id": "src", "offset": 40})
    pending.note({"kind": "sink", "id": "out", "commit": 17})
    assert not epochs.complete(*args)  # the count on q has not reported
    state = {"peer": "q", "ops": ["c"], "instance": "c@q", "holders": [], "m": 1, "k": 0}
    pending.note({"kind": "state", **state, "bytes": 30, "seconds": 0.2})
    assert epochs.complete(*args)
    commit = epochs.commit(old, now=103.0, at=5.0)
    assert epochs.pending is None
    assert commit == {
        "epoch": 5,
        "sources": {"src": 40},
        "sinks": {"out": 17},
        "states": [{**state, "bytes": 30}],
        "bytes": 30,
        "store_s": 0.2,
        "cut_s": 2.0,
        "waited_s": 0.0,
        "at": 5.0,
    }
    new: set[Address] = {("10.0.0.8", 2)}
    assert epochs.saved(new) == old | new  # the older holders go once it is stored
    assert epochs.saved(set()) == set()


def test_an_ended_sink_is_not_waited_for_and_a_stale_epoch_is_overdue() -> None:
    epochs = Epochs()
    assert epochs.overdue(now=0.0, interval=1.0)  # nothing cut yet
    epochs.cut(None, generation=0, now=0.0)
    assert not epochs.overdue(now=9.9, interval=1.0)
    assert epochs.overdue(now=10.0, interval=1.0)
    assert epochs.pending is not None
    epochs.pending.note({"kind": "source", "id": "src"})
    epochs.pending.note({"kind": "state", "peer": "q", "ops": ["c"]})
    assert epochs.complete(SPEC, ["src"], ["out"], ["out"], {"c": ["q"]})
    epochs.drop(epoch=2)  # not the one being cut: kept
    assert epochs.pending is not None
    epochs.drop(epoch=1)
    assert epochs.pending is None


def test_a_closed_task_owner_cancels_its_tasks_and_starts_nothing_new() -> None:
    async def run() -> None:
        owner = TaskOwner("test")
        ran: list[str] = []

        async def forever() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                ran.append("cancelled")

        owner.spawn(forever())
        await asyncio.sleep(0)
        assert len(owner) == 1
        await owner.aclose()
        assert (ran, len(owner)) == (["cancelled"], 0)

        async def never() -> None:
            ran.append("ran")

        assert owner.spawn(never()) is None
        await asyncio.sleep(0)
        assert ran == ["cancelled"]

    asyncio.run(run())


def test_aclose_stops_a_revisit_of_a_declined_adoption(monkeypatch: pytest.MonkeyPatch) -> None:
    """A declined adoption waits in the background for the old scheduler to die; a
    scheduler shutting down stops that wait (it was fire-and-forget before)."""
    monkeypatch.setattr(adoption, "REVISIT_S", 0.01)
    store = Store()
    rec = running_record("q-0")  # scheduled by edge-1
    store.data[record_key("scheduling", "edge-1")] = ["q-0"]
    store.data[record_key("app", "q-0")] = rec.to_wire()
    s = scheduler(store, "sensor-1", 2)
    asked: list[str] = []

    async def still_scheduled(address: Address, app_id: str) -> bool:
        asked.append(app_id)
        return True  # edge-1 answers for ever

    monkeypatch.setattr(s, "still_scheduled", still_scheduled)

    async def run() -> None:
        s.start()
        await s.adopt_from("edge-1")
        await asyncio.sleep(0.05)
        assert len(s.tasks) == 1
        assert s.adoption.revisiting == {"edge-1"}
        await s.aclose()
        assert len(s.tasks) == 0
        assert s.adoption.revisiting == set()
        n = len(asked)
        await asyncio.sleep(0.05)
        assert len(asked) == n  # nobody asks any more

    asyncio.run(run())


def recovering(
    monkeypatch: pytest.MonkeyPatch,
    s: Scheduler,
    takeovers: list[tuple[str, Address]],
    install: Any,
) -> None:
    """``s``'s recovery with every peer answering, the dead ones taken over by
    ``takeovers`` in turn, and ``install`` in place of the deployment."""
    from agiledart.runtime import failover

    turns = iter(takeovers)

    async def answers(rec: AppRecord, peer: str) -> bool:
        return True

    async def takeover(lost: str, *, exclude: set[str]) -> tuple[str, Address]:
        return next(turns)

    async def undeploy(rec: AppRecord, *, fenced: bool = False) -> list[Any]:
        return []

    monkeypatch.setattr(s.hosts, "answers", answers)
    monkeypatch.setattr(s.hosts, "undeploy", undeploy)
    monkeypatch.setattr(s.recovery, "_takeover", takeover)
    monkeypatch.setattr(s, "install", install)
    monkeypatch.setattr(s, "spec_of", lambda rec: None)
    monkeypatch.setattr(failover, "pinned_peers", lambda spec, rec: set())
    monkeypatch.setattr(failover, "app_hosts", lambda *args: {})
    monkeypatch.setattr(failover, "consumers_first", lambda *args: [])


def test_a_recovery_is_listed_while_its_install_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An app whose replay is short ends inside the install of its new generation; its
    final record (and status) must list the recovery all the same (found in CI: one run
    in three of the sink-move test ended with `recoveries` empty)."""
    rec = running_record("q-0")
    rec.placement, rec.sources, rec.sinks = {"count": ["edge-2"]}, {"in": "sensor-1"}, {}
    s = scheduler(Store())
    seen: list[list[dict[str, Any]]] = []

    async def install(rec: AppRecord, *args: Any, **kwargs: Any) -> None:
        seen.append(copy.deepcopy(rec.recoveries))  # what the app's end would store

    recovering(monkeypatch, s, [("edge-3", ("127.0.0.4", 1))], install)
    asyncio.run(s.recovery.restart_without(rec, "edge-2", 0.0))
    ((during,),) = seen
    assert (during["dead"], during["takeover"], during["seconds"]) == ("edge-2", "edge-3", None)
    (after,) = rec.recoveries
    assert after["seconds"] is not None
    assert after["operators"] == ["count"]


def test_an_ended_sinks_report_stands_in_for_its_peers_missing_statistics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chaos seed 10: a recovery undeployed the app while its end gathered statistics;
    the final status had no sink, and so no output file. The sink's own end report
    fills in for its peer."""
    rec = running_record("q-0")
    rec.sinks = {"out": "gateway-2"}
    s = scheduler(Store())
    s.hold(rec)

    async def gather(rec: AppRecord) -> dict[str, Any]:
        return {"sensor-2": {"peer": "sensor-2", "sources": {"in": {"emitted": 4800}}}}

    async def undeploy(rec: AppRecord, *, fenced: bool = False) -> list[Any]:
        return []

    monkeypatch.setattr(s.hosts, "gather", gather)
    monkeypatch.setattr(s.hosts, "undeploy", undeploy)
    info = {"records": 4800, "path": "/data/out.jsonl", "ended": True}
    asyncio.run(s.sink_done("q-0", "out", info, generation=0))
    view = asyncio.run(s.status("q-0"))
    assert view["state"] == "finished"
    assert view["peers"]["gateway-2"]["sinks"]["out"]["path"] == "/data/out.jsonl"
    assert view["totals"]["sink_records"] == 4800


def test_a_second_recovery_from_one_checkpoint_restores_states_where_the_first_moved_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chaos seed 457: the peer of a window operator died and its state went, from the
    last committed checkpoint, to its neighbour, which died too before the next
    checkpoint committed; the second recovery, from the same checkpoint, restored the
    state at the first dead peer, so nowhere: a 5 s window lost a second of counts."""
    rec = running_record("q-0")
    rec.placement, rec.sources, rec.sinks = {"per-5s": ["edge-2"]}, {"in": "sensor-1"}, {}
    rec.checkpoint = {
        "epoch": 1,
        "sources": {},
        "sinks": {},
        "states": [{"peer": "edge-2", "ops": ["per-5s"], "holders": [], "m": 2}],
    }
    s = scheduler(Store())
    restored: list[list[str]] = []

    async def install(rec: AppRecord, *args: Any, restore: Any = None, **kwargs: Any) -> None:
        restored.append([e["peer"] for e in restore["states"]])

    takeovers = [("edge-4", ("127.0.0.9", 1)), ("edge-1", ("127.0.0.6", 1))]
    recovering(monkeypatch, s, takeovers, install)
    asyncio.run(s.recovery.restart_without(rec, "edge-2", 0.0))
    asyncio.run(s.recovery.restart_without(rec, "edge-4", 0.0))
    assert restored == [["edge-4"], ["edge-1"]]
    assert rec.placement == {"per-5s": ["edge-1"]}
