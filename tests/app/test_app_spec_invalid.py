"""Invalid app specs are rejected with every problem named by its field path."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from agiledart.app import App, SpecError, parse_spec
from agiledart.errors import AgiledartError

CODE = "ab" * 32  # a well-formed code id


def base() -> dict[str, Any]:
    return {
        "name": "t",
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "urban", "rate": 100, "count": 10, "seed": 1},
            }
        ],
        "operators": [
            {"id": "hot", "op": "filter", "fn": "builtin:is_hot", "inputs": ["readings"]},
            {"id": "celsius", "op": "map", "fn": f"{CODE}:convert", "inputs": ["hot"]},
            {
                "id": "per-city",
                "op": "window",
                "params": {"size_ms": 5000, "key": "city", "aggregate": "mean", "field": "value"},
                "inputs": ["celsius"],
            },
        ],
        "sinks": [
            {
                "id": "out",
                "peer": "gateway-1",
                "connector": "file",
                "params": {"path": "out.jsonl"},
                "inputs": ["per-city"],
            }
        ],
    }


def errors_of(spec: Any, **kw: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(spec, **kw)
    return info.value


def test_base_is_valid() -> None:
    spec = parse_spec(base())
    assert [o.id for o in spec.operators] == ["hot", "celsius", "per-city"]


def _op(i: int, **changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d["operators"][i].update(changes)

    return mutate


def _params(section: str, i: int, **changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d[section][i].setdefault("params", {}).update(changes)
        for k, v in changes.items():
            if v is None:
                del d[section][i]["params"][k]

    return mutate


def _cycle(d: dict[str, Any]) -> None:
    d["operators"][0]["inputs"] = ["per-city"]


def _dup(d: dict[str, Any]) -> None:
    d["operators"][1]["id"] = "hot"


def _join_one(d: dict[str, Any]) -> None:
    d["operators"].append(
        {"id": "j", "op": "join", "params": {"key": "city", "window_ms": 1000}, "inputs": ["hot"]}
    )
    d["sinks"][0]["inputs"].append("j")


def _join_no_key(d: dict[str, Any]) -> None:
    d["operators"].append(
        {"id": "j", "op": "join", "params": {"window_ms": 1000}, "inputs": ["hot", "celsius"]}
    )
    d["sinks"][0]["inputs"].append("j")


def _sink_no_inputs(d: dict[str, Any]) -> None:
    del d["sinks"][0]["inputs"]


def _sink_empty_inputs(d: dict[str, Any]) -> None:
    d["sinks"][0]["inputs"] = []


def _dangling(d: dict[str, Any]) -> None:
    d["operators"].append(
        {"id": "spare", "op": "filter", "fn": "builtin:is_hot", "inputs": ["hot"]}
    )


def _lonely_source(d: dict[str, Any]) -> None:
    d["sources"].append(
        {
            "id": "extra",
            "peer": "sensor-2",
            "connector": "generator",
            "params": {"dataset": "words", "rate": 5},
        }
    )


def _input_is_sink(d: dict[str, Any]) -> None:
    d["operators"][0]["inputs"] = ["out"]


def _union_one(d: dict[str, Any]) -> None:
    d["operators"][0] = {"id": "hot", "op": "union", "inputs": ["readings"]}


def _topk_bad(d: dict[str, Any]) -> None:
    d["operators"][2] = {
        "id": "per-city",
        "op": "top_k",
        "params": {"k": 0, "window_ms": 1000},
        "inputs": ["celsius"],
    }


def _dedupe_bad(d: dict[str, Any]) -> None:
    d["operators"][2] = {
        "id": "per-city",
        "op": "dedupe",
        "params": {"key": "id"},
        "inputs": ["celsius"],
    }


CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("unknown operator", _op(2, op="windw"), "operators[2].op", "did you mean 'window'"),
    ("cycle", _cycle, "operators[0].inputs", "cycle hot -> celsius -> per-city -> hot"),
    ("missing input", _op(1, inputs=["hott"]), "operators[1].inputs", "unknown input 'hott'"),
    ("no inputs", _op(1, inputs=None), "operators[1].inputs", "missing; a map needs inputs"),
    (
        "size not positive",
        _params("operators", 2, size_ms=-5),
        "operators[2].params.size_ms",
        "positive integer",
    ),
    (
        "size not int",
        _params("operators", 2, size_ms=1.5),
        "operators[2].params.size_ms",
        "positive integer",
    ),
    (
        "slide > size",
        _params("operators", 2, slide_ms=6000),
        "operators[2].params.slide_ms",
        "must not exceed size_ms",
    ),
    (
        "bad aggregate",
        _params("operators", 2, aggregate="median"),
        "operators[2].params.aggregate",
        "one of count, sum, mean, min, max",
    ),
    (
        "field missing",
        _params("operators", 2, field=None),
        "operators[2].params.field",
        "needs the numeric field",
    ),
    (
        "unknown window param",
        _params("operators", 2, sise_ms=5),
        "operators[2].params.sise_ms",
        "did you mean 'size_ms'",
    ),
    ("fn missing", _op(0, fn=None), "operators[0].fn", "filter needs fn"),
    ("fn on window", _op(2, fn="builtin:is_hot"), "operators[2].fn", "window takes no fn"),
    ("fn format", _op(1, fn="abc:convert"), "operators[1].fn", "3 characters, not 64"),
    ("fn no colon", _op(1, fn="convert"), "operators[1].fn", "':' is missing"),
    ("fn uppercase", _op(1, fn=CODE.upper() + ":f"), "operators[1].fn", "lowercase"),
    ("unknown builtin", _op(0, fn="builtin:is_hott"), "operators[0].fn", "did you mean 'is_hot'"),
    ("builtin kind", _op(0, fn="builtin:split_words"), "operators[0].fn", "is a flat_map function"),
    (
        "builtin param",
        _params("operators", 0, treshold=3),
        "operators[0].params.treshold",
        "did you mean 'threshold'",
    ),
    ("duplicate id", _dup, "operators[1].id", "duplicate id 'hot' (also operators[0].id)"),
    ("join one input", _join_one, "operators[3].inputs", "exactly 2 inputs"),
    ("join no key", _join_no_key, "operators[3].params.key", "missing; join needs key"),
    ("union one input", _union_one, "operators[0].inputs", "at least 2 inputs"),
    ("top_k params", _topk_bad, "operators[2].params.k", "positive integer"),
    ("top_k by", _topk_bad, "operators[2].params.by", "missing"),
    ("dedupe ttl", _dedupe_bad, "operators[2].params.ttl_ms", "missing"),
    ("sink without inputs", _sink_no_inputs, "sinks[0].inputs", "missing"),
    ("sink empty inputs", _sink_empty_inputs, "sinks[0].inputs", "at least 1 input"),
    ("dangling operator", _dangling, "operators[3]", "reaches no sink"),
    ("source reaches no sink", _lonely_source, "sources[1]", "reaches no sink"),
    ("input is a sink", _input_is_sink, "operators[0].inputs", "'out' is a sink"),
    (
        "unknown source connector",
        lambda d: d["sources"][0].update(connector="kafka"),
        "sources[0].connector",
        "generator, file, mqtt",
    ),
    (
        "unknown sink connector",
        lambda d: d["sinks"][0].update(connector="kafka"),
        "sinks[0].connector",
        "file, mqtt, stdout",
    ),
    (
        "unknown dataset",
        _params("sources", 0, dataset="weather"),
        "sources[0].params.dataset",
        "urban, taxi, words, counter",
    ),
    ("rate zero", _params("sources", 0, rate=0), "sources[0].params.rate", "positive number"),
    ("count negative", _params("sources", 0, count=-1), "sources[0].params.count", ">= 0"),
    ("seed not int", _params("sources", 0, seed="x"), "sources[0].params.seed", "an integer"),
    ("rate bool", _params("sources", 0, rate=True), "sources[0].params.rate", "positive number"),
    (
        "dataset extra",
        _params("sources", 0, cells=3),
        "sources[0].params.cells",
        "unknown parameter",
    ),
    (
        "file path missing",
        lambda d: d["sinks"][0].update(params={}),
        "sinks[0].params.path",
        "missing",
    ),
    (
        "file format",
        lambda d: d["sinks"][0].update(params={"path": "x.txt"}),
        "sinks[0].params.format",
        "set format: jsonl",
    ),
    (
        "bad file format",
        lambda d: d["sinks"][0].update(params={"path": "x", "format": "xml"}),
        "sinks[0].params.format",
        "jsonl, csv",
    ),
    ("missing peer", lambda d: d["sources"][0].pop("peer"), "sources[0].peer", "missing"),
    ("bad id", _op(0, id="has space"), "operators[0].id", "letters, digits"),
    ("unknown top field", lambda d: d.update(sorces=[]), "sorces", "did you mean 'sources'"),
    ("unknown node field", _op(0, input=["x"]), "operators[0].input", "did you mean 'inputs'"),
    ("no name", lambda d: d.pop("name"), "name", "missing"),
    ("placement", lambda d: d.update(placement="nearest"), "placement", "join-routing"),
    (
        "checkpoint",
        lambda d: d.update(checkpoint={"mode": "never"}),
        "checkpoint.mode",
        "auto, restart, erasure",
    ),
    (
        "source inputs",
        lambda d: d["sources"][0].update(inputs=["x"]),
        "sources[0].inputs",
        "sources take no inputs",
    ),
    (
        "params not plain",
        _params("operators", 1, when=object()),
        "operators[1].params.when",
        "plain data",
    ),
    (
        "on_error policy",
        lambda d: d["operators"][1].update(on_error="fial"),
        "operators[1].on_error",
        "did you mean 'fail'",
    ),
]


@pytest.mark.parametrize(("what", "mutate", "path", "text"), CASES, ids=[c[0] for c in CASES])
def test_invalid_spec_names_the_field(
    what: str, mutate: Callable[[dict[str, Any]], None], path: str, text: str
) -> None:
    spec = base()
    mutate(spec)
    err = errors_of(spec)
    hits = [p for p in err.problems if p.path == path]
    assert hits, f"no problem at {path}: {err}"
    assert any(text in p.message for p in hits), str(err)
    assert path in str(err)
    assert isinstance(err, AgiledartError)


def test_all_problems_reported_together() -> None:
    spec = base()
    spec["operators"][2]["params"]["size_ms"] = 0
    spec["operators"][0]["fn"] = "nope"
    spec["sinks"][0]["connector"] = "ftp"
    err = errors_of(spec)
    assert {"operators[2].params.size_ms", "operators[0].fn", "sinks[0].connector"} <= set(
        err.paths
    )
    assert "3 problems" in str(err)


def test_unknown_peers_named() -> None:
    err = errors_of(base(), known_peers=["sensor-1", "gateway-2"])
    assert err.paths == ("sinks[0].peer",)
    assert "unknown peer 'gateway-1' (did you mean 'gateway-2'?)" in str(err)
    assert parse_spec(base(), known_peers=["sensor-1", "gateway-1", "x"]).name == "t"


def test_yaml_syntax_error() -> None:
    err = errors_of("name: [unclosed\n")
    assert "not valid YAML at line" in str(err)


def test_not_a_mapping() -> None:
    assert "mapping" in str(errors_of("- 1\n- 2\n"))


def test_entry_not_a_mapping() -> None:
    spec = base()
    spec["operators"].append("oops")
    err = errors_of(spec)
    assert "operators[3]" in err.paths


def test_builder_reports_same_paths() -> None:
    app = App("t")
    app.source("r", peer="p", connector="generator", dataset="urban", rate=10, count=5).window(
        "w", size_ms=0, aggregate="sum"
    ).sink("out", peer="p", connector="stdout")
    with pytest.raises(SpecError) as info:
        app.build()
    assert set(info.value.paths) == {"operators[0].params.size_ms", "operators[0].params.field"}


def test_key_by_needs_exactly_one_of_fn_or_key() -> None:
    spec = base()
    spec["operators"][1] = {"id": "celsius", "op": "key_by", "inputs": ["hot"]}
    assert "either fn or params.key" in str(errors_of(copy.deepcopy(spec)))
    spec["operators"][1].update(fn="builtin:is_hot", params={"key": "city"})
    assert "not both" in str(errors_of(spec))


def test_window_shape_limits() -> None:
    spec = base()
    spec["operators"][2]["params"].update(size_ms=3_600_000, slide_ms=1000)
    assert "3600 windows" in str(errors_of(copy.deepcopy(spec)))
    spec["operators"][2]["params"].update(size_ms=1_000_003, slide_ms=999_999)
    assert "panes per window" in str(errors_of(spec))
