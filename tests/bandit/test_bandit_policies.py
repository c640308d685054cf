"""Policies on small hand-made graphs whose answers can be worked out by hand."""

from __future__ import annotations

import itertools
from collections.abc import Container

import numpy as np
import pytest

from agiledart.bandit import (
    BanditUsageError,
    EndToEndLcbRouting,
    Graph,
    KlUcbRouting,
    NextHopRouting,
    NoRouteError,
    OptimalRouting,
    costs_to_sink,
    kl_ucb_cost,
    optimal_path,
    paper_network,
)
from agiledart.bandit.paths import progress_links, route_from


def five_node() -> Graph:
    """Optimal s-b-t (2 + 2 = 4 slots); s-a-t 5, s-a-b-t 5, s-b-a-t 7; back links too."""
    return Graph.build(
        ["s", "a", "b", "t"],
        [
            ("s", "a", 1.0),
            ("a", "t", 0.25),
            ("s", "b", 0.5),
            ("b", "t", 0.5),
            ("a", "b", 0.5),
            ("b", "a", 1.0),
            ("a", "s", 1.0),
            ("b", "s", 1.0),
        ],
        source="s",
        sink="t",
        slot_ms=10.0,
        name="five",
    )


def simple_paths(g: Graph, start: int) -> list[list[int]]:
    """Every loop-free path (as links) from ``start`` to the sink, by brute force."""
    out: list[list[int]] = []

    def walk(v: int, seen: set[int], links: list[int]) -> None:
        if v == g.sink:
            out.append(list(links))
            return
        for link in g.out_links[v]:
            w = int(g.head[link])
            if w not in seen:
                walk(w, seen | {w}, [*links, link])

    walk(start, {start}, [])
    return out


def test_optimal_path_by_hand() -> None:
    g = five_node()
    links, delay = optimal_path(g)
    assert links == [g.link("s", "b"), g.link("b", "t")]
    assert delay == 40.0


def test_cost_to_go_is_the_cheapest_loop_free_path() -> None:
    g = paper_network(25, rng=np.random.default_rng(5))
    weights = np.random.default_rng(6).uniform(1, 20, g.n_links)
    j, succ = costs_to_sink(g, weights)
    for v in range(g.n_nodes):
        if v == g.sink:
            assert j[v] == 0
            continue
        links = route_from(g, succ, v)
        assert sum(weights[links]) == pytest.approx(j[v])
    brute = min(sum(weights[p]) for p in simple_paths(g, g.source))
    assert j[g.source] == pytest.approx(brute)


def test_agiledart_costs_by_hand() -> None:
    g = five_node()
    policy = KlUcbRouting(g, exploration=0.5)
    # Packet 1: everything untried, every ω is 1, J counts hops; s goes to a or b
    # (J 1 each) and the tie goes to the first link, s -> a.
    assert policy.omega.tolist() == [1.0] * g.n_links
    assert policy.cost_to_go.tolist() == [2.0, 1.0, 1.0, 0.0]
    assert policy.next_link(g.index("s"), {g.index("s")}) == g.link("s", "a")
    # Feedback: s -> a took 1 attempt, a -> t took 4. At τ = 1, ω = 1/θ̂.
    policy.record(g.link("s", "a"), 1, 1)
    policy.record(g.link("a", "t"), 4, 1)
    policy.begin_packet(1)
    assert policy.omega[g.link("a", "t")] == 4.0
    assert policy.cost_to_go.tolist() == [2.0, 2.0, 1.0, 0.0]  # a now better via b
    # At τ = 10 with C = 0.5, ω is the KL-UCB cost; J adds it up along the best path.
    policy.begin_packet(10)
    w_at = float(kl_ucb_cost(1, 4, 10, 0.5))
    assert 1.0 < w_at < 4.0
    assert policy.omega[g.link("a", "t")] == pytest.approx(w_at)
    assert policy.cost_to_go[g.index("a")] == pytest.approx(min(w_at, 2.0))
    assert policy.cost_to_go[g.index("s")] == 2.0  # s -> b -> t, both untried


def test_feedback_refreshes_omega_for_a_second_choice_at_the_same_node() -> None:
    g = five_node()
    policy = KlUcbRouting(g, exploration=1.0)
    policy.begin_packet(50)
    s = g.index("s")
    assert policy.next_link(s, {s}) == g.link("s", "a")
    policy.record(g.link("s", "a"), 30, 1)  # terrible so far: ω rises at once
    assert policy.next_link(s, {s}) == g.link("s", "b")


class Scripted:
    """A test policy that takes the given paths (node names), one per packet."""

    def __init__(self, g: Graph, paths: list[list[str]]) -> None:
        self.name = "scripted"
        self.g = g
        self.paths = paths
        self.current: dict[int, int] = {}

    def begin_packet(self, tau: int) -> None:
        names = self.paths[(tau - 1) % len(self.paths)]
        self.current = {self.g.index(a): self.g.link(a, b) for a, b in itertools.pairwise(names)}

    def next_link(self, node: int, visited: Container[int]) -> int:
        return self.current[node]

    def record(self, link: int, attempts: int, successes: int) -> None:
        pass


def deterministic() -> Graph:
    """All links certain: s-a-t takes 20 ms, s-b-c-t 30 ms."""
    return Graph.build(
        ["s", "a", "b", "c", "t"],
        [("s", "a", 1), ("a", "t", 1), ("s", "b", 1), ("b", "c", 1), ("c", "t", 1)],
        source="s",
        sink="t",
        slot_ms=10.0,
    )


def test_regret_by_hand() -> None:
    from agiledart.bandit import simulate

    g = deterministic()
    policy = Scripted(g, [["s", "b", "c", "t"], ["s", "a", "t"]])
    result = simulate(g, policy, packets=4, seed=0)
    assert result.optimal_delay_ms == 20.0
    assert result.delay_ms.tolist() == [30.0, 20.0, 30.0, 20.0]
    assert result.regret().tolist() == [10.0, 10.0, 20.0, 20.0]  # 100 - 4 * 20
    assert result.pseudo_regret().tolist() == [10.0, 10.0, 20.0, 20.0]
    assert result.on_optimal().tolist() == [False, True, False, True]
    assert result.trials_to_optimal(window=1) == 2
    assert result.trials_to_optimal(window=2) is None
    assert result.share_under(25.0) == 0.5


def test_pseudo_regret_by_hand() -> None:
    from agiledart.bandit import simulate

    g = five_node()
    # s-a-t: 1 + 4 slots expected = 50 ms against D(p*) = 40 ms.
    result = simulate(g, Scripted(g, [["s", "a", "t"]]), packets=7, seed=3)
    assert result.pseudo_regret()[-1] == pytest.approx(7 * 10.0)
    assert result.regret()[-1] == pytest.approx(result.delay_ms.sum() - 7 * 40.0)
    assert (result.delay_ms >= 20.0).all()  # two hops, at least one slot each


def test_deterministic_graph_every_policy_finds_p_star_at_once() -> None:
    from agiledart.bandit import simulate

    g = deterministic()
    for policy in (
        KlUcbRouting(g),
        EndToEndLcbRouting(g),
        NextHopRouting(g),
        OptimalRouting(g),
        KlUcbRouting(g, hops=1),
    ):
        result = simulate(g, policy, packets=20, seed=1)
        assert result.regret()[-1] == 0.0, policy.name
        assert result.trials_to_optimal() == 1


def all_policies(
    g: Graph,
) -> list[KlUcbRouting | EndToEndLcbRouting | NextHopRouting | OptimalRouting]:
    return [
        KlUcbRouting(g),
        KlUcbRouting(g, exploration=0.01),
        KlUcbRouting(g, hops=1),
        KlUcbRouting(g, hops=2),
        KlUcbRouting(g, hops=3),
        EndToEndLcbRouting(g),
        NextHopRouting(g),
        OptimalRouting(g),
    ]


@pytest.mark.parametrize("graph", [five_node(), paper_network(36, rng=np.random.default_rng(2))])
def test_every_policy_routes_loop_free_from_source_to_sink(graph: Graph) -> None:
    from agiledart.bandit import simulate

    for policy in all_policies(graph):
        result = simulate(graph, policy, packets=150, seed=4)
        for path in result.paths:
            assert int(graph.tail[path[0]]) == graph.source
            assert int(graph.head[path[-1]]) == graph.sink
            for a, b in itertools.pairwise(path):
                assert graph.head[a] == graph.tail[b]
            nodes = [graph.source, *(int(graph.head[link]) for link in path)]
            assert len(set(nodes)) == len(nodes), policy.name


def test_agiledart_learns_the_optimal_path_on_the_small_graph() -> None:
    from agiledart.bandit import simulate

    g = five_node()
    result = simulate(g, KlUcbRouting(g, exploration=0.5), packets=400, seed=9)
    assert result.on_optimal()[-100:].mean() > 0.9
    assert result.trials_to_optimal() is not None


def test_hop_limited_variants_look_only_that_far() -> None:
    g = five_node()
    s = g.index("s")
    # Progress links only: s -> a and s -> b are both 2 -> 1 hop; a -> b, b -> a are not.
    assert progress_links(g).tolist() == [True, True, True, True, False, False, False, False]
    one = KlUcbRouting(g, hops=1, exploration=0.5)
    two = KlUcbRouting(g, hops=2, exploration=0.5)
    for policy in (one, two):
        policy.record(g.link("s", "a"), 1, 1)  # ω(s, a) = 1
        policy.record(g.link("s", "b"), 2, 1)  # ω(s, b) = 2
        policy.record(g.link("a", "t"), 8, 1)  # ω(a, t) = 8
        policy.record(g.link("b", "t"), 1, 1)  # ω(b, t) = 1
        policy.begin_packet(1)
    assert one.next_link(s, {s}) == g.link("s", "a")  # 1 < 2: the next link only
    assert two.next_link(s, {s}) == g.link("s", "b")  # 1 + 8 > 2 + 1
    assert one.cost_to_go.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert two.cost_to_go.tolist() == [1.0, 8.0, 1.0, 0.0]


def test_no_route_and_bad_feedback() -> None:
    g = five_node()
    policy = KlUcbRouting(g)
    s, a, b = (g.index(x) for x in "sab")
    with pytest.raises(NoRouteError):
        policy.next_link(a, {s, a, b, g.index("t")})
    with pytest.raises(BanditUsageError):
        policy.record(0, 1, 2)
    with pytest.raises(BanditUsageError):
        policy.record(99, 1, 1)
    with pytest.raises(BanditUsageError):
        KlUcbRouting(g, hops=0)
    with pytest.raises(BanditUsageError):
        KlUcbRouting(g, exploration=2.0)
    with pytest.raises(BanditUsageError):
        EndToEndLcbRouting(g, alpha=0)
    with pytest.raises(BanditUsageError):
        OptimalRouting(g).next_link(a, {s})
