"""The MQTT connectors' pure parts: topic grammar and wildcard matching, the
subscription table, back-off, payload decoding, and the spec's mqtt parameters."""

from __future__ import annotations

import json
import random
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agiledart.app import parse_spec
from agiledart.app.errors import DataError, ExecutionError, SpecError
from agiledart.app.topics import (
    TopicTemplate,
    filter_problem,
    template_problem,
    topic_matches,
    topic_problem,
)
from agiledart.runtime.mqtt import (
    MAX_PAYLOAD,
    Backoff,
    BrokerOptions,
    PayloadDecoder,
    SubscriptionTable,
    encode_payload,
    parse_broker,
    plan,
)

# -- topics -------------------------------------------------------------------------------

MATCHES = [
    ("sensors/#", "sensors/Boston/dust", True),
    ("sensors/#", "sensors", True),  # '#' also matches the parent level
    ("sensors/#", "sensorsX/a", False),
    ("#", "a/b/c", True),
    ("sensors/+/dust", "sensors/Boston/dust", True),
    ("sensors/+/dust", "sensors/Boston/light", False),
    ("sensors/+/dust", "sensors/Boston/x/dust", False),
    ("sensors/+", "sensors/", True),  # an empty level is a level
    ("sensors/+", "sensors", False),
    ("+/+", "/finance", True),
    ("+", "/finance", False),
    ("a/b", "a/b", True),
    ("a/b", "a/b/", False),
    ("a/b", "A/b", False),  # case matters
    ("#", "$SYS/broker/load", False),  # wildcards first do not match $ topics
    ("+/broker/load", "$SYS/broker/load", False),
    ("$SYS/#", "$SYS/broker/load", True),
    ("sensors/Rio de Janeiro/+", "sensors/Rio de Janeiro/dust", True),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCHES)
def test_wildcard_matching(topic_filter: str, topic: str, expected: bool) -> None:
    assert filter_problem(topic_filter) is None
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize(
    ("topic_filter", "problem"),
    [
        ("", "empty"),
        ("a/#/b", "last"),
        ("a#", "whole level"),
        ("a/b+", "whole level"),
        ("a/+b/c", "whole level"),
        ("a\0b", "NUL"),
        ("x" * 70_000, "65535"),
    ],
)
def test_bad_filters_say_why(topic_filter: str, problem: str) -> None:
    bad = filter_problem(topic_filter)
    assert bad is not None
    assert problem in bad


def test_topics_and_templates() -> None:
    assert topic_problem("out/a") is None
    assert "wildcards" in (topic_problem("out/+") or "")
    assert template_problem("out/{key}/{metric}") is None
    assert template_problem("out/{{literal}}") is None
    for bad, why in [
        ("out/{key", "expected '}'"),
        ("out/{}", "placeholder"),
        ("out/{0}", "placeholder"),
        ("out/{a.b}", "placeholder"),
        ("out/{key!r}", "placeholder"),
        ("out/{key:>3}", "placeholder"),
        ("out/#", "wildcards"),
    ]:
        assert why in (template_problem(bad) or ""), bad
    t = TopicTemplate("out/{key}/{n}")
    assert t.fields == ("key", "n")
    assert t.fill({"key": "Boston", "n": 3}) == "out/Boston/3"
    assert t.fill({"key": None, "n": True}) == "out/null/true"
    assert t.fill({"key": 1.5, "n": -2}) == "out/1.5/-2"
    with pytest.raises(ValueError, match="no field 'n'"):
        t.fill({"key": "a"})
    with pytest.raises(ValueError, match="wildcards"):
        t.fill({"key": "a/#", "n": 1})
    with pytest.raises(ValueError, match="cannot go in a topic"):
        t.fill({"key": [1], "n": 1})
    with pytest.raises(ValueError, match="cannot go in a topic"):
        t.fill({"key": float("nan"), "n": 1})
    assert TopicTemplate("fixed/topic").fill({}) == "fixed/topic"
    with pytest.raises(ValueError, match="bad topic template"):
        TopicTemplate("out/+")


# -- subscription table -------------------------------------------------------------------


def test_many_subscribers_on_one_filter_make_one_subscription() -> None:
    table = SubscriptionTable()
    got: list[tuple[str, str]] = []
    a = table.add("s/#", 0, lambda t, p: got.append(("a", t)))
    b = table.add("s/#", 1, lambda t, p: got.append(("b", t)))
    c = table.add("s/x", 0, lambda t, p: got.append(("c", t)))
    wanted = table.wanted()
    assert set(wanted) == {"s/#", "s/x"}
    assert wanted["s/#"][0] == 1  # the highest QoS asked for
    assert wanted["s/#"][1] != wanted["s/x"][1]  # one subscription id per filter
    assert len(table) == 3
    for deliver in table.route("s/x"):
        deliver("s/x", b"")
    assert sorted(got) == [("a", "s/x"), ("b", "s/x"), ("c", "s/x")]
    # the broker names the filter a copy is for: each subscriber gets one copy
    got.clear()
    for sid in (wanted["s/#"][1], wanted["s/x"][1]):
        for deliver in table.route("s/x", [sid]):
            deliver("s/x", b"")
    assert sorted(got) == [("a", "s/x"), ("b", "s/x"), ("c", "s/x")]
    assert table.route("other") == []
    assert table.route("s/x", [999]) == []  # an id no longer subscribed
    assert not table.remove("s/#", b)  # a is still there
    assert table.wanted()["s/#"][0] == 0
    assert table.remove("s/#", a)  # the last one: unsubscribe
    assert not table.remove("s/#", a)  # twice does nothing
    assert set(table.wanted()) == {"s/x"}
    assert table.remove("s/x", c)
    assert table.wanted() == {}


def test_the_table_refuses_bad_filters_and_qos() -> None:
    table = SubscriptionTable()
    with pytest.raises(ExecutionError, match="whole level"):
        table.add("a/b#", 0, lambda t, p: None)
    with pytest.raises(ExecutionError, match="qos"):
        table.add("a", 2, lambda t, p: None)
    assert table.wanted() == {}


def test_plan_subscribes_what_is_missing_and_drops_what_is_not_wanted() -> None:
    wanted = {"a": (0, 1), "b": (1, 2), "c": (0, 3)}
    granted = {"a": (0, 1), "b": (0, 2), "old": (0, 9)}
    subscribe, unsubscribe = plan(wanted, granted, {"c": "not authorized"})
    assert subscribe == [("b", 1, 2)]  # a QoS upgrade re-subscribes; c was refused
    assert unsubscribe == ["old"]
    assert plan(wanted, dict(wanted)) == ([], [])


def test_backoff_doubles_to_the_cap_with_bounded_jitter() -> None:
    rng = random.Random(1)
    b = Backoff()
    delays = [b.delay(i, rng) for i in range(12)]
    for i, d in enumerate(delays):
        base = min(5.0, 0.1 * 2**i)
        assert base * (1 - b.jitter) <= d <= base
    assert delays[-1] > 3.9
    assert b.delay(10_000, rng) <= 5.0  # no overflow however long the broker is away


# -- options and payloads -----------------------------------------------------------------


def test_broker_options_from_params() -> None:
    assert parse_broker("mqtt.local:8883") == ("mqtt.local", 8883)
    assert parse_broker("[::1]:1883") == ("::1", 1883)
    for bad in ("nohost", ":1883", "h:0", "h:99999", "h:x"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_broker(bad)
    o = BrokerOptions.from_params(
        {"broker": "b:1884", "username": "u", "password_env": "PW"},
        owner="source 's'",
        environ={"PW": "secret"},
    )
    assert (o.host, o.port, o.username, o.password) == ("b", 1884, "u", "secret")
    assert "secret" not in repr(o)
    with pytest.raises(ExecutionError, match="source 's': password_env names 'PW'"):
        BrokerOptions.from_params({"password_env": "PW"}, owner="source 's'", environ={})
    with pytest.raises(ExecutionError, match="cannot use ca_file"):
        BrokerOptions.from_params({"tls": True, "ca_file": "/nonexistent.pem"}, owner="sink")
    assert BrokerOptions.from_params({"tls": True}, owner="sink").ssl_context() is not None


def decoder(**kw: Any) -> PayloadDecoder:
    return PayloadDecoder(wall_ms=lambda: 1234.9, **kw)


def test_payloads_become_records() -> None:
    d = decoder()
    assert d("t", b'{"ts": 5, "v": 1.5}') == {"ts": 5, "v": 1.5}
    assert d("t", b'{"v": 1}') == {"v": 1, "ts": 1234}  # arrival time
    assert d("t", b'{"ts": 7.0}') == {"ts": 7}
    assert d("t", b"23.5") == {"value": 23.5, "ts": 1234}  # a bare reading
    m = decoder(format="msgpack", topic_field="topic")
    assert m("a/b", msgpack.packb({"ts": 1, "x": b"\x00"})) == {
        "ts": 1,
        "x": b"\x00",
        "topic": "a/b",
    }
    f = decoder(fields={"value": "v", "ts": "time"}, topic_field="where")
    assert f("s/1", b'{"v": 3, "time": 9, "other": 0}') == {"value": 3, "ts": 9, "where": "s/1"}
    record = {"ts": 3, "city": "Boston", "value": 0.1}
    for fmt in ("json", "msgpack"):
        assert decoder(format=fmt)("t", encode_payload(record, fmt)) == record


@pytest.mark.parametrize(
    ("payload", "kw", "why"),
    [
        (b"{nope", {}, "not json"),
        (b"\xff\xfe\x00", {}, "not json"),
        (b'{"ts": 1.5}', {}, "'ts' must be an integer"),
        (b'{"ts": true}', {}, "'ts' must be an integer"),
        (b'{"ts": "noon"}', {}, "'ts' must be an integer"),
        (b'{"v": 1}', {"fields": {"value": "x"}}, "no 'x'"),
        (b"\xc1", {"format": "msgpack"}, "not msgpack"),
        (msgpack.packb({1: 2}, strict_types=False), {"format": "msgpack"}, "not msgpack"),
        (b"[" * 100_000, {}, "not json"),
        (b" " * (MAX_PAYLOAD + 1), {}, "limit"),
    ],
)
def test_bad_payloads_are_a_data_error(payload: bytes, kw: dict[str, Any], why: str) -> None:
    with pytest.raises(DataError, match=why):
        decoder(**kw)("t", payload)


@given(st.binary(max_size=300), st.sampled_from(["json", "msgpack"]))
def test_any_payload_is_a_record_or_a_data_error(payload: bytes, fmt: str) -> None:
    try:
        record = decoder(format=fmt, topic_field="topic")("t/x", payload)
    except DataError:
        return
    assert isinstance(record, dict)
    assert type(record["ts"]) is int
    assert record["topic"] == "t/x"
    json.dumps(record, default=repr)


# -- the spec -----------------------------------------------------------------------------


def app(source: dict[str, Any], sink: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "m",
        "sources": [{"id": "s", "peer": "p", "connector": "mqtt", "params": source}],
        "sinks": [{"id": "o", "peer": "p", "connector": "mqtt", "params": sink, "inputs": ["s"]}],
    }


def test_mqtt_params_are_filled_in_and_count_makes_an_app_finite() -> None:
    spec = parse_spec(app({"topic": "s/#"}, {"topic": "out/{key}"}))
    src, sink = spec.sources[0].params, spec.sinks[0].params
    assert src["broker"] == "localhost:1883"
    assert (src["qos"], src["format"], src["buffer"], src["buffer_mb"], src["overload"]) == (
        0,
        "json",
        1_000_000,  # a source's buffer is its log on the peer's disk
        256,
        "shed-oldest",
    )
    assert (sink["drain_timeout_ms"], sink["buffer"]) == (30_000, 10_000)
    assert not spec.finite
    spec = parse_spec(app({"topic": "s/#", "count": 10, "fields": {"v": "value"}}, {"topic": "o"}))
    assert spec.finite
    assert parse_spec(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("source", "sink", "path", "message"),
    [
        ({"topic": "s/#/x"}, {"topic": "o"}, "sources[0].params.topic", "whole level"),
        ({"topic": "s"}, {"topic": "o/+"}, "sinks[0].params.topic", "wildcards"),
        ({"topic": "s"}, {"topic": "o/{a.b}"}, "sinks[0].params.topic", "placeholder"),
        ({"topic": "s", "broker": "h"}, {"topic": "o"}, "sources[0].params.broker", "HOST:PORT"),
        ({"topic": "s", "qos": 2}, {"topic": "o"}, "sources[0].params.qos", "one of 0, 1"),
        ({"topic": "s", "fields": ["v"]}, {"topic": "o"}, "sources[0].params.fields", "mapping"),
        ({"topic": "s", "format": "xml"}, {"topic": "o"}, "sources[0].params.format", "msgpack"),
        ({"topic": "s"}, {"topic": "o", "buffer": 0}, "sinks[0].params.buffer", "positive"),
        (
            {"topic": "s", "password": "x", "password_env": "P"},
            {"topic": "o"},
            "sources[0].params.password_env",
            "not both",
        ),
        ({"topic": "s"}, {"topic": "o", "ca_file": "ca.pem"}, "sinks[0].params.ca_file", "tls"),
        (
            {"topic": "s", "fields": {"topic": "t"}, "topic_field": "topic"},
            {"topic": "o"},
            "sources[0].params.topic_field",
            "also a key of fields",
        ),
        ({"topic": "s", "overload": "block"}, {"topic": "o"}, "sources[0].params.overload", "shed"),
    ],
)
def test_bad_mqtt_params_name_the_field(
    source: dict[str, Any], sink: dict[str, Any], path: str, message: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(app(source, sink))
    assert path in info.value.paths
    assert message in str(info.value)


def test_a_filter_has_the_same_subscription_id_in_every_session() -> None:
    filters = ["a/#", "a/b", "plant/+/temp", "x"]
    first, second = SubscriptionTable(), SubscriptionTable()
    for f in filters:
        first.add(f, 1, lambda t, p: None)
    for f in reversed(filters):  # a restarted peer takes its sources up in another order
        second.add(f, 1, lambda t, p: None)
    assert first.wanted() == second.wanted()
    assert len({sid for _, sid in first.wanted().values()}) == len(filters)
