"""Valid specs: bundled apps, builder == YAML, round trips, parameter binding, graph."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from agiledart import apps
from agiledart.app import (
    App,
    SpecError,
    apply_overrides,
    chains,
    merge_points,
    parse_override,
    parse_spec,
    topological_order,
)
from agiledart.app.graph import consumers

YAML = """
name: urban-sensing
params: {threshold: 25.5, rate: 2000}
sources:
  - id: readings
    peer: sensor-1
    connector: generator
    params: {dataset: urban, rate: "${rate}", count: 100000, seed: 7}
operators:
  - id: hot
    op: filter
    fn: "builtin:is_hot"
    params: {threshold: "${threshold}"}
    inputs: [readings]
  - id: per-city
    op: window
    params: {size_ms: 5000, key: city, aggregate: mean, field: value}
    inputs: [hot]
sinks:
  - id: out
    peer: gateway-1
    connector: file
    params: {path: "out-${rate}.jsonl"}
    inputs: [per-city]
"""


def build() -> App:
    return (
        App("urban-sensing", params={"threshold": 25.5, "rate": 2000})
        .source(
            "readings",
            peer="sensor-1",
            connector="generator",
            dataset="urban",
            rate=2000,
            count=100000,
            seed=7,
        )
        .filter("hot", "builtin:is_hot", threshold=25.5)
        .window("per-city", size_ms=5000, key="city", aggregate="mean", field="value")
        .sink("out", peer="gateway-1", connector="file", path="out-2000.jsonl")
    )


def test_builder_equals_yaml() -> None:
    spec = parse_spec(YAML)
    assert build().build() == spec
    assert spec.operator("per-city").params["slide_ms"] == 5000  # default filled
    assert spec.sources[0].params["rate"] == 2000  # typed substitution
    assert spec.sinks[0].params["path"] == "out-2000.jsonl"  # text substitution


def test_spec_is_frozen() -> None:
    spec = parse_spec(YAML)
    with pytest.raises(AttributeError):
        spec.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.sources[0].params["rate"] = 1  # type: ignore[index]


@pytest.mark.parametrize("name", apps.names())
def test_bundled_app_parses_and_round_trips(name: str) -> None:
    spec = apps.load(name)
    assert spec.name == name
    assert spec.finite
    d = spec.to_dict()
    assert parse_spec(d) == spec
    assert parse_spec(json.loads(json.dumps(d))) == spec
    assert parse_spec(msgpack.unpackb(msgpack.packb(d))) == spec
    peers = {s.peer for s in spec.sources} | {s.peer for s in spec.sinks}
    assert parse_spec(d, known_peers=peers) == spec


def test_bundled_names() -> None:
    assert set(apps.names()) >= {
        "urban-sensing",
        "frequent-routes",
        "profitable-areas",
        "word-count",
        "etl",
        "stats",
        "throughput",
    }
    with pytest.raises(SpecError, match="no bundled app"):
        apps.text("nope")
    with pytest.raises(SpecError, match="neither a bundled app"):
        apps.load("nope")


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(YAML)
    assert apps.load(path) == parse_spec(YAML)


def test_overrides_by_id_and_index() -> None:
    spec = parse_spec(
        YAML,
        overrides=[
            "sources.readings.params.rate=500",
            "operators.per-city.params.size_ms=10000",
            "operators[0].params.threshold=30",
            "sinks.out.peer=gateway-2",
            "placement=random",
            "checkpoint.interval_ms=5000",
            "scaling.enabled=true",
            "scaling.interval_ms=10000",
        ],
    )
    assert spec.sources[0].params["rate"] == 500
    assert spec.operator("per-city").params["size_ms"] == 10000
    assert spec.operator("per-city").params["slide_ms"] == 10000
    assert spec.operator("hot").params["threshold"] == 30
    assert spec.sinks[0].peer == "gateway-2"
    assert spec.placement == "random"
    assert spec.checkpoint.interval_ms == 5000
    assert (spec.scaling.enabled, spec.scaling.interval_ms) == (True, 10_000)


def test_top_level_params_rebind_everywhere() -> None:
    spec = parse_spec(YAML, overrides=["params.rate=750", "params.threshold=31"])
    assert spec.sources[0].params["rate"] == 750
    assert spec.sinks[0].params["path"] == "out-750.jsonl"
    assert spec.operator("hot").params["threshold"] == 31
    assert spec.params["rate"] == 750


def test_override_value_types() -> None:
    assert parse_override("a.b=500") == ("a.b", 500)
    assert parse_override("a=true") == ("a", True)
    assert parse_override("a=[x, y]") == ("a", ["x", "y"])
    assert parse_override('a="500"') == ("a", "500")
    assert parse_override("a=") == ("a", None)
    assert parse_override("a=x: y: z") == ("a", "x: y: z")
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_override("novalue")


def test_bad_overrides_named() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(
            YAML,
            overrides=[
                "sources.readngs.params.rate=5",
                "params.treshold=3",
                "bogus.x=1",
                "operators.hot=1",
            ],
        )
    err = info.value
    assert set(err.paths) == {
        "--set sources.readngs.params.rate",
        "--set params.treshold",
        "--set bogus.x",
        "--set operators.hot",
    }
    assert "did you mean 'readings'" in str(err)
    assert "did you mean 'threshold'" in str(err)


def test_override_then_validation() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(YAML, overrides=["sources.readings.params.rate=-1"])
    assert info.value.paths == ("sources[0].params.rate",)


def test_apply_overrides_does_not_touch_input() -> None:
    raw: dict[str, Any] = {"name": "a", "params": {"x": 1}}
    out = apply_overrides(raw, {"params.x": 2})
    assert out["params"]["x"] == 2
    assert raw["params"]["x"] == 1


def test_param_without_value_must_be_set() -> None:
    text = YAML.replace("threshold: 25.5", "threshold: null")
    with pytest.raises(SpecError, match=r"--set params\.threshold=VALUE"):
        parse_spec(text)
    assert parse_spec(text, overrides=["params.threshold=3"]).operator("hot").params == {
        "threshold": 3
    }


def test_a_forgotten_code_parameter_is_one_problem_per_field() -> None:
    text = """
name: t
params: {code: null}
sources:
  - {id: s, peer: p, connector: generator, params: {dataset: urban, rate: 10, count: 10}}
operators:
  - {id: a, op: map, fn: "${code}:f", inputs: [s]}
  - {id: b, op: filter, fn: "${code}:g", inputs: [a]}
sinks:
  - {id: o, peer: p, connector: discard, inputs: [b]}
"""
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert info.value.paths == ("operators[0].fn", "operators[1].fn")
    assert str(info.value).count("--set params.code=VALUE") == 2
    assert "bad function reference" not in str(info.value)  # a follow-on of the first


def test_unknown_param_reference() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(YAML.replace("${threshold}", "${treshold}"))
    assert info.value.paths == ("operators[0].params.threshold",)
    assert "did you mean 'threshold'" in str(info.value)


def test_graph_helpers_on_a_diamond() -> None:
    spec = apps.load("profitable-areas")
    order = topological_order(spec)
    for o in spec.operators:
        assert all(order.index(i) < order.index(o.id) for i in o.inputs)
    assert order[0] == "trips"
    assert order[-1] == "top-areas-out"
    assert merge_points(spec) == ["areas"]
    paths = chains(spec)["top-areas-out"]
    assert paths == [
        (
            "trips",
            "clean",
            "profits",
            "area-profit",
            "areas",
            "profitability",
            "top-areas",
            "top-areas-out",
        ),
        (
            "trips",
            "clean",
            "dropoffs",
            "empty-taxis",
            "areas",
            "profitability",
            "top-areas",
            "top-areas-out",
        ),
    ]
    cons = consumers(spec)
    assert cons["clean"] == [("profits", 0), ("dropoffs", 0)]
    assert cons["empty-taxis"] == [("areas", 1)]


def test_graph_helpers_multi_source() -> None:
    spec = apps.load("urban-sensing")
    assert merge_points(spec) == ["readings"]
    c = chains(spec)
    assert [p[0] for p in c["averages-out"]] == ["readings-a", "readings-b"]
    assert all(p[-1] == "peaks-out" for p in c["peaks-out"])


def test_stateful_and_checkpoint_defaults() -> None:
    spec = apps.load("stats")
    assert spec.stateful
    assert spec.checkpoint.mode == "auto"
    assert {o.id for o in spec.operators if o.stateful} == {"mean", "low", "high", "per-metric"}


def test_builder_with_fork_and_join_equals_bundled_yaml() -> None:
    app = App("profitable-areas", params={"rate": 500, "count": 30000, "window_ms": 15000})
    trips = app.source(
        "trips",
        peer="sensor-1",
        connector="generator",
        dataset="taxi",
        rate="${rate}",
        count="${count}",
        seed=2016,
        cells=300,
    )
    clean = trips.filter("clean", "builtin:valid_trip")
    profit = clean.map("profits", "builtin:profit").window(
        "area-profit", size_ms=15000, key="cell", aggregate="mean", field="profit"
    )
    empty = clean.map("dropoffs", "builtin:dropoff").window(
        "empty-taxis", size_ms=15000, key="cell", aggregate="count"
    )
    (
        profit.join("areas", empty, key="key", window_ms=15000)
        .map("profitability", "builtin:profitability")
        .top_k("top-areas", k=10, by="profitability", window_ms=15000)
        .sink("top-areas-out", peer="gateway-1", connector="file", path="profitable-areas.jsonl")
    )
    assert app.build() == apps.load("profitable-areas")
