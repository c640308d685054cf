"""Graphs: the JSON file format, validation, the road-network generators."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agiledart.bandit import (
    EXPLORATION_NETWORKS,
    PAPER_SIZES,
    BanditUsageError,
    Graph,
    GraphError,
    exploration_network,
    load_graph,
    paper_network,
    road_network,
    save_graph,
)


def same_graph(a: Graph, b: Graph) -> None:
    assert a.node_ids == b.node_ids
    np.testing.assert_array_equal(a.tail, b.tail)
    np.testing.assert_array_equal(a.head, b.head)
    np.testing.assert_array_equal(a.theta, b.theta)
    assert (a.source, a.sink, a.slot_ms, a.name) == (b.source, b.sink, b.slot_ms, b.name)
    if a.positions is None:
        assert b.positions is None
    else:
        assert b.positions is not None
        np.testing.assert_array_equal(a.positions, b.positions)


def small() -> dict[str, Any]:
    return {
        "format": "agiledart-bandit-graph",
        "version": 1,
        "slot_ms": 10,
        "source": "s",
        "sink": "t",
        "nodes": ["s", "a", {"id": "t", "x": 1, "y": 2}],
        "links": [
            {"from": "s", "to": "a", "theta": 0.5},
            {"from": "a", "to": "t", "mean_delay_ms": 40},
        ],
    }


def test_round_trip_of_a_generated_graph(tmp_path: Path) -> None:
    g = paper_network(64, rng=np.random.default_rng(3))
    save_graph(g, tmp_path / "g.json")
    same_graph(g, load_graph(tmp_path / "g.json"))
    with pytest.raises(ValueError, match="read-only"):
        g.theta[0] = 0.5  # a graph is a value


def test_round_trip_of_a_hand_written_graph(tmp_path: Path) -> None:
    g = Graph.from_dict(small())
    assert g.theta.tolist() == [0.5, 0.25]
    assert g.mean_delay_ms.tolist() == [20.0, 40.0]
    assert g.positions is not None
    assert np.isnan(g.positions[0]).all()
    save_graph(g, tmp_path / "g.json")
    same_graph(g, load_graph(tmp_path / "g.json"))
    # The file is plain JSON (no NaN for missing coordinates).
    json.loads((tmp_path / "g.json").read_text(), parse_constant=pytest.fail)


def test_integer_ids_and_undirected_links() -> None:
    data = small() | {
        "nodes": [1, 2, 3],
        "source": 1,
        "sink": 3,
        "undirected": True,
        "links": [{"from": 1, "to": 2, "theta": 1}, {"from": 2, "to": 3, "theta": 0.5}],
    }
    g = Graph.from_dict(data)
    assert g.n_links == 4
    assert g.link(3, 2) == 3
    assert g.theta[g.link(2, 1)] == 1.0
    with pytest.raises(BanditUsageError):
        g.link(1, 3)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"format": "other"}, "format"),
        ({"version": 2}, "version"),
        ({"slot_ms": 0}, "slot_ms"),
        ({"slot_ms": "10"}, "slot_ms"),
        ({"nodes": []}, "nodes"),
        ({"nodes": ["s", "a", "s"]}, "nodes[2]"),
        ({"nodes": ["s", "a", True]}, "nodes[2]"),
        ({"nodes": ["s", "a", {"x": 1}]}, "nodes[2].id"),
        ({"sink": "zz"}, "sink"),
        ({"sink": "s"}, "sink"),
        ({"links": {}}, "links"),
        ({"links": [{"from": "s", "to": "a", "theta": 1.5}]}, "links[0].theta"),
        ({"links": [{"from": "s", "to": "a", "theta": 0}]}, "links[0].theta"),
        ({"links": [{"from": "s", "to": "a", "theta": float("nan")}]}, "links[0].theta"),
        ({"links": [{"from": "s", "to": "a"}]}, "links[0]"),
        ({"links": [{"from": "s", "theta": 0.5}]}, "links[0].to"),
        ({"links": [{"from": "s", "to": "q", "theta": 0.5}]}, "links[0].to"),
        ({"links": [{"from": "s", "to": "s", "theta": 0.5}]}, "links[0]"),
        ({"links": [{"from": "s", "to": "a", "mean_delay_ms": 5}]}, "links[0].mean_delay_ms"),
        (
            {"links": [{"from": "s", "to": "a", "theta": 0.5, "mean_delay_ms": 30}]},
            "links[0].theta",
        ),
        (
            {"links": [{"from": "s", "to": "t", "theta": 1}, {"from": "s", "to": "t", "theta": 1}]},
            "links[1]",
        ),
        ({"links": [{"from": "s", "to": "a", "theta": 0.5}]}, "sink"),  # t unreachable
    ],
)
def test_bad_files_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(GraphError) as caught:
        Graph.from_dict(small() | change)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_missing_source_and_unreadable_files(tmp_path: Path) -> None:
    data = small()
    del data["source"]
    with pytest.raises(GraphError, match=r"^source: missing"):
        Graph.from_dict(data)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(GraphError, match=r"^file: .*not valid JSON"):
        load_graph(tmp_path / "bad.json")
    with pytest.raises(GraphError, match=r"^file: cannot read"):
        load_graph(tmp_path / "missing.json")
    with pytest.raises(GraphError, match=r"^\(top level\)"):
        Graph.from_dict([1, 2])


@pytest.mark.parametrize(("nodes", "segments"), [*PAPER_SIZES, (16, 30)])
def test_generators_give_connected_graphs_of_the_requested_size(nodes: int, segments: int) -> None:
    for seed in range(3):
        g = road_network(nodes, segments, rng=np.random.default_rng(seed))
        assert g.n_nodes == nodes
        assert g.n_links == 2 * segments
        # Every road goes both ways with one expected delay.
        pairs = dict(zip(zip(g.tail.tolist(), g.head.tolist(), strict=True), g.theta, strict=True))
        assert all(pairs[b, a] == theta for (a, b), theta in pairs.items())
        # Connected: every node reaches the sink (and so, roads being two-way, everything).
        assert (g.hops_to_sink >= 0).all()
        delays = g.mean_delay_ms
        assert delays.min() >= 50
        assert delays.max() <= 250


@pytest.mark.parametrize("number", [1, 2, 3])
def test_exploration_networks_have_their_delay_ranges(number: int) -> None:
    g = exploration_network(number, rng=np.random.default_rng(number))
    low, high = EXPLORATION_NETWORKS[number - 1]
    assert (g.n_nodes, g.n_links) == (16, 60)
    assert low <= g.mean_delay_ms.min()
    assert g.mean_delay_ms.max() <= high


def test_generators_are_deterministic_given_the_seed() -> None:
    a = paper_network(36, rng=np.random.default_rng(11))
    same_graph(a, paper_network(36, rng=np.random.default_rng(11)))
    b = paper_network(36, rng=np.random.default_rng(12))
    assert not np.array_equal(a.theta, b.theta)


def test_generator_rejects_impossible_sizes() -> None:
    with pytest.raises(BanditUsageError):
        road_network(25, 23, rng=np.random.default_rng(0))  # fewer than a spanning tree
    with pytest.raises(BanditUsageError):
        road_network(25, 57, rng=np.random.default_rng(0))  # 40 grid roads + 16 diagonals
    with pytest.raises(BanditUsageError):
        road_network(25, 32, rng=np.random.default_rng(0), slot_ms=60)
    with pytest.raises(BanditUsageError):
        paper_network(49, rng=np.random.default_rng(0))
