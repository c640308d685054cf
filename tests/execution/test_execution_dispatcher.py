"""EdgeWise's dispatcher (agiledart.runtime.execution.policy.Dispatcher)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.runtime.execution.policy import Dispatcher

KEYS = "abcde"


def make(
    sizes: dict[str, int],
    workers: int = 1,
    policy: str = "edgewise",
    patience: int = 8,
    holder: dict[str, int] | None = None,
) -> Dispatcher[str]:
    return Dispatcher(
        workers,
        policy,
        pending=lambda key: sizes.get(key, 0),
        rng=random.Random(7),
        patience=patience,
        holder=None if holder is None else holder.get,
    )


@pytest.mark.parametrize(
    ("workers", "policy", "patience"),
    [(0, "edgewise", 8), (2, "fifo", 8), (2, "edgewise", 0)],
)
def test_bad_configuration_is_refused(workers: int, policy: str, patience: int) -> None:
    with pytest.raises(ValueError, match=r"worker|policy|patience"):
        make({}, workers=workers, policy=policy, patience=patience)


def test_edgewise_serves_the_longest_queues_first() -> None:
    sizes = {"a": 3, "b": 10, "c": 5}
    d = make(sizes, workers=2)
    for key in "abc":
        d.want(key)
    assert d.dispatch() == [(0, "b"), (1, "c")]
    assert d.running == {0: "b", 1: "c"}
    assert list(d.waiting) == ["a"]
    assert d.free == 0
    assert d.dispatch() == []


def test_empty_queues_are_dropped_at_dispatch() -> None:
    sizes = {"a": 0, "b": 2}
    d = make(sizes, workers=2)
    d.want("a")
    d.want("b")
    assert d.dispatch() == [(0, "b")]
    assert list(d.waiting) == []
    assert d.free == 1


def test_want_is_idempotent_and_done_puts_back_a_refilled_queue() -> None:
    sizes = {"a": 1}
    d = make(sizes)
    d.want("a")
    d.want("a")
    assert list(d.waiting) == ["a"]
    assert d.dispatch() == [(0, "a")]
    d.want("a")  # running: a no-op, done() looks at the queue again
    assert list(d.waiting) == []
    assert d.done(0) == "a"
    assert list(d.waiting) == ["a"]
    assert d.dispatch() == [(0, "a")]
    sizes["a"] = 0
    d.done(0)
    assert list(d.waiting) == []
    assert d.free == 1


def test_cancel_drops_waiting_and_keeps_running_until_done() -> None:
    sizes = {"a": 5, "b": 5}
    d = make(sizes)
    d.want("a")
    d.want("b")
    assert d.dispatch() == [(0, "a")]
    d.cancel("b")
    d.cancel("a")
    assert list(d.waiting) == []
    assert d.running == {0: "a"}
    assert d.done(0) == "a"
    assert list(d.waiting) == []  # cancelled: not put back although it has work
    d.want("a")
    assert d.dispatch() == [(0, "a")]
    d.cancel("a")
    d.want("a")  # wanted again while still running: put back by done()
    d.done(0)
    assert list(d.waiting) == ["a"]


def test_done_for_an_idle_worker_is_an_error() -> None:
    d = make({}, workers=2)
    with pytest.raises(ValueError, match="worker 1"):
        d.done(1)


def test_running_is_read_only() -> None:
    d = make({"a": 1})
    d.want("a")
    d.dispatch()
    with pytest.raises(TypeError):
        d.running[1] = "b"  # type: ignore[index]


def test_holder_gets_its_key_when_free() -> None:
    sizes = {"a": 9, "b": 5, "c": 1}
    d = make(sizes, workers=3, holder={"a": 2, "b": 2})
    for key in "abc":
        d.want(key)
    # a goes to its holder 2; b's holder is taken, so the lowest free worker.
    assert d.dispatch() == [(2, "a"), (0, "b"), (1, "c")]


def test_a_short_queue_is_not_starved_by_longer_ones() -> None:
    sizes = {"big1": 100, "big2": 90, "small": 1}
    patience = 3
    d = make(sizes, patience=patience)
    for key in sizes:
        d.want(key)
    served = []
    for _ in range(patience + len(sizes)):
        [(worker, key)] = d.dispatch()
        served.append(key)
        d.done(worker)
    assert "small" in served
    # Without the guard it never runs: big1 and big2 always have more pending.
    assert served.index("small") <= patience + len(sizes) - 1


def test_random_policy_covers_every_key() -> None:
    sizes = dict.fromkeys("abcdefghij", 5)
    d = make(sizes, policy="random", patience=10**9)
    for key in sizes:
        d.want(key)
    served: Counter[str] = Counter()
    for _ in range(200):
        [(worker, key)] = d.dispatch()
        served[key] += 1
        d.done(worker)
    assert set(served) == set(sizes)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("want"), st.sampled_from(KEYS)),
        st.tuples(st.just("arrive"), st.sampled_from(KEYS), st.integers(1, 9)),
        st.tuples(st.just("drain"), st.sampled_from(KEYS)),
        st.tuples(st.just("dispatch")),
        st.tuples(st.just("done"), st.integers(0, 3)),
        st.tuples(st.just("cancel"), st.sampled_from(KEYS)),
    ),
    max_size=120,
)


@settings(max_examples=400, deadline=None)
@given(
    ops=operations,
    workers=st.integers(1, 3),
    patience=st.integers(1, 5),
    policy=st.sampled_from(["edgewise", "random"]),
    seed=st.integers(0, 2**32),
)
def test_invariants_hold_for_any_sequence(
    ops: list[tuple[object, ...]], workers: int, patience: int, policy: str, seed: int
) -> None:
    sizes: dict[str, int] = {}
    holders = {key: i % (workers + 1) for i, key in enumerate(KEYS)}  # some never free
    d: Dispatcher[str] = Dispatcher(
        workers,
        policy,
        pending=lambda key: sizes.get(key, 0),
        rng=random.Random(seed),
        patience=patience,
        holder=holders.get,
    )
    passed_over: Counter[str] = Counter()  # decisions that passed a key over, in a row
    bound = patience + len(KEYS) - 1
    for op in ops:
        match op:
            case ("want", str(key)):
                d.want(key)
            case ("arrive", str(key), int(n)):
                sizes[key] = sizes.get(key, 0) + n
                d.want(key)
            case ("drain", str(key)):
                sizes[key] = 0
            case ("done", int(worker)):
                if worker in d.running:
                    d.done(worker)
            case ("cancel", str(key)):
                d.cancel(key)
            case ("dispatch",):
                candidates = {key for key in d.waiting if sizes.get(key, 0) > 0}
                free_before = sorted(set(range(workers)) - set(d.running))
                assigned = d.dispatch()
                keys = [key for _, key in assigned]
                assert all(sizes.get(key, 0) > 0 for key in keys)
                assert set(keys) <= candidates
                if d.free:
                    assert not [key for key in d.waiting if sizes.get(key, 0) > 0]
                for worker, key in assigned:  # affinity: the holder if free, else the lowest
                    held = holders[key]
                    assert worker == (held if held in free_before else free_before[0])
                    free_before.remove(worker)
                for key in candidates - set(keys):
                    passed_over[key] += len(assigned)
                    assert passed_over[key] <= bound, (key, passed_over[key])
        running = list(d.running.values())
        assert len(running) == len(set(running))
        assert not set(running) & set(d.waiting)
        assert d.free + len(running) == workers
        for key in set(passed_over) - set(d.waiting):
            del passed_over[key]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.dictionaries(st.sampled_from(KEYS), st.integers(0, 20), min_size=1),
    workers=st.integers(1, 4),
)
def test_edgewise_picks_the_longest_when_nobody_waited_too_long(
    sizes: dict[str, int], workers: int
) -> None:
    d = make(sizes, workers=workers, patience=10**9)
    for key in sizes:
        d.want(key)
    chosen = [key for _, key in d.dispatch()]
    rest = [n for key, n in sizes.items() if key not in chosen and n > 0]
    assert len(chosen) == min(workers, len([n for n in sizes.values() if n > 0]))
    assert all(sizes[key] >= max(rest, default=0) for key in chosen)
    assert [sizes[key] for key in chosen] == sorted((sizes[key] for key in chosen), reverse=True)
