"""Placement from JOIN routing paths (paper §IV-B): chains, rendezvous, overflow, errors."""

from __future__ import annotations

import pytest

from agiledart.app import App, AppError, AppSpec
from agiledart.placement.join import Hop, PeerInfo, PlacementError, place


def hops(*peers: str, capacity: float = 1.0) -> list[Hop]:
    return [Hop(p, node_id=i, rtt_ms=1.0, capacity=capacity) for i, p in enumerate(peers)]


def chain_app(sink_peer: str = "F") -> AppSpec:
    """s@A -> f (filter) -> kb (key_by) -> w (window) -> k@sink_peer."""
    return (
        App("chain")
        .source("s", peer="A", connector="generator", dataset="urban", rate=10)
        .filter("f", "builtin:is_hot", threshold=30)
        .key_by("kb", key="city")
        .window("w", size_ms=1000, aggregate="count")
        .sink("k", peer=sink_peer, connector="stdout")
        .build()
    )


def union_app(*, extra_left: bool = False) -> AppSpec:
    """s1@A -> f1 [-> g1] \\ u (union) -> kb -> k@Z; s2@B -> f2 /."""
    app = App("fork-join")
    left = app.source("s1", peer="A", connector="generator", dataset="urban", rate=10).filter(
        "f1", "builtin:is_hot", threshold=30
    )
    if extra_left:
        left = left.key_by("g1", key="city")
    right = app.source("s2", peer="B", connector="generator", dataset="urban", rate=10).filter(
        "f2", "builtin:is_hot", threshold=30
    )
    return (
        left.union("u", right)
        .key_by("kb", key="city")
        .sink("k", peer="Z", connector="stdout")
        .build()
    )


# --- single chains -----------------------------------------------------------------


def test_chain_with_more_hops_than_operators_starts_next_to_the_source() -> None:
    p = place(chain_app(), {("s", "k"): hops("A", "B", "C", "D", "E", "F")})
    assert dict(p.operators) == {"f": ("B",), "kb": ("C",), "w": ("D",)}
    assert dict(p.sources) == {"s": "A"}
    assert dict(p.sinks) == {"k": "F"}
    assert dict(p.paths) == {("s", "k"): ("A", "B", "C", "D", "E", "F")}
    assert p.deploy_order == ("F", "E", "D", "C", "B", "A")
    assert p.peer_of("kb") == "C"
    assert p.on_peer("B") == ("f",)


def test_chain_with_fewer_hops_shares_a_node() -> None:
    p = place(chain_app(), {("s", "k"): hops("A", "F")})
    assert dict(p.operators) == {"f": ("F",), "kb": ("F",), "w": ("F",)}
    assert p.deploy_order == ("F", "A")


def test_chain_with_fewer_hops_prefers_leaf_set_peer_with_spare_capacity() -> None:
    peers = {"F": PeerInfo(("L1",), 0.5), "L1": PeerInfo(capacity=0.9)}
    p = place(chain_app(), {("s", "k"): hops("A", "F")}, peers)
    assert dict(p.operators) == {"f": ("F",), "kb": ("L1",), "w": ("L1",)}
    assert p.deploy_order == ("L1", "F", "A")


def test_peer_without_spare_capacity_is_skipped() -> None:
    path = [Hop("A", 1), Hop("B", 2, capacity=0.0), Hop("C", 3), Hop("D", 4), Hop("F", 5)]
    p = place(chain_app(), {("s", "k"): path})
    assert dict(p.operators) == {"f": ("C",), "kb": ("D",), "w": ("F",)}


def test_source_and_sink_on_one_peer() -> None:
    p = place(chain_app(sink_peer="A"), {("s", "k"): hops("A")})
    assert dict(p.operators) == {"f": ("A",), "kb": ("A",), "w": ("A",)}


def test_path_node_without_room_is_passed_over() -> None:
    """A quarter of spare capacity (the default reserve) is one operator's worth: B
    would be left with nothing, so the chain starts one hop further."""
    path = {("s", "k"): hops("A", "B", "C", "D", "E", "F")}
    peers = {"B": PeerInfo(capacity=0.25), "C": PeerInfo(capacity=0.3)}
    p = place(chain_app(), path, peers)
    assert dict(p.operators) == {"f": ("C",), "kb": ("D",), "w": ("E",)}
    # without a reserve any spare capacity will do
    p = place(chain_app(), path, peers, reserve=0.0)
    assert dict(p.operators) == {"f": ("B",), "kb": ("C",), "w": ("D",)}


def test_last_room_of_a_path_node_goes_only_when_nothing_has_more() -> None:
    peers = {
        "A": PeerInfo(capacity=0.0),
        "B": PeerInfo(("LB",), 0.25),
        "F": PeerInfo(capacity=0.25),
        "LB": PeerInfo(capacity=0.5),
    }
    p = place(chain_app(), {("s", "k"): hops("A", "B", "F")}, peers, slot_limit=1)
    # f: neither B nor F has room, so overflow: LB has the most spare capacity (it
    # counts as sitting at B); kb, w: nothing left with more than B and F, path first
    assert dict(p.operators) == {"f": ("LB",), "kb": ("B",), "w": ("F",)}
    assert p.deploy_order == ("F", "LB", "B", "A")


def test_equal_capacities_keep_the_first_path_node_with_room() -> None:
    """With nothing to choose between them, operators stay next to their inputs."""
    peers = {n: PeerInfo((f"L{n}",), 0.5) for n in "BCDEF"}
    peers |= {f"L{n}": PeerInfo(capacity=0.5) for n in "BCDEF"}
    p = place(chain_app(), {("s", "k"): hops("A", "B", "C", "D", "E", "F")}, peers)
    assert dict(p.operators) == {"f": ("B",), "kb": ("C",), "w": ("D",)}


# --- rendezvous ----------------------------------------------------------------------


def test_fork_join_meets_at_rendezvous() -> None:
    paths = {("s1", "k"): hops("A", "C", "R", "D", "Z"), ("s2", "k"): hops("B", "E", "R", "D", "Z")}
    p = place(union_app(), paths)
    assert dict(p.operators) == {
        "f1": ("C",),
        "f2": ("E",),
        "u": ("R",),
        "kb": ("D",),
    }
    assert p.deploy_order == ("Z", "D", "R", "C", "A", "E", "B")


def test_merge_goes_to_first_common_peer_even_when_inputs_sit_there() -> None:
    paths = {("s1", "k"): hops("A", "R", "Z"), ("s2", "k"): hops("B", "R", "Z")}
    p = place(union_app(), paths)
    assert dict(p.operators) == {"f1": ("R",), "f2": ("R",), "u": ("R",), "kb": ("Z",)}


def test_merge_goes_at_or_after_the_positions_of_its_inputs() -> None:
    # R is the first common peer, but g1 already sits past it at X
    paths = {("s1", "k"): hops("A", "R", "X", "Z"), ("s2", "k"): hops("B", "R", "X", "Z")}
    p = place(union_app(extra_left=True), paths)
    assert dict(p.operators) == {
        "f1": ("R",),
        "g1": ("X",),
        "f2": ("R",),
        "u": ("X",),
        "kb": ("Z",),
    }


def test_join_rendezvous() -> None:
    app = App("join")
    a = app.source("a", peer="A", connector="generator", dataset="urban", rate=10)
    b = app.source("b", peer="B", connector="generator", dataset="taxi", rate=10)
    spec = a.join("j", b, key="cell", window_ms=60_000).sink("k", peer="Z", connector="stdout")
    paths = {("a", "k"): hops("A", "M", "Z"), ("b", "k"): hops("B", "N", "M", "Z")}
    p = place(spec.build(), paths)
    assert dict(p.operators) == {"j": ("M",)}


def test_operator_shared_by_two_sinks_is_placed_once_on_the_common_prefix() -> None:
    app = App("fork")
    f = app.source("s", peer="A", connector="generator", dataset="urban", rate=10).filter(
        "f", "builtin:is_hot", threshold=30
    )
    f.key_by("kb", key="city").sink("k1", peer="X", connector="stdout")
    app.sink("k2", [f], peer="Y", connector="stdout")
    paths = {("s", "k1"): hops("A", "B", "C", "X"), ("s", "k2"): hops("A", "B", "D", "Y")}
    p = place(app.build(), paths)
    assert dict(p.operators) == {"f": ("B",), "kb": ("C",)}
    assert p.deploy_order == ("X", "C", "B", "A", "Y", "D")


# --- slots and overflow --------------------------------------------------------------


def test_slot_limit_overflows_to_leaf_set_peers_by_capacity() -> None:
    peers = {
        "B": PeerInfo(("L1", "L2"), 1.0),
        "L1": PeerInfo(capacity=0.3),
        "L2": PeerInfo(capacity=0.8),
    }
    p = place(chain_app(sink_peer="B"), {("s", "k"): hops("A", "B")}, peers, slot_limit=1)
    assert dict(p.operators) == {"f": ("B",), "kb": ("L2",), "w": ("L1",)}
    assert p.deploy_order == ("L1", "L2", "B", "A")


def test_ties_are_broken_by_name() -> None:
    peers = {"B": PeerInfo(("Lz", "La"), 1.0), "Lz": PeerInfo(), "La": PeerInfo()}
    p = place(chain_app(sink_peer="B"), {("s", "k"): hops("A", "B")}, peers, slot_limit=1)
    assert dict(p.operators) == {"f": ("B",), "kb": ("La",), "w": ("Lz",)}


def test_no_capacity_anywhere() -> None:
    with pytest.raises(PlacementError, match=r"no capacity for operator 'kb'.*slot limit 1"):
        place(chain_app(sink_peer="B"), {("s", "k"): hops("A", "B")}, slot_limit=1)
    with pytest.raises(PlacementError, match="no capacity for operator 'f'"):
        place(chain_app(), {("s", "k"): hops("A", "F", capacity=0.0)})


def test_unknown_leaf_peer_is_not_used() -> None:
    peers = {"B": PeerInfo(("L1",), 1.0)}  # L1's capacity unknown
    with pytest.raises(PlacementError, match="no capacity for operator 'kb'"):
        place(chain_app(sink_peer="B"), {("s", "k"): hops("A", "B")}, peers, slot_limit=1)


# --- determinism ---------------------------------------------------------------------


def test_deterministic_whatever_the_order_of_inputs() -> None:
    paths = {("s1", "k"): hops("A", "C", "R", "D", "Z"), ("s2", "k"): hops("B", "E", "R", "D", "Z")}
    peers = {"D": PeerInfo(("P", "Q"), 0.2), "P": PeerInfo(capacity=0.5), "Q": PeerInfo()}
    first = place(union_app(), paths, peers, slot_limit=1)
    again = place(
        union_app(), dict(reversed(paths.items())), dict(reversed(peers.items())), slot_limit=1
    )
    assert first == again
    assert first.deploy_order == again.deploy_order


# --- errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ({("s", "k"): hops("X", "F")}, "starts at peer 'X', not at the source's peer 'A'"),
        ({("s", "k"): hops("A", "X")}, "ends at peer 'X', not at the sink's peer 'F'"),
        ({("s", "k"): []}, "from source 's' to sink 'k' is empty"),
        ({("s", "k"): hops("A", "B", "A", "F")}, "visits peer 'A' twice"),
        ({}, "no JOIN path from source 's' to sink 'k'"),
        (
            {("s", "k"): hops("A", "F"), ("s", "nope"): hops("A", "F")},
            "source 's' to sink 'nope', which it does not feed",
        ),
        ({("s", "k"): hops("A", "F", capacity=1.5)}, r"capacity of peer 'A' must be in \[0, 1\]"),
    ],
)
def test_bad_paths(paths: dict[tuple[str, str], list[Hop]], message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        place(chain_app(), paths)


def test_bad_slot_limit_and_peer_capacity() -> None:
    with pytest.raises(PlacementError, match="slot limit must be at least 1"):
        place(chain_app(), {("s", "k"): hops("A", "F")}, slot_limit=0)
    with pytest.raises(PlacementError, match="capacity of peer 'F'"):
        place(chain_app(), {("s", "k"): hops("A", "F")}, {"F": PeerInfo(capacity=-0.1)})
    for reserve in (-0.1, 1.0):
        with pytest.raises(PlacementError, match=r"reserve must be in \[0, 1\)"):
            place(chain_app(), {("s", "k"): hops("A", "F")}, reserve=reserve)


def test_merge_with_no_common_peer() -> None:
    app = App("split")
    a = app.source("a", peer="A", connector="generator", dataset="urban", rate=10)
    b = app.source("b", peer="B", connector="generator", dataset="urban", rate=10)
    u = a.union("u", b)
    u.sink("k1", peer="X", connector="stdout")
    app.sink("k2", [u], peer="Y", connector="stdout")
    paths = {
        ("a", "k1"): hops("A", "X"),
        ("a", "k2"): hops("A", "Y"),
        ("b", "k1"): hops("B", "X"),
        ("b", "k2"): hops("B", "Y"),
    }
    with pytest.raises(PlacementError, match=r"operator 'u'.*share no peer") as info:
        place(app.build(), paths)
    assert isinstance(info.value, AppError)


def test_on_equal_capacity_overflow_shares_the_path_node_before_leaf_peers() -> None:
    """Data locality: with nothing to choose between them, the chain stays on the path."""
    peers = {"F": PeerInfo(("L1", "L2"), 1.0), "L1": PeerInfo(), "L2": PeerInfo()}
    p = place(chain_app(), {("s", "k"): hops("A", "F")}, peers, slot_limit=2)
    assert dict(p.operators) == {"f": ("F",), "kb": ("F",), "w": ("L1",)}
