"""The placement strategies as pure functions, on small topologies computed by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agiledart import apps
from agiledart.app import SpecError, parse_spec
from agiledart.app.spec import PLACEMENTS, AppSpec
from agiledart.placement import (
    STRATEGIES,
    Host,
    Network,
    StrategyError,
    Topology,
    Workload,
    deployment_sequence,
    place_with,
    regions,
    split_points,
)
from agiledart.placement.survey import topology_of

# sensor --1 ms-- gateway --40 ms-- cloud
EDGE_CLOUD = Topology.of(
    [
        Host(name="sensor", speed=2000.0),
        Host(name="gateway", speed=4000.0),
        Host(name="cloud", speed=100_000.0, zone="cloud"),
    ],
    Network.from_links({("sensor", "gateway"): 1.0, ("gateway", "cloud"): 40.0}),
)


def app(operators: list[dict[str, Any]], sinks: list[dict[str, Any]], **top: Any) -> AppSpec:
    return parse_spec(
        {
            "name": "t",
            "sources": [
                {
                    "id": "src",
                    "peer": "sensor",
                    "connector": "generator",
                    "params": {"dataset": "counter", "rate": 500, "count": 10},
                }
            ],
            "operators": operators,
            "sinks": sinks,
            **top,
        }
    )


def sink(id: str, peer: str, inputs: list[str]) -> dict[str, Any]:
    return {"id": id, "peer": peer, "connector": "discard", "inputs": inputs}


def op(id: str, kind: str, inputs: list[str], **params: Any) -> dict[str, Any]:
    fns = {"map": "builtin:identity", "filter": "builtin:skip_every"}
    d: dict[str, Any] = {"id": id, "op": kind, "inputs": inputs, "params": params}
    if kind in fns:
        d["fn"] = fns[kind]
    return d


PIPELINE = app(
    [op("m", "map", ["src"]), op("f", "filter", ["m"])],
    [sink("out", "gateway", ["f"])],
)
ONE = Workload(rates={"src": 500.0}, cost={"m": 1.0, "f": 1.0}, selectivity={})


def test_rtr_keeps_an_edge_pipeline_on_the_edge_and_beats_cloud_only() -> None:
    rtr = place_with("rtr", PIPELINE, EDGE_CLOUD, ONE)
    cloud = place_with("cloud-only", PIPELINE, EDGE_CLOUD, ONE)
    # m: sensor 0 + 1000/(2000-500) + 1 = 1.667; gateway 1 + 1000/(4000-500) = 1.286;
    # cloud 41 + ... + 40. f on the gateway: 0 + 1000/(3500-500) = 0.333 ms
    assert dict(rtr.operators) == {"m": ("gateway",), "f": ("gateway",)}
    assert dict(cloud.operators) == {"m": ("cloud",), "f": ("cloud",)}
    # cloud-only: 41 ms up, 40 ms back, 1000/(100000-1000) ms per operator
    assert cloud.estimate_ms[("src", "out")] == pytest.approx(81 + 2 * 1000 / 99_000)
    # rtr: 1 ms to the gateway, 1000/(4000-1000) ms per operator
    assert rtr.estimate_ms[("src", "out")] == pytest.approx(1 + 2 * 1000 / 3000)
    assert rtr.estimate_ms[("src", "out")] < 0.5 * cloud.estimate_ms[("src", "out")]
    assert rtr.paths[("src", "out")] == ("sensor", "gateway")
    assert cloud.paths[("src", "out")] == ("sensor", "cloud", "gateway")
    assert rtr.strategy == "rtr"
    assert cloud.deploy_order == ("gateway", "cloud", "sensor")  # consumers first


def test_rtr_sends_what_the_edge_cannot_keep_up_with_to_the_cloud() -> None:
    heavy = Workload(rates={"src": 500.0}, cost={"m": 10.0, "f": 1.0}, selectivity={})
    rtr = place_with("rtr", PIPELINE, EDGE_CLOUD, heavy)
    # m needs 5000 units/s: more than the sensor (2000) or the gateway (4000) has
    assert rtr.operators["m"] == ("cloud",)
    # f is cheap; from the cloud the 40 ms back to the gateway are paid either way:
    # cloud 0 + 1000/(100000-5000-500) + 40 = 40.01 ms; gateway 40 + 1000/3500 = 40.29
    assert rtr.operators["f"] == ("cloud",)
    assert math.isfinite(rtr.estimate_ms[("src", "out")])


FORK = app(
    [
        op("clean", "filter", ["src"]),
        op("alert", "map", ["clean"]),
        op("sum", "window", ["clean"], size_ms=1000, aggregate="count"),
    ],
    [sink("actuator", "gateway", ["alert"]), sink("archive", "cloud", ["sum"])],
)


def test_rtr_rp_keeps_edge_sinks_paths_on_the_edge_and_the_rest_in_the_cloud() -> None:
    p = place_with("rtr-rp", FORK, EDGE_CLOUD)
    # clean feeds an edge sink (actuator on the gateway): an edge candidate
    assert p.operators["clean"][0] in {"sensor", "gateway"}
    assert p.operators["alert"][0] in {"sensor", "gateway"}
    # sum only feeds the cloud sink: a cloud candidate
    assert p.operators["sum"] == ("cloud",)
    assert "cloud" not in p.paths[("src", "actuator")]


def test_rtr_rp_falls_back_to_the_cloud_when_no_edge_host_keeps_up() -> None:
    fork = app(
        [
            op("alert", "map", ["src"]),
            op("sum", "window", ["src"], size_ms=1000, aggregate="count"),
        ],
        [sink("actuator", "gateway", ["alert"]), sink("archive", "cloud", ["sum"])],
    )
    heavy = Workload(rates={"src": 500.0}, cost={"alert": 20.0, "sum": 1.0})
    p = place_with("rtr-rp", fork, EDGE_CLOUD, heavy)
    assert p.operators["alert"] == ("cloud",)  # 10000 units/s: more than any edge host


def test_data_never_comes_back_to_an_operator_on_a_peer_it_left() -> None:
    # clean lands on the gateway; alert cannot keep up there, but sending it to the
    # cloud would bring the data back to the gateway (clean -> cloud -> actuator):
    # peers could wait on each other, so it stays (overloaded) on the gateway
    heavy = Workload(rates={"src": 500.0}, cost={"clean": 1.0, "alert": 20.0, "sum": 1.0})
    p = place_with("rtr-rp", FORK, EDGE_CLOUD, heavy)
    assert p.operators["clean"] == p.operators["alert"] == ("gateway",)
    for strategy in STRATEGIES:
        for path in place_with(strategy, FORK, EDGE_CLOUD, heavy).paths.values():
            assert len(set(path)) == len(path), (strategy, path)


def test_cloud_only_without_a_cloud_zone_uses_the_strongest_hosts() -> None:
    topo = Topology.of(
        [Host(name="sensor", speed=1000.0), Host(name="big", speed=9000.0)],
        Network.from_links({("sensor", "big"): 5.0}),
    )
    pipe = app([op("m", "map", ["src"])], [sink("out", "sensor", ["m"])])
    assert topo.cloud() == ("big",)
    assert place_with("cloud-only", pipe, topo).operators["m"] == ("big",)


def test_lb_spreads_operators_over_equal_hosts_whatever_the_latency() -> None:
    hosts = [Host(name=n, speed=10_000.0) for n in ("a", "b", "c", "d", "sensor")]
    links = {("sensor", "a"): 1.0, ("sensor", "b"): 50.0, ("sensor", "c"): 100.0}
    links[("sensor", "d")] = 100.0
    topo = Topology.of(hosts, Network.from_links(links))
    chain = app(
        [op(f"m{i}", "map", ["src" if i == 0 else f"m{i - 1}"]) for i in range(4)],
        [sink("out", "sensor", ["m3"])],
    )
    lb = place_with("lb", chain, topo)
    # one each (and never back to the sensor once the data left it)
    assert sorted(p[0] for p in lb.operators.values()) == ["a", "b", "c", "d"]
    rtr = place_with("rtr", chain, topo)  # latency-aware: all stay on the sensor
    assert {p[0] for p in rtr.operators.values()} == {"sensor"}
    assert rtr.estimate_ms[("src", "out")] < lb.estimate_ms[("src", "out")]


def test_a_loaded_host_gets_fewer_operators_under_lb() -> None:
    topo = Topology.of([Host(name="sensor", speed=1000.0, spare=0.1), Host(name="x")])
    pipe = app([op("m", "map", ["src"])], [sink("out", "sensor", ["m"])])
    assert place_with("lb", pipe, topo).operators["m"] == ("x",)


def test_pinned_operators_stay_and_every_strategy_places_every_operator() -> None:
    pinned = app(
        [{**op("m", "map", ["src"]), "peer": "sensor"}, op("f", "filter", ["m"])],
        [sink("out", "gateway", ["f"])],
    )
    for strategy in STRATEGIES:
        p = place_with(strategy, pinned, EDGE_CLOUD)
        assert p.operators["m"] == ("sensor",), strategy
        assert set(p.operators) == {"m", "f"}


def test_bundled_apps_place_deterministically_under_every_strategy() -> None:
    for name in apps.names():
        spec = apps.load(name)
        peers = {s.peer for s in spec.sources} | {k.peer for k in spec.sinks}
        hosts = [Host(name=p, speed=20_000.0) for p in sorted(peers)]
        hosts.append(Host(name="cloud-1", speed=200_000.0, zone="cloud"))
        links = {(p, "cloud-1"): 40.0 for p in peers} | {
            (a, b): 1.0 for a in peers for b in peers if a < b
        }
        topo = Topology.of(hosts, Network.from_links(links))
        for strategy in STRATEGIES:
            first = place_with(strategy, spec, topo)
            assert first == place_with(strategy, spec, topo)
            assert set(first.operators) == {o.id for o in spec.operators}
        assert set(place_with("cloud-only", spec, topo).estimate_ms.values()) != {0.0}


def test_regions_cut_at_forks_and_joins() -> None:
    spec = apps.load("profitable-areas")
    assert split_points(spec) == ("clean", "areas")
    nodes = [r.nodes for r in regions(spec)]
    assert nodes[0] == ("trips", "clean")
    assert set(nodes[1:3]) == {("profits", "area-profit"), ("dropoffs", "empty-taxis")}
    assert nodes[3] == ("areas", "profitability", "top-areas", "top-areas-out")
    seq = deployment_sequence(spec)
    assert seq.index("areas") > max(seq.index("area-profit"), seq.index("empty-taxis"))


def test_an_unknown_strategy_is_a_typed_error() -> None:
    with pytest.raises(StrategyError, match="unknown placement strategy 'nearest'"):
        place_with("nearest", PIPELINE, EDGE_CLOUD)
    with pytest.raises(StrategyError, match="no host with spare capacity"):
        place_with("rtr", PIPELINE, Topology.of([Host(name="x", spare=0.0)]))
    with pytest.raises(StrategyError, match="speed"):
        Host(name="x", speed=0.0)
    with pytest.raises(StrategyError, match="given twice"):
        Topology.of([Host(name="x"), Host(name="x")])


@pytest.mark.parametrize("value", ["rtr", "rtr-rp", "cloud-only", "lb", "join-routing"])
def test_the_spec_accepts_every_strategy(value: str) -> None:
    spec = app([op("m", "map", ["src"])], [sink("out", "gateway", ["m"])], placement=value)
    assert spec.placement == value
    assert parse_spec(spec.to_dict()) == spec


def test_the_spec_rejects_an_unknown_strategy_naming_the_field() -> None:
    with pytest.raises(SpecError) as info:
        app([op("m", "map", ["src"])], [sink("out", "gateway", ["m"])], placement="rtr+rp")
    assert [p.path for p in info.value.problems] == ["placement"]
    assert "rtr-rp" in str(info.value)
    assert set(STRATEGIES) | {"join-routing"} == set(PLACEMENTS)


class Model:
    """A link model: a - b - c, 10 ms a hop."""

    bandwidth_mbit = 8.0

    def covers(self, peer: str) -> bool:
        return peer in ("a", "b", "c")

    def optimal_ms(self, origin: str, dest: str, grace_ms: float = 0.0) -> float | None:
        pos = {"a": 0, "b": 1, "c": 2}
        return 10.0 * abs(pos[origin] - pos[dest])


def test_a_live_topology_comes_from_ring_answers_and_the_link_model() -> None:
    def ring(zone: str, workers: int, peers: list[tuple[str, float, float]]) -> dict[str, Any]:
        return {
            "zone": zone,
            "execution": {"workers": workers},
            "apps": ["x-1"] if zone == "cloud" else [],
            "peers": [{"name": n, "rtt_ms": r, "capacity": c} for n, r, c in peers],
        }

    rings = {
        "a": ring("default", 1, [("b", 4.0, 1.0), ("d", 2.0, 0.5)]),
        "b": ring("default", 2, [("a", 6.0, 1.0), ("c", 8.0, 1.0)]),
        "c": ring("cloud", 4, [("b", 8.0, 1.0)]),
        "d": ring("default", 1, [("a", 2.0, 1.0)]),
    }
    topo = topology_of(rings, Model())
    assert topo.cloud() == ("c",)
    assert topo.hosts["b"].speed == 2 * topo.hosts["a"].speed
    assert topo.hosts["d"].spare == 0.5  # as a heard it
    assert topo.hosts["c"].hosted == 1
    net = topo.network
    assert net.latency("a", "c") == 20.0  # the model where it covers both
    assert net.latency("a", "d") == 1.0  # half the measured RTT
    assert net.latency("d", "c") == 1.0 + 2.0 + 4.0  # measured, by shortest path
    assert net.bandwidth("a", "b") == 8.0
    assert topology_of(rings).network.latency("a", "c") == 2.0 + 4.0
