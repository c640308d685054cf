"""HopPlanner: one relay's view agrees with the whole-graph planner."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agiledart.bandit import (
    AdvertisementError,
    BanditUsageError,
    Graph,
    HopPlanner,
    KlUcbRouting,
    NoRouteError,
    paper_network,
    simulate,
)


def planners_for(g: Graph, policy: KlUcbRouting) -> list[HopPlanner]:
    """One HopPlanner per node, fed the same link statistics as ``policy``."""
    planners = []
    for v in range(g.n_nodes):
        planner = HopPlanner(
            [int(g.head[k]) for k in g.out_links[v]], exploration=policy.exploration
        )
        for k in g.out_links[v]:
            t, s = int(policy.stats.attempts[k]), int(policy.stats.successes[k])
            if t:
                planner.record_attempts(int(g.head[k]), t, s)
        planners.append(planner)
    return planners


def bellman_ford(g: Graph, planners: list[HopPlanner], tau: int) -> list[float]:
    """Synchronous rounds of advertisements until nothing changes."""
    j = [math.inf] * g.n_nodes
    j[g.sink] = 0.0
    for _ in range(g.n_nodes):
        for planner in planners:
            for w in planner.neighbours:
                planner.advertise(w, j[w])  # type: ignore[index]
        new = [0.0 if v == g.sink else p.cost_to_go(tau) for v, p in enumerate(planners)]
        if new == j:
            break
        j = new
    return j


def test_distributed_bellman_ford_reaches_the_central_j_and_decisions() -> None:
    g = paper_network(36, rng=np.random.default_rng(4))
    policy = KlUcbRouting(g, exploration=0.3)
    simulate(g, policy, packets=40, seed=1)  # some history
    tau = 41
    policy.begin_packet(tau)
    planners = planners_for(g, policy)
    j = bellman_ford(g, planners, tau)
    np.testing.assert_allclose(j, policy.cost_to_go, rtol=1e-12)
    for v in range(g.n_nodes):
        if v == g.sink:
            continue
        visited = {g.source, v}
        want = int(g.head[policy.next_link(v, visited)])
        assert planners[v].choose(tau, exclude=visited) == want
        k = g.link(g.node_ids[v], g.node_ids[want])
        assert planners[v].link_cost(want, tau) == pytest.approx(policy.omega[k], rel=1e-12)


def test_choice_cost_to_go_and_exclusion() -> None:
    relay = HopPlanner(["x", "y", "z"], exploration=0.5)
    relay.advertise("x", 3.0)
    relay.advertise("y", 1.0)
    assert relay.choose(1) == "y"  # all untried: ω = 1, so least J wins
    assert relay.cost_to_go(1) == 2.0
    assert relay.choose(1, exclude={"y"}) == "x"
    assert relay.cost_to_go(1, exclude={"y"}) == 4.0
    with pytest.raises(NoRouteError):
        relay.choose(1, exclude={"x", "y"})  # z has advertised nothing: J = inf
    # Per-attempt feedback: y fails nine times in ten; at τ = 1, ω(y) = 10.
    for i in range(10):
        relay.record("y", success=i == 0)
    assert relay.link_cost("y", 1) == 10.0
    assert relay.choose(1) == "x"
    # Later τ, more optimism for y.
    assert relay.link_cost("y", 1000) < 10.0
    states = {s.neighbour: s for s in relay.links()}
    assert (states["y"].attempts, states["y"].successes, states["y"].cost_to_go) == (10, 1, 1.0)


def test_membership_changes() -> None:
    relay = HopPlanner(["x", "y"])
    relay.advertise("x", 1.0)
    relay.record_attempts("x", 4, 1)
    relay.add_neighbour("z", cost_to_go=0.0)
    assert relay.choose(5) == "z"
    relay.remove_neighbour("x")
    assert relay.neighbours == ("y", "z")
    relay.record("z", success=True)
    assert [s.attempts for s in relay.links()] == [0, 1]
    with pytest.raises(BanditUsageError):
        relay.add_neighbour("z")


@pytest.mark.parametrize("bad", [-1.0, math.nan, "1", True])
def test_impossible_advertisements_are_remote_errors(bad: object) -> None:
    relay = HopPlanner(["x"])
    with pytest.raises(AdvertisementError):
        relay.advertise("x", bad)  # type: ignore[arg-type]


def test_local_misuse() -> None:
    relay = HopPlanner(["x"])
    with pytest.raises(BanditUsageError):
        relay.record("nobody", success=True)
    with pytest.raises(BanditUsageError):
        relay.record_attempts("x", 1, 2)
    with pytest.raises(BanditUsageError):
        relay.choose(0)
    with pytest.raises(BanditUsageError):
        HopPlanner(exploration=0.0)
