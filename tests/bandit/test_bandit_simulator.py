"""The regret simulator: determinism, common random numbers, trace records."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from agiledart.bandit import (
    BanditError,
    BanditUsageError,
    EndToEndLcbRouting,
    KlUcbRouting,
    NextHopRouting,
    OptimalRouting,
    paper_network,
    simulate,
)


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return paper_network(25, rng=np.random.default_rng(1))


def test_deterministic_given_the_seed(graph) -> None:  # type: ignore[no-untyped-def]
    a = simulate(graph, KlUcbRouting(graph), packets=60, seed=5)
    b = simulate(graph, KlUcbRouting(graph), packets=60, seed=5)
    c = simulate(graph, KlUcbRouting(graph), packets=60, seed=6)
    assert a.paths == b.paths
    np.testing.assert_array_equal(a.delay_ms, b.delay_ms)
    assert not np.array_equal(a.delay_ms, c.delay_ms)


def test_common_random_numbers_across_policies(graph) -> None:  # type: ignore[no-untyped-def]
    # Two policies that take the same path see the same delays, packet by packet.
    opt = simulate(graph, OptimalRouting(graph), packets=30, seed=2)
    again = simulate(graph, OptimalRouting(graph, name="again"), packets=30, seed=2)
    np.testing.assert_array_equal(opt.delay_ms, again.delay_ms)
    assert opt.pseudo_regret()[-1] == pytest.approx(0.0, abs=1e-9)


def test_realised_delays_are_geometric_with_the_right_mean(graph) -> None:  # type: ignore[no-untyped-def]
    result = simulate(graph, OptimalRouting(graph), packets=3000, seed=0)
    # Mean of 3000 sums of geometric delays: within 4 standard errors of D(p*).
    links = list(result.optimal_path)
    var = float(np.sum((1 - graph.theta[links]) / graph.theta[links] ** 2)) * graph.slot_ms**2
    assert abs(result.delay_ms.mean() - result.optimal_delay_ms) < 4 * np.sqrt(var / 3000)


def test_trace_records_one_plain_dict_per_hop(graph) -> None:  # type: ignore[no-untyped-def]
    records: list[dict[str, Any]] = []
    result = simulate(graph, NextHopRouting(graph), packets=5, seed=3, on_decision=records.append)
    assert len(records) == sum(len(p) for p in result.paths)
    first = records[0]
    assert set(first) == {
        "policy",
        "graph",
        "packet",
        "hop",
        "link",
        "from",
        "to",
        "attempts",
        "outcome",
        "delay_ms",
    }
    assert (first["policy"], first["graph"], first["packet"], first["hop"]) == (
        "next-hop",
        graph.name,
        1,
        0,
    )
    assert first["from"] == graph.node_ids[graph.source]
    for k in range(1, 6):
        mine = [r for r in records if r["packet"] == k]
        assert [r["hop"] for r in mine] == list(range(len(mine)))
        assert [r["link"] for r in mine] == list(result.paths[k - 1])
        assert sum(r["delay_ms"] for r in mine) == result.delay_ms[k - 1]
        assert all(r["attempts"] >= 1 and r["outcome"] == "delivered" for r in mine)


def test_agiledart_learns_faster_than_end_to_end(graph) -> None:  # type: ignore[no-untyped-def]
    # (Next-hop's greedy happens to hit p* at once on some graphs, so it is left to the
    # benchmark, which averages over many.)
    ours = simulate(graph, KlUcbRouting(graph, exploration=0.2), packets=400, seed=7)
    e2e = simulate(graph, EndToEndLcbRouting(graph), packets=400, seed=7)
    assert ours.pseudo_regret()[-1] < 0.5 * e2e.pseudo_regret()[-1]
    assert ours.on_optimal()[-100:].mean() > 0.7


class Looping:
    name = "looping"

    def begin_packet(self, tau: int) -> None:
        pass

    def next_link(self, node: int, visited: object) -> int:
        return 0

    def record(self, link: int, attempts: int, successes: int) -> None:
        pass


def test_a_policy_that_breaks_the_rules_is_caught(graph) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BanditError, match="not a loop-free link"):
        simulate(graph, Looping(), packets=1, seed=0)
    with pytest.raises(BanditUsageError):
        simulate(graph, OptimalRouting(graph), packets=0, seed=0)
