"""Found by the chaos soak (seed 28: an app's scheduler and a host killed together, on a
loaded machine): a peer declared the scheduler dead a moment before it really died,
asked it whether it still scheduled its apps, heard yes, and declined to adopt them.
The scheduler then died without ever coming back, so nobody declared it dead again and
its apps were never adopted. A declined adoption is now tried again once the old
scheduler stops answering."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pytest
from support.apps import running_record

from agiledart.errors import AgiledartError
from agiledart.overlay.routing import Contact
from agiledart.runtime import adoption, failover
from agiledart.runtime.appstate import AppRecord, AppState
from agiledart.runtime.epochs import Epoch
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.hostcalls import Newer
from agiledart.runtime.hosting import Hosting
from agiledart.runtime.links import Address
from agiledart.runtime.records import record_key
from agiledart.runtime.scheduler import Scheduler
from agiledart.runtime.takeover import left_to


class Store:
    """The DHT records store, in a dict."""

    def __init__(self) -> None:
        self.data: dict[int, Any] = {}

    async def put(self, key: int, value: Any) -> None:
        self.data[key] = copy.deepcopy(value)

    async def add(self, key: int, *members: Any) -> None:
        self.data.setdefault(key, []).extend(members)

    async def get(self, key: int) -> Any:
        return copy.deepcopy(self.data.get(key))


def scheduler(name: str, port: int, store: Store) -> Scheduler:
    """A scheduler on ``127.0.0.1:port`` over ``store``, with no links: the tests
    replace the methods that would ask other peers."""

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


def test_a_declined_adoption_is_tried_again_once_the_scheduler_stops_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adoption, "REVISIT_S", 0.01)
    store = Store()
    rec = running_record("q-0")  # scheduled by edge-1
    store.data[record_key("scheduling", "edge-1")] = ["q-0"]
    store.data[record_key("app", "q-0")] = rec.to_wire()

    s = scheduler("sensor-1", 2, store)
    answering = [True]
    asked: list[Address] = []
    rebound: list[str] = []

    async def still_scheduled(address: Address, app_id: str) -> bool:
        asked.append(address)
        return answering[0]

    async def silent_hosts(rec: AppRecord) -> list[str]:
        return []

    async def rebind(rec: AppRecord) -> None:
        rebound.append(rec.app_id)

    monkeypatch.setattr(s, "still_scheduled", still_scheduled)
    monkeypatch.setattr(s.adoption, "silent_hosts", silent_hosts)
    monkeypatch.setattr(s.adoption, "rebind", rebind)

    async def run() -> None:
        await s.adopt_from("edge-1")  # edge-1 still answers: not adopted
        assert "q-0" not in s.apps
        await asyncio.sleep(0.05)
        assert "q-0" not in s.apps  # asked again meanwhile, and still answered
        answering[0] = False  # edge-1 is gone for good
        for _ in range(100):
            await asyncio.sleep(0.01)
            if rebound:
                break
        assert rebound == ["q-0"]
        assert s.apps["q-0"].scheduler_name == "sensor-1"
        assert store.data[record_key("scheduling", "sensor-1")] == ["q-0"]

    asyncio.run(run())
    assert all(a == ("127.0.0.1", 1) for a in asked)


def test_a_peer_never_adopts_an_app_it_schedules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chaos seeds 28, 32, 38 (fifth run): a peer that had just scheduled apps read its
    own ``scheduling`` record when it started (the take-back of a restarted scheduler),
    had another peer try to adopt them, which declined (the scheduler answered) and
    kept watching it: a second adopter racing the real one once it died."""
    store = Store()
    rec = running_record("q-0")  # scheduled by edge-1, and edge-1 is this peer
    store.data[record_key("scheduling", "edge-1")] = ["q-0"]
    store.data[record_key("app", "q-0")] = rec.to_wire()

    s = scheduler("edge-1", 1, store)
    s.hold(rec)
    asked: list[Address] = []

    async def still_scheduled(address: Address, app_id: str) -> bool:
        asked.append(address)
        return s.schedules(app_id)

    monkeypatch.setattr(s, "still_scheduled", still_scheduled)
    asyncio.run(s.adopt_from("edge-1"))
    assert asked == []
    assert s.apps["q-0"] is rec
    assert not s.adoption.revisiting


def contact(name: str, node_id: int) -> Contact:
    return Contact(node_id=node_id, host="127.0.0.1", port=node_id, name=name)


def test_a_death_left_to_a_neighbour_that_died_too_is_taken_up_on_its_death() -> None:
    """Chaos seed 64: a scheduler (id 0b1000) and its closest neighbour (0b1001) killed
    together. The peer next closest (0b1100, "me") saw the scheduler's death first,
    while the neighbour still counted as live, and deferred to it; once the neighbour
    was declared dead too, nobody revisited the first death and its apps were never
    adopted. The first death is now recomputed on the second."""
    me, scheduler, neighbour = 0b1100, contact("edge-2", 0b1000), contact("edge-4", 0b1001)
    far = contact("sensor-1", 0b0001)
    both = [scheduler, neighbour, far]
    assert left_to(me, scheduler, [scheduler], both) == []  # the neighbour adopts
    # the neighbour's death: its own and the scheduler's are both this peer's now
    assert left_to(me, neighbour, [neighbour, scheduler], both) == [neighbour, scheduler]
    # a peer farther away takes neither
    assert left_to(far.node_id, neighbour, [neighbour, scheduler], [contact("me", me)]) == []


def test_an_adopter_recovers_a_host_that_restarted_while_nobody_scheduled_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chaos seed 3: a host (edge-2) restarted just as the app's scheduler (edge-1) was
    killed; it told the dead scheduler that it had lost its instances. Its adopter heard
    every host answer and only rebound the app, which never ended. The adopter now asks
    whether every host still runs the app, and restarts it, the host keeping its part."""
    store = Store()
    rec = running_record("q-0")  # scheduled by edge-1
    rec.placement, rec.sources, rec.sinks = {"count": ["edge-2"]}, {"in": "sensor-2"}, {}
    store.data[record_key("scheduling", "edge-1")] = ["q-0"]
    store.data[record_key("app", "q-0")] = rec.to_wire()

    s = scheduler("sensor-1", 2, store)
    restarts: list[tuple[str, bool]] = []
    rebound: list[str] = []

    async def gone(address: Address, app_id: str) -> bool:
        return False

    async def silent_hosts(rec: AppRecord) -> list[str]:
        return []

    async def runs(rec: AppRecord, peer: str) -> bool:
        return peer != "edge-2"

    async def rebind(rec: AppRecord) -> None:
        rebound.append(rec.app_id)

    async def restart_without(
        rec: AppRecord, dead: str, started: float, *, restarted: bool = False
    ) -> None:
        restarts.append((dead, restarted))

    monkeypatch.setattr(s, "still_scheduled", gone)
    monkeypatch.setattr(s.adoption, "silent_hosts", silent_hosts)
    monkeypatch.setattr(s.hosts, "runs", runs)
    monkeypatch.setattr(s.adoption, "rebind", rebind)
    monkeypatch.setattr(s.recovery, "restart_without", restart_without)
    asyncio.run(s.adopt_from("edge-1"))
    assert rebound == []
    assert restarts == [("edge-2", True)]
    assert s.apps["q-0"].scheduler_name == "sensor-1"


def test_a_death_declared_after_the_restart_it_was_recovered_from_recovers_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host restarted (a power cut): the scheduler, told by the host itself, restarted
    the app with the host keeping its part. The failure detector, slower, declared the
    host dead afterwards, and the app was restarted a second time for the same restart.
    A death now recovers nothing when the peer answers and runs the current generation."""
    store = Store()
    rec = running_record("q-0")
    rec.scheduler, rec.scheduler_name = ("127.0.0.1", 2), "sensor-1"
    rec.placement, rec.sources, rec.sinks = {"count": ["edge-2"]}, {"in": "sensor-2"}, {}

    s = scheduler("sensor-1", 2, store)
    s.hold(rec)
    restarts: list[str] = []
    running = [True]

    async def runs_now(rec: AppRecord, peer: str) -> bool:
        return running[0]

    async def restart_without(
        rec: AppRecord, dead: str, started: float, *, restarted: bool = False
    ) -> None:
        restarts.append(dead)

    monkeypatch.setattr(s.hosts, "runs_now", runs_now)
    monkeypatch.setattr(s.recovery, "restart_without", restart_without)
    asyncio.run(s.recover("q-0", "edge-2"))
    assert restarts == []
    running[0] = False  # really gone: recovered
    asyncio.run(s.recover("q-0", "edge-2"))
    assert restarts == ["edge-2"]


def test_an_adopter_does_not_restart_an_app_its_slow_scheduler_ended_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chaos seed 47 (run 8): the scheduler and its adopter were frozen together; let go,
    the scheduler ended the app (its sink had finished) and undeployed it while the
    adopter, which took it for dead, found hosts that no longer ran the app and
    restarted it: the new run started the output file over under a `finished` app."""
    store = Store()
    rec = running_record("q-0")  # scheduled by edge-1
    rec.placement, rec.sources, rec.sinks = {"count": ["edge-2"]}, {"in": "sensor-2"}, {}
    store.data[record_key("scheduling", "edge-1")] = ["q-0"]
    store.data[record_key("app", "q-0")] = rec.to_wire()

    s = scheduler("sensor-1", 2, store)
    restarts: list[str] = []

    async def gone(address: Address, app_id: str) -> bool:
        return False  # edge-1 answers "not mine": it is ending the app

    async def silent_hosts(rec: AppRecord) -> list[str]:
        return []

    async def undeployed(rec: AppRecord, peer: str) -> bool:
        ended = AppRecord.from_wire(store.data[record_key("app", "q-0")])
        if ended.live:  # edge-1 saved the end, then undeployed
            ended.move_to(AppState.FINISHED)
        store.data[record_key("app", "q-0")] = ended.to_wire()
        return False

    async def restart_without(
        rec: AppRecord, dead: str, started: float, *, restarted: bool = False
    ) -> None:
        restarts.append(dead)

    monkeypatch.setattr(s, "still_scheduled", gone)
    monkeypatch.setattr(s.adoption, "silent_hosts", silent_hosts)
    monkeypatch.setattr(s.hosts, "runs", undeployed)
    monkeypatch.setattr(s.recovery, "restart_without", restart_without)
    asyncio.run(s.adopt_from("edge-1"))
    assert restarts == []
    assert "q-0" not in s.apps


def test_a_sources_peer_that_misses_one_probe_does_not_fail_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator's peer died; the source's peer, loaded, missed the one probe that
    asked which other hosts were gone, and the app failed as if the source had died.
    It now gets the source's grace: the app goes on to recover the operator."""
    store = Store()
    rec = running_record("q-0")
    rec.placement, rec.sources, rec.sinks = {"count": ["edge-2"]}, {"in": "sensor-2"}, {}
    s = scheduler("edge-1", 1, store)
    s.pinned_grace_s = 5.0
    probes: list[str] = []
    taken: list[str] = []

    async def answers(rec: AppRecord, peer: str) -> bool:
        probes.append(peer)
        return probes.count(peer) > 1  # the first probe goes unanswered

    async def takeover(lost: str, *, exclude: set[str]) -> None:
        taken.append(lost)

    monkeypatch.setattr(s.hosts, "answers", answers)
    monkeypatch.setattr(s.recovery, "_takeover", takeover)
    monkeypatch.setattr(s, "spec_of", lambda rec: None)  # not needed before the takeover
    with pytest.raises(AgiledartError, match="no live peer to take over"):
        asyncio.run(s.recovery.restart_without(rec, "edge-2", 0.0))
    assert probes == ["sensor-2", "sensor-2"]
    assert taken == ["edge-2"]


class Links:
    """Hosts that answer a barrier: ``lost`` ones run no instance of the app."""

    def __init__(self, lost: set[Address]) -> None:
        self.lost = lost
        self.sent: list[Address] = []

    async def request(self, address: Address, type: str, body: Any, timeout: float) -> Any:
        self.sent.append(address)
        if address in self.lost:
            raise UnknownApp(f"app {body['app_id']!r} is not deployed on it")
        return None


def test_a_source_peer_that_lost_its_instance_recovers_the_app() -> None:
    """Chaos seed 241 (a partition of the app's scheduler, 2 replays in 164 on 16 cores):
    the scheduler saw the app end but could not store its end (the records' holders were
    cut off), undeployed it, and was declared dead; its adopter, with the record still
    saying running, sent barriers that every source's peer refused (not deployed) for
    ever. A source's peer that runs no instance now makes the app recover."""
    rec = running_record("q-0")
    rec.sources = {"in": "sensor-1", "more": "sensor-2"}
    rec.addresses = {"sensor-1": ["127.0.0.2", 1], "sensor-2": ["127.0.0.3", 1]}
    s = scheduler("edge-1", 1, Store())
    s.links = Links({("127.0.0.2", 1)})  # type: ignore[assignment]
    recovered: list[tuple[str, str, bool]] = []

    async def recover(app_id: str, dead: str, *, restarted: bool = False) -> None:
        recovered.append((app_id, dead, restarted))

    s.recovery.recover = recover  # type: ignore[method-assign]

    async def cut() -> None:
        await s.checkpoints._barriers(rec, Epoch(epoch=4, started=0.0, generation=0))
        await asyncio.sleep(0)  # the recovery runs as the scheduler's task

    asyncio.run(cut())
    assert sorted(s.links.sent) == [("127.0.0.2", 1), ("127.0.0.3", 1)]  # type: ignore[attr-defined]
    assert recovered == [("q-0", "sensor-1", True)]


def test_barriers_that_every_source_peer_takes_recover_nothing() -> None:
    rec = running_record("q-0")
    rec.sources = {"in": "sensor-1"}
    rec.addresses = {"sensor-1": ["127.0.0.2", 1]}
    s = scheduler("edge-1", 1, Store())
    s.links = Links(set())  # type: ignore[assignment]
    recovered: list[str] = []

    async def recover(app_id: str, dead: str, *, restarted: bool = False) -> None:
        recovered.append(dead)

    s.recovery.recover = recover  # type: ignore[method-assign]
    asyncio.run(s.checkpoints._barriers(rec, Epoch(epoch=1, started=0.0, generation=0)))
    assert recovered == []


def adopted_meanwhile(store: Store) -> AppRecord:
    """Chaos seed 10 (1 replay in 13 on 2 cores): the app's scheduler edge-1 was frozen
    for 5 s; sensor-1 took it for dead, adopted the app and restarted it (generation
    1, the file sink starting its output over). Let go, edge-1 took the sink reports
    held up while it was frozen (generation 0), ended the app and undeployed every
    instance, the adopter's run with them: the app `finished` with 1,297 of 4,800
    records. ``store`` now holds the adopter's record; the result is edge-1's own."""
    adopter = running_record("q-0")
    adopter.scheduler, adopter.scheduler_name = ("127.0.0.1", 2), "sensor-1"
    adopter.generation = 1
    store.data[record_key("app", "q-0")] = adopter.to_wire()
    rec = running_record("q-0")  # edge-1's, from before its freeze
    rec.placement, rec.sources, rec.sinks = (
        {"count": ["edge-2"]},
        {"in": "sensor-2"},
        {"out": "edge-3"},
    )
    rec.addresses = {p: ["127.0.0.9", 1] for p in ("edge-2", "sensor-2", "edge-3")}
    return rec


def test_a_scheduler_adopted_while_frozen_ends_nothing_of_its_adopters_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store()
    rec = adopted_meanwhile(store)
    s = scheduler("edge-1", 1, store)
    s.hold(rec)
    undeployed: list[int] = []
    restarts: list[str] = []

    async def gather(rec: AppRecord) -> dict[str, Any]:
        return {}

    async def undeploy(rec: AppRecord, *, fenced: bool = False) -> list[Any]:
        undeployed.append(rec.generation)
        return []

    async def restart_without(
        rec: AppRecord, dead: str, started: float, *, restarted: bool = False
    ) -> None:
        restarts.append(dead)

    async def runs_now(rec: AppRecord, peer: str) -> bool:
        return False

    monkeypatch.setattr(s.hosts, "gather", gather)
    monkeypatch.setattr(s.hosts, "undeploy", undeploy)
    monkeypatch.setattr(s.hosts, "runs_now", runs_now)
    monkeypatch.setattr(s.recovery, "restart_without", restart_without)
    asyncio.run(s.recover("q-0", "edge-2"))  # a failure reported while it was frozen
    assert restarts == []
    s.hold(rec)
    asyncio.run(s.sink_done("q-0", "out", {}, generation=0))  # the held-up sink report
    assert undeployed == []
    assert "q-0" not in s.apps  # stepped down
    stored = AppRecord.from_wire(store.data[record_key("app", "q-0")])
    assert (stored.scheduler_name, stored.live, stored.generation) == ("sensor-1", True, 1)


def test_a_recovery_steps_down_where_another_scheduler_runs_a_newer_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same race, closer: the adopter's record is not stored yet (it stores it
    once its install is done), so only the hosts know; their newer instances refuse a
    fenced undeploy, and the frozen scheduler steps down instead of installing."""
    rec = adopted_meanwhile(Store())
    s = scheduler("edge-1", 1, Store())  # the record as edge-1 last stored it
    s.hold(rec)
    installs: list[int] = []

    async def answers(rec: AppRecord, peer: str) -> bool:
        return True

    async def undeploy(rec: AppRecord, *, fenced: bool = False) -> list[Newer]:
        assert fenced
        return [Newer("edge-3", 1, ("127.0.0.1", 2))]

    async def install(rec: AppRecord, *args: Any, **kwargs: Any) -> None:
        installs.append(rec.generation)

    monkeypatch.setattr(s.hosts, "answers", answers)
    monkeypatch.setattr(s.hosts, "undeploy", undeploy)
    monkeypatch.setattr(s, "install", install)
    monkeypatch.setattr(s, "spec_of", lambda rec: None)
    monkeypatch.setattr(failover, "pinned_peers", lambda spec, rec: set())
    asyncio.run(s.recovery.restart_without(rec, "edge-2", 0.0, restarted=True))
    assert installs == []
    assert "q-0" not in s.apps


def test_a_host_stops_no_instance_newer_than_a_fenced_undeploy_names() -> None:
    rt = SimpleNamespace(instances={}, rebound={}, relay=None)
    hosting = Hosting(rt)  # type: ignore[arg-type]
    closed: list[int] = []

    class Instance:
        def __init__(self, generation: int) -> None:
            self.generation = generation
            self.app_id = "q-0"
            self.deployment = SimpleNamespace(app_id="q-0", scheduler=("127.0.0.1", 2))

        async def aclose(self) -> None:
            closed.append(self.generation)

    hosting.manifest_changed = lambda: None  # type: ignore[method-assign]
    rt.instances["q-0"] = Instance(1)
    kept = asyncio.run(hosting.undeploy({"app_id": "q-0", "generation": 0}, None))  # type: ignore[arg-type]
    assert kept == {"undeployed": False, "generation": 1, "scheduler": ["127.0.0.1", 2]}
    assert closed == []
    done = asyncio.run(hosting.undeploy({"app_id": "q-0", "generation": 1}, None))  # type: ignore[arg-type]
    assert done == {"undeployed": True}
    rt.instances["q-0"] = Instance(3)  # a user's stop (unfenced) stops whatever runs
    assert asyncio.run(hosting.undeploy({"app_id": "q-0"}, None)) == {"undeployed": True}  # type: ignore[arg-type]
    assert closed == [1, 3]


def test_an_adopter_ends_an_app_whose_sinks_all_ended_while_nobody_scheduled_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chaos seed 10 again, from the adopter's side: the sink's end went to the frozen
    scheduler, and the adopter, finding the stateful operator's peer down, restarted
    the app; the restart started the output file over under an app that had finished.
    An adopter now asks the sinks' peers first: every sink ended, so the app ends."""
    store = Store()
    rec = running_record("q-0")  # scheduled by edge-1
    rec.placement, rec.sources, rec.sinks = (
        {"count": ["edge-2"]},
        {"in": "sensor-2"},
        {"out": "edge-3"},
    )
    rec.addresses = {p: ["127.0.0.9", 1] for p in ("edge-2", "sensor-2", "edge-3")}
    store.data[record_key("scheduling", "edge-1")] = ["q-0"]
    store.data[record_key("app", "q-0")] = rec.to_wire()
    s = scheduler("sensor-1", 2, store)
    restarts: list[str] = []
    asked: list[str] = []

    async def gone(address: Address, app_id: str) -> bool:
        return False

    async def silent_hosts(rec: AppRecord) -> list[str]:
        return ["edge-2"]  # restarting

    async def app_stats(rec: AppRecord, peer: str, timeout: float) -> tuple[bool, Any]:
        asked.append(peer)
        return True, {"generation": 0, "sinks": {"out": {"ended": True, "records": 4800}}}

    async def quietly(rec: AppRecord, *, fenced: bool = False) -> list[Any]:
        return []

    async def gather(rec: AppRecord) -> dict[str, Any]:
        return {}

    async def restart_without(
        rec: AppRecord, dead: str, started: float, *, restarted: bool = False
    ) -> None:
        restarts.append(dead)

    monkeypatch.setattr(s, "still_scheduled", gone)
    monkeypatch.setattr(s.adoption, "silent_hosts", silent_hosts)
    monkeypatch.setattr(s.hosts, "_app_stats", app_stats)
    monkeypatch.setattr(s.hosts, "undeploy", quietly)
    monkeypatch.setattr(s.hosts, "gather", gather)
    monkeypatch.setattr(s.recovery, "restart_without", restart_without)
    asyncio.run(s.adopt_from("edge-1"))
    assert asked == ["edge-3"]
    assert restarts == []
    stored = AppRecord.from_wire(store.data[record_key("app", "q-0")])
    assert (stored.state, stored.scheduler_name) == (AppState.FINISHED, "sensor-1")
