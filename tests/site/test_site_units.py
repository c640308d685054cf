"""The site's protocol pieces without sockets: the HTTP request reader, the dashboard's
token check, graph and event diff, the latency histogram."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agiledart.app import parse_spec
from agiledart.overlay.auth import ClusterKey
from agiledart.runtime.metrics import LatencyHistogram
from agiledart.site.dashboard import Dashboard, dashboard_token
from agiledart.site.errors import HttpError
from agiledart.site.graph import app_graph, changes, incidents
from agiledart.site.http import HttpLimits, Request, RequestReader, Response, encode_response
from agiledart.site.metrics import PeerCollector

LIMITS = HttpLimits()


def read(data: bytes, limits: HttpLimits = LIMITS) -> Request | None:
    return RequestReader(limits).feed(data)


def test_a_request_in_pieces() -> None:
    reader = RequestReader(LIMITS)
    assert reader.feed(b"GET /api/state?token=ab%20c&x HTTP/1.1\r\nHost: h\r\n") is None
    req = reader.feed(b"Authorization:  Bearer t \r\n\r\n")
    assert req == Request(
        "GET", "/api/state", {"token": "ab c", "x": ""}, {"host": "h", "authorization": "Bearer t"}
    )


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"garbage\r\n\r\n", 400),
        (b"GET / HTTP/1.1 extra\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"DELETE / HTTP/1.1\r\n\r\n", 405),
        (b"G(T / HTTP/1.1\r\n\r\n", 400),
        (b"GET http://x/ HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nbad name: v\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 413),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 413),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
        (b"GET //[ HTTP/1.1\r\n\r\n", None),
        (b"GET //host:1/x HTTP/1.1\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 100 + b"\r\n", 431),
        (b"GET / HTTP/1.1\r\nX: " + b"y" * 20_000, 431),
    ],
)
def test_bad_requests_are_one_typed_error(data: bytes, status: int | None) -> None:
    if status is None:  # odd but harmless: a path, which the handlers then refuse (404)
        req = read(data)
        assert req is not None
        assert req.path.startswith("//")
        return
    with pytest.raises(HttpError) as err:
        read(data)
    assert err.value.status == status


@given(st.binary(max_size=300), st.sampled_from([b"", b"GET /", b"GET //", b"GET /?"]))
def test_any_garbage_is_a_request_or_an_http_error(data: bytes, start: bytes) -> None:
    status = 200
    try:
        read(start + data + b"\r\n\r\n")
    except HttpError as exc:
        status = exc.status
    assert 200 <= status < 600


def test_response_bytes() -> None:
    out = encode_response(Response(200, b"hi", headers=(("X-A", "b"),)))
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 2" in head
    assert b"X-A: b" in head
    assert b"no-referrer" in head
    assert body == b"hi"
    assert encode_response(Response(200, b"hi"), head_only=True).endswith(b"\r\n\r\n")


class FakeControl:
    def __init__(self) -> None:
        self.state = "running"
        self.status_calls = 0

    def ring(self) -> dict[str, Any]:
        return {"self": "a", "node_id": "00" * 20, "address": "h:1", "zone": "z", "peers": []}

    async def remote_ring(self, address: tuple[str, int], timeout: float) -> dict[str, Any]:
        raise AssertionError("no peers")

    async def apps(self) -> list[dict[str, Any]]:
        return [{"app_id": "x-1", "name": "x", "state": self.state, "scheduler": "a"}]

    async def status(self, app_id: str) -> dict[str, Any]:
        self.status_calls += 1
        return {"state": self.state, "placement": {"op": ["a"]}, "sources": {"s": "a"}}

    async def spec(self, app_id: str) -> Any:
        return {"sources": [{"id": "s"}], "operators": [{"id": "op", "op": "map", "inputs": ["s"]}]}


def test_token_check_and_a_cached_view() -> None:
    key = ClusterKey.generate(random.Random("k"))
    token = dashboard_token(key)
    assert len(token) == 32
    assert token != dashboard_token(ClusterKey.generate(random.Random("j")))
    control = FakeControl()
    now = [100.0]
    dash = Dashboard(control, token, clock=lambda: now[0])

    def ask(path: str, **query: str) -> Response:
        return asyncio.run(dash.handle(Request("GET", path, query, {})))

    assert ask("/api/state").status == 401
    assert ask("/api/state", token="nope").status == 403
    assert ask("/static/dashboard.js").status == 200  # no data in it
    assert ask("/static/dashboard.html").status == 404
    assert ask("/", token=token).status == 200
    assert b'"app_id":"x-1"' in ask("/api/state", token=token).body
    ask("/api/state", token=token)  # within refresh_s: the same view
    assert control.status_calls == 1
    control.state, now[0] = "stopped", 102.0
    body = ask("/api/state", token=token).body
    assert b"app x-1 (x): running -> stopped" in body
    ask("/api/state", token=token)
    now[0] = 104.0
    ask("/api/state", token=token)
    assert control.status_calls == 2  # an app that ended is not asked again


def test_app_graph_layers_and_peers() -> None:
    spec = {
        "sources": [{"id": "a", "connector": "generator"}, {"id": "b"}],
        "operators": [
            {"id": "u", "op": "union", "inputs": ["a", "b"]},
            {"id": "w", "op": "window", "inputs": ["u"]},
        ],
        "sinks": [{"id": "out", "inputs": ["w", "u"]}],
    }
    status = {
        "placement": {"u": ["p2"], "w": ["p3", "p4"]},
        "sources": {"a": "p1", "b": "p5"},
        "sinks": {"out": "p6"},
        "peers": {"p3": {"operators": {"w": {"rate": 2, "queued": 1, "utilization": 0.5}}}},
    }
    g = app_graph(spec, status)
    nodes = {n["id"]: n for n in g["nodes"]}
    assert {n: v["layer"] for n, v in nodes.items()} == {"a": 0, "b": 0, "u": 1, "w": 2, "out": 3}
    assert nodes["w"]["peers"] == ["p3", "p4"]
    assert nodes["out"]["peers"] == ["p6"]
    assert nodes["w"]["load"] == {"rate": 2.0, "queued": 1.0, "utilization": 0.5}
    assert sorted(map(tuple, g["edges"])) == [
        ("a", "u"),
        ("b", "u"),
        ("u", "out"),
        ("u", "w"),
        ("w", "out"),
    ]
    assert app_graph("not a spec", status) == {"nodes": [], "edges": []}
    assert app_graph({"operators": [5, {"id": 3}]}, {})["nodes"] == []


def test_changes_in_words() -> None:
    before = {"peers": {"a": True, "b": True, "c": True}, "apps": {"x": ("n", "running")}}
    after = {
        "peers": {"a": True, "b": False, "d": True},
        "apps": {"x": ("n", "stopped"), "y": ("m", "running")},
    }
    assert changes(None, after) == []
    assert changes(before, after) == [
        "peer d appeared",
        "peer c is no longer known",
        "peer b stopped answering",
        "app x (n): running -> stopped",
        "app y (m) is running",
    ]


def test_latency_histogram_buckets() -> None:
    h = LatencyHistogram()
    h.observe([0.5, 1.0, 3.0, 70_000.0])
    assert h.count == 4
    assert h.counts[0] == 2  # <= 1 ms
    assert h.counts[2] == 1  # (2.5, 5]
    assert h.counts[-1] == 1  # above every bound
    assert h.sum_ms == pytest.approx(70_004.5)


def test_events_name_recoveries_rescales_errors_and_failures() -> None:
    running = {
        "state": "running",
        "recoveries": [],
        "rescales": [],
        "totals": {"errors": 0},
    }
    later = {
        "state": "failed",
        "error": "on p2: operator logs raised ValueError",
        "recoveries": [
            {"dead": "p3", "takeover": "p4", "operators": ["w"], "mode": "checkpoint", "epoch": 7},
            {"dead": "p1", "takeover": "p1", "operators": ["src"], "restarted": True},
        ],
        "rescales": [{"action": "scale-out", "operators": ["m"], "from": "p2", "to": "p5"}],
        "totals": {"errors": 94},
        "problems": {
            "logs": {
                "errors": 94,
                "recent": [{"type": "ValueError", "message": "math", "count": 94}],
            }
        },
    }
    before = {"apps": {"x": ("n", "running")}, "incidents": {"x": incidents(running)}}
    after = {"apps": {"x": ("n", "failed")}, "incidents": {"x": incidents(later)}}
    assert changes(before, after) == [
        "app x: recovered from the loss of p3 (p4 took over w), from checkpoint epoch 7",
        "app x: p1 restarted and kept src",
        "app x: scale-out of m from p2 to p5",
        "app x: 94 record(s) dropped by errors (ValueError: math)",
        "app x (n): running -> failed: on p2: operator logs raised ValueError",
    ]
    assert changes(after, after) == []


def test_an_app_that_ended_shows_no_rates() -> None:
    spec = {"sources": [{"id": "s"}], "operators": [{"id": "w", "op": "map", "inputs": ["s"]}]}
    load = {"rate": 250.0, "queued": 3, "utilization": 0.5}
    status = {"placement": {"w": ["p"]}, "peers": {"p": {"operators": {"w": load}}}}
    (_, live) = app_graph(spec, {**status, "state": "running"})["nodes"]
    (_, ended) = app_graph(spec, {**status, "state": "finished"})["nodes"]
    assert live["load"]["rate"] == 250.0
    assert ended["load"] == {"rate": 0.0, "queued": 0.0, "utilization": 0.5}


def test_an_operators_dead_letters_are_a_metric_of_its_instance() -> None:
    spec = parse_spec(
        {
            "name": "t",
            "sources": [
                {
                    "id": "s",
                    "peer": "p",
                    "connector": "generator",
                    "params": {"dataset": "counter", "rate": 1, "count": 1},
                }
            ],
            "operators": [
                {
                    "id": "parse",
                    "op": "map",
                    "fn": "builtin:identity",
                    "inputs": ["s"],
                    "on_error": "dead_letter",
                    "dead_letter": {"type": "file"},
                },
                {"id": "keep", "op": "filter", "fn": "builtin:above", "inputs": ["parse"]},
            ],
            "sinks": [{"id": "out", "peer": "p", "connector": "discard", "inputs": ["keep"]}],
        }
    )
    stats = {"operators": {"parse": {"errors": 4, "dead_letters": 4}, "keep": {"errors": 1}}}
    instance = SimpleNamespace(
        statistics=lambda: stats,
        deployment=SimpleNamespace(hosts={"parse": ("p",), "keep": ("p",)}),
        spec=spec,
        sinks={},
    )
    peer = SimpleNamespace(name="p", runtime=SimpleNamespace(instances={"a-1": instance}))
    families = {f.name: f for f in PeerCollector(peer)._apps()}  # type: ignore[arg-type]
    (sample,) = families["agiledart_operator_dead_letters"].samples
    assert sample.labels == {"peer": "p", "app": "a-1", "operator": "parse", "op": "map"}
    assert sample.value == 4
