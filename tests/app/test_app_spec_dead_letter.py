"""``on_error: dead_letter`` and its ``dead_letter:`` sink: validated like the app's
sinks (one problem per field, with did-you-mean), only together, and set by ``--set``
like any other field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agiledart.app import SpecError, parse_spec
from agiledart.app.spec import DEAD_LETTER_PATH


def base(**op: Any) -> dict[str, Any]:
    return {
        "name": "t",
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "urban", "rate": 100, "count": 10},
            }
        ],
        "operators": [
            {
                "id": "hot",
                "op": "filter",
                "fn": "builtin:is_hot",
                "inputs": ["readings"],
                "on_error": "dead_letter",
                "dead_letter": {"type": "file", "path": "bad/{app}-{op}-{peer}.jsonl"},
                **op,
            }
        ],
        "sinks": [{"id": "out", "peer": "gw-1", "connector": "discard", "inputs": ["hot"]}],
    }


def problems(spec: dict[str, Any], *sets: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(spec, overrides=sets)
    return {p.path: p.message for p in info.value.problems}


def test_a_dead_letter_file_round_trips_and_fills_its_placeholders_per_peer() -> None:
    spec = parse_spec(base())
    assert parse_spec(spec.to_dict()) == spec
    letters = spec.operator("hot").dead_letter
    assert letters is not None
    assert letters.to_dict() == {
        "type": "file",
        "path": "bad/{app}-{op}-{peer}.jsonl",
        "format": "jsonl",
        "flush_ms": 1000,
    }
    sink = letters.sink(app="t-1a2b3c", op="hot", peer="gw-2")
    assert (sink.connector, sink.params["path"]) == ("file", "bad/t-1a2b3c-hot-gw-2.jsonl")


def test_a_dead_letter_file_without_a_path_gets_one_per_operator_and_peer() -> None:
    spec = parse_spec(base(dead_letter={"type": "file"}))
    letters = spec.operator("hot").dead_letter
    assert letters is not None
    assert letters.params["path"] == DEAD_LETTER_PATH
    assert letters.sink(app="a", op="hot", peer="p-1").params["path"] == (
        DEAD_LETTER_PATH.replace("{op}", "hot").replace("{peer}", "p-1")
    )


def test_an_mqtt_dead_letter_sink_takes_the_mqtt_sink_parameters() -> None:
    mqtt = {"type": "mqtt", "topic": "bad/{op}/{error_type}", "broker": "gw:1883", "qos": 1}
    spec = parse_spec(base(dead_letter=mqtt))
    letters = spec.operator("hot").dead_letter
    assert letters is not None
    assert letters.connector == "mqtt"
    assert (letters.params["qos"], letters.params["buffer"]) == (1, 10_000)
    assert parse_spec(spec.to_dict()) == spec


CASES: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    (
        "policy without a sink",
        lambda op: op.pop("dead_letter"),
        "operators[0].dead_letter",
        "missing; on_error: dead_letter needs a sink",
    ),
    (
        "sink without the policy",
        lambda op: op.pop("on_error"),
        "operators[0].dead_letter",
        "needs on_error: dead_letter (this operator's is count)",
    ),
    (
        "sink with another policy",
        lambda op: op.update(on_error="fail"),
        "operators[0].dead_letter",
        "(this operator's is fail)",
    ),
    (
        "not a mapping",
        lambda op: op.update(dead_letter="bad.jsonl"),
        "operators[0].dead_letter",
        "must be a mapping: type (file or mqtt)",
    ),
    (
        "no type",
        lambda op: op["dead_letter"].pop("type"),
        "operators[0].dead_letter.type",
        "missing; a dead-letter sink's type is one of file, mqtt",
    ),
    (
        "unknown type",
        lambda op: op["dead_letter"].update(type="fiel"),
        "operators[0].dead_letter.type",
        "unknown type 'fiel' (did you mean 'file'?)",
    ),
    (
        "a sink connector that is not for dead letters",
        lambda op: op["dead_letter"].update(type="stdout"),
        "operators[0].dead_letter.type",
        "use one of file, mqtt",
    ),
    (
        "unknown parameter",
        lambda op: op["dead_letter"].update(flush_sm=10),
        "operators[0].dead_letter.flush_sm",
        "(did you mean 'flush_ms'?); a file dead-letter sink takes: path, format, flush_ms",
    ),
    (
        "unknown placeholder",
        lambda op: op["dead_letter"].update(path="{peer}/{opp}.jsonl"),
        "operators[0].dead_letter.path",
        "unknown placeholder {opp} (did you mean 'op'?)",
    ),
    (
        "csv",
        lambda op: op["dead_letter"].update(path="bad.csv"),
        "operators[0].dead_letter.format",
        "dead letters are JSON objects: use format: jsonl",
    ),
    (
        "mqtt without a topic",
        lambda op: op.update(dead_letter={"type": "mqtt"}),
        "operators[0].dead_letter.topic",
        "missing; a mqtt dead-letter sink needs topic",
    ),
    (
        "mqtt topic of a field a dead letter lacks",
        lambda op: op.update(dead_letter={"type": "mqtt", "topic": "bad/{city}"}),
        "operators[0].dead_letter.topic",
        "a dead letter has no field 'city'",
    ),
]


@pytest.mark.parametrize(("what", "mutate", "path", "text"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_dead_letter_is_one_problem_at_its_field(
    what: str, mutate: Callable[[dict[str, Any]], Any], path: str, text: str
) -> None:
    spec = base()
    mutate(spec["operators"][0])
    found = problems(spec)
    assert list(found) == [path], found
    assert text in found[path]


def test_every_bad_field_of_a_dead_letter_sink_is_its_own_problem() -> None:
    letters = {"type": "mqtt", "topic": "a/+", "qos": 2, "brokr": "x:1"}
    found = problems(base(dead_letter=letters))
    assert set(found) == {
        "operators[0].dead_letter.topic",
        "operators[0].dead_letter.qos",
        "operators[0].dead_letter.brokr",
    }
    assert "did you mean 'broker'" in found["operators[0].dead_letter.brokr"]


def test_set_gives_an_operator_a_dead_letter_sink_and_changes_its_fields() -> None:
    plain = base()
    op = plain["operators"][0]
    del op["on_error"], op["dead_letter"]
    spec = parse_spec(
        plain,
        overrides=[
            "operators.hot.on_error=dead_letter",
            "operators.hot.dead_letter={type: file}",
            "operators.hot.dead_letter.path=rejects-{peer}.jsonl",
        ],
    )
    letters = spec.operator("hot").dead_letter
    assert letters is not None
    assert letters.params["path"] == "rejects-{peer}.jsonl"
    found = problems(base(), "operators.hot.dead_letter.type=ftp")
    assert "unknown type 'ftp'" in found["operators[0].dead_letter.type"]
