"""The zone logic as pure objects: hop budget, the discovery walk, the 50-app cap,
election, adverts (paper §VI, §VII-E)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.zones import (
    APP_CAP,
    Answer,
    Candidate,
    SchedulerAd,
    Walk,
    ZoneError,
    ZoneView,
    drive,
    elect,
    estimate_peers,
    hop_budget,
)


@pytest.mark.parametrize(
    ("n", "hops"),
    [(1, 1), (2, 1), (16, 1), (17, 2), (256, 2), (257, 3), (1000, 3), (10_000, 4), (65_536, 4)],
)
def test_hop_budget_is_ceil_log16_n(n: int, hops: int) -> None:
    assert hop_budget(n) == hops


def test_hop_budget_refuses_nonsense() -> None:
    with pytest.raises(ZoneError):
        hop_budget(0)
    with pytest.raises(ZoneError):
        hop_budget(10, b=0)


def test_ring_size_estimate_from_the_leaf_set_density() -> None:
    rng = random.Random(3)
    ids = [rng.getrandbits(160) for _ in range(5000)]
    me = ids[0]
    leaf = sorted(ids[1:], key=lambda i: i ^ me)[:8]
    n = estimate_peers(me, leaf, 8, known=200)
    assert 1000 < n < 25_000  # the right order of magnitude from 8 neighbours
    assert estimate_peers(me, leaf[:3], 8, known=3) == 4  # a small ring: everyone known


# -- the walk over a synthetic zone -----------------------------------------------------------


def line(n: int, zone: str = "z") -> dict[str, list[tuple[str, str]]]:
    """Peers p0 - p1 - ... - p(n-1), each knowing its two neighbours."""
    return {f"p{i}": [(f"p{j}", zone) for j in (i - 1, i + 1) if 0 <= j < n] for i in range(n)}


def asker(
    graph: dict[str, list[tuple[str, str]]],
    schedulers: dict[str, int],
    zone_of: Callable[[str], str] = lambda _: "z",
) -> Callable[[str], Answer]:
    def ask(name: str) -> Answer:
        ads = ()
        if name in schedulers:
            ads = (SchedulerAd(name, zone_of(name), schedulers[name], 1.0),)
        me = Candidate(name, zone_of(name), scheduler=name in schedulers)
        return Answer(me, ads, tuple(graph[name]))

    return ask


def walk_from(origin: str, ask: Callable[[str], Answer], budget: int) -> Walk:
    walk = Walk(origin=origin, zone="z", budget=budget, rng=random.Random(1), fanout=2)
    walk.answer(ask(origin))
    return walk


@pytest.mark.parametrize("distance", [0, 1, 2, 3, 4])
def test_a_scheduler_d_hops_away_is_found_at_hop_d(distance: int) -> None:
    ask = asker(line(8), {f"p{distance}": 3})
    found = drive(walk_from("p0", ask, budget=4), ask)
    assert found.found is not None
    assert found.found.name == f"p{distance}"
    assert found.hops == distance


def test_nothing_within_the_budget_ends_the_walk_at_the_budget() -> None:
    ask = asker(line(10), {"p5": 0})
    found = drive(walk_from("p0", ask, budget=4), ask)
    assert found.found is None
    assert found.hops == 4
    assert set(found.met) == {"p0", "p1", "p2", "p3", "p4"}  # the electorate


def test_a_full_scheduler_is_passed_over_for_one_with_room_further_away() -> None:
    ask = asker(line(8), {"p1": APP_CAP, "p3": APP_CAP - 1})
    found = drive(walk_from("p0", ask, budget=4), ask)
    assert found.found is not None
    assert (found.found.name, found.hops) == ("p3", 3)


def test_a_refusal_by_the_authority_sends_the_walk_on() -> None:
    """The advert said 10 apps, but the scheduler is full now: it refuses."""
    ask = asker(line(8), {"p1": 10, "p2": 4})
    walk = walk_from("p0", ask, budget=4)
    first = drive(walk, ask)
    assert first.found is not None
    assert first.found.name == "p1"
    walk.refused("p1")
    second = drive(walk, ask)
    assert second.found is not None
    assert (second.found.name, second.hops) == ("p2", 2)


def test_the_walk_stays_in_its_zone() -> None:
    """p1 is of another zone: the walk neither asks it nor takes its scheduler."""
    graph = {
        "p0": [("p1", "y"), ("p2", "z")],
        "p1": [("p0", "z"), ("p3", "z")],
        "p2": [("p0", "z")],
        "p3": [("p1", "y")],
    }
    ask = asker(graph, {"p1": 0, "p3": 0}, zone_of=lambda n: "y" if n == "p1" else "z")
    found = drive(walk_from("p0", ask, budget=3), ask)
    assert found.found is None
    assert "p1" not in found.met


def test_adverts_heard_by_gossip_are_found_at_hop_zero() -> None:
    ask = asker(line(8), {})
    ad = SchedulerAd("p6", "z", 7, 5.0)
    walk = Walk(origin="p0", zone="z", budget=4, rng=random.Random(1))
    walk.answer(Answer(Candidate("p0", "z"), (ad,), (("p1", "z"),)))
    found = drive(walk, ask)
    assert (found.found, found.hops, found.asked) == (ad, 0, 0)


def test_walk_rejects_a_bad_configuration() -> None:
    with pytest.raises(ZoneError):
        Walk(origin="a", zone="z", budget=-1, rng=random.Random())
    with pytest.raises(ZoneError):
        Walk(origin="a", zone="z", budget=2, rng=random.Random(), fanout=0)


# -- election ----------------------------------------------------------------------------------


CANDIDATES = [
    Candidate("a", "z", node_id=0b1000, cores=2, capacity=1.0),
    Candidate("b", "z", node_id=0b0100, cores=4, capacity=0.5),
    Candidate("c", "z", node_id=0b0010, cores=4, capacity=0.5),
    Candidate("d", "z", node_id=0b0001, cores=8, capacity=0.0),  # no spare capacity
    Candidate("e", "y", node_id=0b0011, cores=16, capacity=1.0),  # another zone
    Candidate("f", "z", node_id=0b0110, cores=16, capacity=1.0, scheduler=True),
    Candidate("g", "z", node_id=0b0111, cores=16, capacity=1.0, alive=False),
]


def test_election_takes_the_most_cores_then_the_nearest() -> None:
    chosen = elect(CANDIDATES, "z", near=0b0011)
    assert chosen is not None
    assert chosen.name == "c"  # b and c tie on cores and capacity; c is nearer 0b0011
    chosen = elect(CANDIDATES, "z", near=0b0101)
    assert chosen is not None
    assert chosen.name == "b"


def test_election_prefers_spare_capacity_among_equals() -> None:
    pool = [Candidate("x", "z", cores=2, capacity=0.3), Candidate("y", "z", cores=2, capacity=0.9)]
    chosen = elect(pool, "z")
    assert chosen is not None
    assert chosen.name == "y"


@given(st.permutations(CANDIDATES), st.integers(min_value=0, max_value=15))
@settings(max_examples=50, deadline=None)
def test_election_is_deterministic_whatever_the_order(pool: list[Candidate], near: int) -> None:
    assert elect(pool, "z", near=near) == elect(CANDIDATES, "z", near=near)


def test_nobody_capable_elects_nobody() -> None:
    assert elect(CANDIDATES[3:], "z") is None
    assert elect([], "z") is None


# -- adverts ---------------------------------------------------------------------------------


def test_the_view_keeps_the_newest_advert_and_stays_bounded() -> None:
    view = ZoneView(limit=3)
    assert view.learn([SchedulerAd("s", "z", 5, 2.0)])
    assert not view.learn([SchedulerAd("s", "z", 1, 1.0)])  # older: ignored
    assert view.learn([SchedulerAd("s", "z", APP_CAP, 3.0)])
    assert view.with_room("z") == []
    view.learn(SchedulerAd(f"t{i}", "z", i, 10.0 + i) for i in range(4))
    assert len(view) == 3
    assert view.get("s") is None  # the stalest went first


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        ["s"],
        ["", "z", 1, 1.0, None],
        ["s", "z", -1, 1.0, None],
        ["s", 3, 1, 1.0, None],
        ["s", "z", 1, "x", None],
        ["s", "z", 1, 1.0, ["h"]],
        ["s", "z", 1.5, 1.0, None],
    ],
)
def test_malformed_adverts_are_a_zone_error(raw: object) -> None:
    with pytest.raises(ZoneError):
        SchedulerAd.from_wire(raw)


def test_an_advert_survives_the_wire() -> None:
    ad = SchedulerAd("s", "z", 7, 12.5, ("10.0.0.1", 4000))
    assert SchedulerAd.from_wire(ad.to_wire()) == ad


# -- the live wire form of an answer (agiledart.runtime.zones) ------------------------------


def test_a_walk_answer_survives_the_wire() -> None:
    from agiledart.runtime.zones import _answer_from_wire, _answer_to_wire

    answer = Answer(
        Candidate("a", "z", node_id=7, cores=4, capacity=0.5, address=("10.0.0.1", 4000)),
        (SchedulerAd("s", "z", 3, 1.0, ("10.0.0.2", 4000)),),
        (("b", "z"), ("c", "")),
    )
    assert _answer_from_wire(_answer_to_wire(answer, {})) == answer


@given(st.recursive(st.none() | st.integers() | st.text(max_size=5), st.lists, max_leaves=8))
@settings(max_examples=100, deadline=None)
def test_any_garbage_answer_is_a_zone_error(raw: object) -> None:
    from agiledart.runtime.zones import _answer_from_wire

    with contextlib.suppress(ZoneError):  # anything else fails the test
        _answer_from_wire({"peer": raw, "ads": raw, "neighbours": raw})
