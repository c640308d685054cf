"""The link model and the relay's frame checks, without processes."""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path
from typing import Any

import pytest

from agiledart.bandit import Graph, save_graph
from agiledart.cli.emulate import _peers_for_links, relay_totals
from agiledart.errors import AgiledartError
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.errors import MalformedError
from agiledart.runtime import relay as relaying
from agiledart.runtime.linkmodel import LinkModel
from agiledart.runtime.links import Links
from agiledart.runtime.relay import AckTimer, Relay, _checked
from agiledart.traces import NullTraceWriter


def line(slot_ms: float = 10.0) -> LinkModel:
    """sensor-1 -> edge-1 -> gateway-1, plus a lossy shortcut sensor-1 -> gateway-1."""
    links = [
        ("sensor-1", "edge-1", 0.5),
        ("edge-1", "gateway-1", 1.0),
        ("sensor-1", "gateway-1", 0.25),
    ]
    nodes = ["sensor-1", "edge-1", "gateway-1"]
    return LinkModel(
        Graph.build(nodes, links, source="sensor-1", sink="gateway-1", slot_ms=slot_ms)
    )


def test_neighbours_hops_and_loss() -> None:
    m = line()
    assert m.neighbours("sensor-1") == ("edge-1", "gateway-1")
    assert m.neighbours("gateway-1") == ()  # links are directed
    assert m.theta("sensor-1", "edge-1") == 0.5
    assert m.theta("edge-1", "sensor-1") is None
    assert m.hops_to("gateway-1") == {"gateway-1": 0, "edge-1": 1, "sensor-1": 1}
    assert "sensor-1" not in m.hops_to("edge-2")
    assert m.covers("edge-1")
    assert not m.covers("edge-2")


def test_optimal_delay_counts_slots_and_the_wait_for_lost_attempts() -> None:
    m = line(slot_ms=10.0)
    # via edge-1: 10/0.5 + 10/1 = 30 ms; direct: 10/0.25 = 40 ms
    assert m.optimal_ms("sensor-1", "gateway-1") == pytest.approx(30.0)
    # a lost attempt also waits 100 ms for its acknowledgement: (10+100)/θ - 100 per link
    # via edge-1: 120 + 10 = 130; direct: 340
    assert m.optimal_ms("sensor-1", "gateway-1", 100.0) == pytest.approx(130.0)
    assert m.optimal_ms("gateway-1", "sensor-1") is None


def test_emulate_needs_link_nodes_named_like_its_peers(tmp_path: Path) -> None:
    path = tmp_path / "links.json"
    save_graph(line().graph, path)
    assert _peers_for_links(path) == 5  # sensor-1 .. gateway-2, edge-1 is the 5th
    bad = Graph.build(["a", "b"], [("a", "b", 0.5)], source="a", sink="b")
    save_graph(bad, path)
    with pytest.raises(AgiledartError, match="not peer names"):
        _peers_for_links(path)
    path.write_text("{not json")
    with pytest.raises(AgiledartError, match="--links"):
        _peers_for_links(path)


def test_relay_totals_sum_the_peers() -> None:
    ring = {"relay": {"stats": {"sent": 2, "failures": 1}}}
    assert relay_totals([ring, None, {"relay": None}, ring]) == {"sent": 4, "failures": 2}
    assert relay_totals([{"relay": None}]) is None


def packet() -> dict[str, object]:
    return {
        "t": "relay",
        "id": None,
        "i": "sensor-1~ab~1",
        "a": "app",
        "f": "op|sensor-1",
        "q": 0,
        "o": "sensor-1",
        "oa": ["127.0.0.2", 4000],
        "d": "gateway-1",
        "da": ["127.0.0.4", 4000],
        "k": "data",
        "b": {"a": "app"},
        "p": ["sensor-1"],
        "tau": 1,
        "t0": 1.0,
        "n": 1,
        "x": 7,
    }


def test_a_relay_frame_is_checked_and_stripped_of_its_envelope() -> None:
    checked = _checked(packet())
    assert "t" not in checked
    assert "id" not in checked
    assert checked["i"] == "sensor-1~ab~1"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("q", "0"),
        ("q", True),
        ("k", "code"),
        ("p", ["sensor-1", 3]),
        ("oa", ["127.0.0.2"]),
        ("da", [1, 2]),
        ("b", []),
        ("tau", math.inf),
    ],
)
def test_a_malformed_relay_frame_is_refused(field: str, value: object) -> None:
    bad = packet()
    bad[field] = value
    with pytest.raises(MalformedError):
        _checked(bad)


def test_the_ack_timeout_follows_the_acknowledgements_between_its_bounds() -> None:
    timer = AckTimer(floor_s=0.010, ceiling_s=0.100)
    assert timer.timeout_s == 0.100  # nothing measured yet: the ceiling
    timer.sample(0.002)  # srtt 2 ms, rttvar 1 ms: 6 ms, under the floor
    assert timer.timeout_s == pytest.approx(0.010)
    for _ in range(50):
        timer.sample(0.020)
    assert timer.srtt == pytest.approx(0.020, rel=1e-2)
    assert timer.timeout_s == pytest.approx(0.020, abs=1e-3)  # steady: rttvar ~ 0
    timer.expired()  # backs off: doubled per timeout, up to the ceiling
    assert timer.timeout_s == pytest.approx(0.040, abs=2e-3)
    timer.expired()
    timer.expired()
    assert timer.timeout_s == pytest.approx(0.100)
    timer.sample(0.020)  # the next acknowledgement brings it back
    assert timer.timeout_s == pytest.approx(0.020, abs=1e-3)
    timer.sample(0.400)  # one stall: the variance term jumps, capped by the ceiling
    assert timer.timeout_s == pytest.approx(0.100)
    assert AckTimer(floor_s=0.05, ceiling_s=0.01).ceiling_s == 0.05


def _relay(name: str, model: LinkModel) -> tuple[Relay, Links]:
    links = Links(ClusterKey.generate(random.Random("test-cluster-key-0123456789")), name)

    async def nowhere(name: str) -> None:
        return None

    async def deliver(*args: object) -> None:
        return None

    relay = Relay(
        name=name,
        model=model,
        links=links,
        address=lambda: ("127.0.0.1", 1),
        resolve=nowhere,
        deliver=deliver,
        trace=NullTraceWriter(),
        seed=1,
    )
    return relay, links


class _Conn:
    """The sending end of a relay frame, as :meth:`Relay.on_relay` sees it."""

    def __init__(self, peer_name: str) -> None:
        self.peer_name = peer_name
        self.sent: list[tuple[str, dict[str, object]]] = []

    async def send(self, type: str, body: dict[str, object]) -> None:
        self.sent.append((type, body))


def _copy_of(pid: str, *, dest: str, path: list[str]) -> dict[str, object]:
    return {**packet(), "i": pid, "o": path[0], "d": dest, "p": path, "x": 9}


async def test_a_copy_is_taken_off_a_holder_only_by_the_smaller_name() -> None:
    """Two holders of one packet must not both let it go when their copies cross
    (each answering "seen" to the other lost packets): the smaller name keeps it."""
    nodes = ["a", "m", "z"]
    both = [(u, v, 1.0) for u, v in (("a", "m"), ("m", "z"), ("a", "z"))]
    both += [(v, u, t) for u, v, t in both]
    model = LinkModel(Graph.build(nodes, both, source="a", sink="z", slot_ms=10.0))
    relay, links = _relay("m", model)
    try:
        held = "a~x~z~1"
        relay._remember(held)
        relay._holding.add(held)
        for sender, kept in (("z", True), ("a", False)):  # "m" < "z", "m" > "a"
            conn = _Conn(sender)
            await relay.on_relay(_copy_of(held, dest="z", path=[sender]), conn)  # type: ignore[arg-type]
            ((kind, ack),) = conn.sent
            assert kind == "relay_ack"
            assert ack["ok"] is kept  # ok: the sender lets its copy go, m keeps its own
        assert relay.stats.forwarded == 0
        # passed on before: the copy is carried again, not dropped
        gone = "a~x~z~2"
        relay._remember(gone)
        conn = _Conn("a")
        await relay.on_relay(_copy_of(gone, dest="z", path=["a"]), conn)  # type: ignore[arg-type]
        assert conn.sent[0][1]["ok"] is True
        assert gone in relay._holding
        assert relay.stats.forwarded == 1
        # at the destination a copy is always dropped
        mine = "a~x~m~3"
        relay._remember(mine)
        conn = _Conn("z")
        await relay.on_relay(_copy_of(mine, dest="m", path=["a", "z"]), conn)  # type: ignore[arg-type]
        assert conn.sent[0][1]["ok"] is True
        assert relay.stats.duplicates == 4
    finally:
        await relay.aclose()
        await links.aclose()


async def test_the_origin_sends_again_what_its_destination_does_not_confirm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A relay that dies holding a packet takes it with it: the origin keeps every
    packet until the destination confirms it, sends it again when no confirmation
    comes in time, and stops once one comes. Each generation of an app is a flow of its
    own, so a packet sent again after a recovery never takes a new packet's place."""
    monkeypatch.setattr(relaying, "RESEND_AFTER_S", 0.05)
    monkeypatch.setattr(relaying, "RESEND_CHECK_S", 0.01)
    relay, links = _relay("sensor-1", line())
    carried: list[dict[str, Any]] = []

    async def handed_off(packet: dict[str, Any]) -> None:  # to a relay that then dies
        carried.append(packet)
        relay._holding.discard(packet["i"])

    monkeypatch.setattr(relay, "_forward", handed_off)
    try:
        body = {"a": "app", "g": 0}
        await relay.submit("app", "op|sensor-1", "data", body, "gateway-1", ("127.0.0.1", 9))
        await relay.submit("app", "op|sensor-1", "wm", {**body, "g": 1}, "gateway-1", ("x", 9))
        await asyncio.sleep(0.3)
        flows = {(p["f"], p["q"]) for p in carried}
        assert flows == {("op|sensor-1~g0", 0), ("op|sensor-1~g1", 0)}
        assert relay.stats.resent >= 2
        assert all(p["p"] == ["sensor-1"] for p in carried)
        conn = _Conn("gateway-1")
        for flow in ("op|sensor-1~g0", "op|sensor-1~g1"):
            done = {"a": "app", "f": flow, "d": "gateway-1", "q": 0}
            await relay.on_done(done, conn)  # type: ignore[arg-type]
        assert relay.stats.unconfirmed == 0
        sent = len(carried)
        await asyncio.sleep(0.2)
        assert len(carried) == sent  # confirmed: never sent again
        with pytest.raises(MalformedError):
            await relay.on_done({"a": "app", "f": 3, "d": "x", "q": 0}, conn)  # type: ignore[arg-type]
    finally:
        await relay.aclose()
        await links.aclose()


async def test_the_destination_confirms_what_it_handed_over_and_copies_again() -> None:
    relay, links = _relay("gateway-1", line())
    confirmed: list[int] = []

    async def confirm(packet: dict[str, Any], upto: int) -> None:
        confirmed.append(upto)

    relay._confirm = confirm  # type: ignore[method-assign]
    try:
        for q in (1, 0, 0):  # out of order, then a copy sent again
            await relay._arrive({**packet(), "d": "gateway-1", "q": q, "i": f"p{q}"})
        assert confirmed == [-1, 1, 1]  # 1 held back for 0; then both; the copy: again
    finally:
        await relay.aclose()
        await links.aclose()
