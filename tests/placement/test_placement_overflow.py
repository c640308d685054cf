"""Live placement's view of the ring: the path peers' leaf-set neighbours are overflow
candidates (paper §IV-B), with the spare capacity their path peer last heard.

Before this, the scheduler gave placement the path peers only, so an operator that did
not fit on its path went onto another path peer (in ``agiledart emulate``, the peer
generating one of the app's sources) while the idle peers beside the path were never
candidates.
"""

from __future__ import annotations

from typing import Any

import pytest

from agiledart import apps
from agiledart.app.parse import parse_spec
from agiledart.placement.join import Hop, PeerInfo, place
from agiledart.runtime.submission import path_peer_infos

NAMES = ("sensor-1", "sensor-2", "gateway-1", "gateway-2", "edge-1", "edge-2")


def hops(*peers: tuple[str, float]) -> list[Hop]:
    return [Hop(p, node_id=i, rtt_ms=1.0, capacity=c) for i, (p, c) in enumerate(peers)]


def ring(leaf_set: list[str], peers: dict[str, float]) -> dict[str, Any]:
    return {
        "leaf_set": leaf_set,
        "peers": [
            {"name": n, "address": f"127.0.0.1:{4000 + i}", "capacity": c, "suspect": False}
            for i, (n, c) in enumerate(sorted(peers.items()))
        ],
    }


def test_path_peers_keep_their_hop_capacity_and_leaf_peers_get_what_was_heard() -> None:
    paths = {("s", "k"): hops(("A", 1.0), ("B", 0.25), ("C", 0.5))}
    addresses: dict[str, tuple[str, int]] = {}
    infos = path_peer_infos(
        paths,
        {
            "A": ring(["B", "D"], {"B": 0.9, "D": 1.0}),
            "B": ring(["A", "C", "E"], {"A": 0.0, "C": 0.5, "E": 0.75, "F": 2.0}),
            "C": None,  # did not answer
        },
        addresses,
    )
    # the hop's own (fresh) figure wins over what a neighbour last heard
    assert infos["A"] == PeerInfo(leaf_set=("B", "D"), capacity=1.0)
    assert infos["B"] == PeerInfo(leaf_set=("A", "C", "E"), capacity=0.25)
    assert infos["C"] == PeerInfo(capacity=0.5)
    assert infos["D"] == PeerInfo(capacity=1.0)
    assert infos["E"] == PeerInfo(capacity=0.75)
    assert infos["F"] == PeerInfo(capacity=1.0)  # clamped to [0, 1]
    assert set(addresses) == {"B", "C", "D", "E", "F", "A"}
    assert addresses["D"] == ("127.0.0.1", 4001)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"name": "G", "capacity": 1.0}, "no address"),
        ({"name": "G", "address": "x:y", "capacity": 1.0}, "no port"),
        ({"name": "G", "address": ":4000", "capacity": 1.0}, "no host"),
        ({"name": "", "address": "h:4000", "capacity": 1.0}, "no name"),
        ({"name": "G", "address": "h:4000", "capacity": "lots"}, "a capacity not a number"),
        ({"name": "G", "address": "h:4000", "capacity": float("nan")}, "a NaN capacity"),
        ({"name": "G", "address": "h:4000", "capacity": 1.0, "suspect": True}, "suspect"),
        ("garbage", "not an object"),
    ],
)
def test_an_unusable_entry_is_no_candidate(entry: Any, why: str) -> None:
    paths = {("s", "k"): hops(("A", 1.0), ("C", 1.0))}
    reply: dict[str, Any] = {"leaf_set": ["G"], "peers": [entry]}
    addresses: dict[str, tuple[str, int]] = {}
    infos = path_peer_infos(paths, {"A": reply, "C": None}, addresses)
    assert set(infos) == {"A", "C"}, why
    assert addresses == {}, why


def test_a_leaf_set_that_is_not_a_list_is_ignored() -> None:
    paths = {("s", "k"): hops(("A", 1.0))}
    infos = path_peer_infos(paths, {"A": {"leaf_set": 7, "peers": "nope"}}, {})
    assert infos == {"A": PeerInfo(capacity=1.0)}


def urban_paths() -> dict[tuple[str, str], list[Hop]]:
    """The bundled urban-sensing app on ``agiledart emulate``'s ring: both sensors
    reach the sink's peer in one hop, so every operator must sit at the rendezvous."""
    out = {}
    for source, peer in (("readings-a", "sensor-1"), ("readings-b", "sensor-2")):
        for sink in ("averages-out", "peaks-out"):
            out[(source, sink)] = hops((peer, 1.0), ("gateway-1", 1.0))
    return out


def test_an_operator_that_does_not_fit_on_its_path_goes_to_an_idle_leaf_set_peer() -> None:
    spec = apps.load("urban-sensing")
    paths = urban_paths()
    rings = {
        n: ring([m for m in NAMES if m != n], {m: 1.0 for m in NAMES if m != n}) for n in NAMES
    }
    infos = path_peer_infos(paths, {n: rings[n] for n in ("sensor-1", "sensor-2", "gateway-1")}, {})
    placed = place(spec, paths, infos)
    hosts = {op: ps[0] for op, ps in placed.operators.items()}
    assert hosts["readings"] == "gateway-1"
    # the fifth operator overflows from the rendezvous (4 slots): to an idle peer beside
    # the path, never onto the peer generating a source's readings
    overflowed = [op for op, h in hosts.items() if h != "gateway-1"]
    assert len(overflowed) == 1
    assert hosts[overflowed[0]] == "edge-1"
    # the placement of the path peers alone (what the scheduler used to give)
    blind = {n: infos[n] for n in ("sensor-1", "sensor-2", "gateway-1")}
    hosts = {op: ps[0] for op, ps in place(spec, paths, blind).operators.items()}
    assert hosts[overflowed[0]] in {"sensor-1", "sensor-2"}


def test_on_a_tie_overflow_prefers_a_peer_without_the_apps_sources() -> None:
    """``a-sensor`` sorts first by name but produces the app's input: ``z-idle`` wins."""
    renamed = {"sensor-1": "a-sensor", "sensor-2": "b-sensor"}
    text = apps.text("urban-sensing")
    for old, new in renamed.items():
        text = text.replace(f"peer: {old}", f"peer: {new}")
    spec = parse_spec(text)
    paths = {
        k: hops((renamed[h[0].peer], 1.0), ("gateway-1", 1.0)) for k, h in urban_paths().items()
    }
    names = ("a-sensor", "b-sensor", "gateway-1", "z-idle")
    infos = {n: PeerInfo(tuple(m for m in names if m != n), 1.0) for n in names}
    hosts = {op: ps[0] for op, ps in place(spec, paths, infos).operators.items()}
    assert sorted(set(hosts.values())) == ["gateway-1", "z-idle"]
