"""Garbage sent to every runtime handler of 3 real peers: each request gets a typed
error (never ``InternalError``), one-way frames that break the protocol close only
their connection, nothing already accepted is lost, and the peers go on serving: an
app submitted afterwards still finishes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apps import quick
from support.processes import formed_cluster

from agiledart import apps
from agiledart.app import AppSpec, parse_spec
from agiledart.app.errors import ExecutionError, SpecError
from agiledart.emulation import LocalCluster
from agiledart.errors import AgiledartError
from agiledart.operators.base import FINAL_WATERMARK
from agiledart.overlay.errors import PeerUnreachable
from agiledart.overlay.tcp import FrameClient
from agiledart.runtime.appstate import apps_index, utc_day
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.instance import Deployment
from agiledart.runtime.records import record_key

pytestmark = [pytest.mark.processes]

SENSOR_1, SENSOR_2, GATEWAY_1 = 0, 1, 2
UNKNOWN = "no-such-app-000000"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with formed_cluster(tmp_path_factory.mktemp("badinput"), 3) as cluster:
        yield cluster


async def connect(site: LocalCluster, i: int) -> FrameClient:
    host, port = site.address(i)
    return await FrameClient.connect(host, port, key=site.key, name="prober", timeout=10.0)


async def refused(site: LocalCluster, i: int, rpc: str, body: dict[str, Any]) -> AgiledartError:
    """The error peer ``i`` answered with: the class its handler raised, from that peer."""
    with pytest.raises(AgiledartError) as info:
        await site.request(i, rpc, body, timeout=20.0)
    assert info.value.remote_peer == site.name(i)
    return info.value


async def frame_stats(site: LocalCluster, i: int) -> dict[str, Any]:
    ring = await site.request(i, "ring", {}, timeout=10.0)
    assert ring["self"] == site.name(i)
    frames: dict[str, Any] = ring["frames"]
    return frames


async def trouble(site: LocalCluster, i: int) -> dict[str, int]:
    """Peer ``i``'s count of handlers that failed untyped (it answers ``ring`` on a new
    connection); compared before and after each test."""
    events = (await frame_stats(site, i))["events"]
    return {e: events.get(e, 0) for e in ("internal_errors", "stream_handler_errors")}


# -- requests: (rpc, body, error type, part of the message) --------------------------------


WORD_COUNT = apps.load("word-count").to_dict()


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


REQUESTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("submit", {}, "MalformedError", "submit needs 'spec'"),
    ("submit", {"spec": 42}, "MalformedError", "submit needs 'spec'"),
    ("submit", {"spec": ["name", "x"]}, "MalformedError", "submit needs 'spec'"),
    ("submit", {"spec": "name: x", "set": "a=b"}, "MalformedError", "'set'"),
    ("submit", {"spec": "- just\n- a list\n"}, "SpecError", "mapping"),
    ("submit", {"spec": {"name": 5, "sources": {}}}, "SpecError", "invalid"),
    ("submit", {"spec": "name: [x\n  {{{" * 20_000}, "SpecError", "not valid YAML"),
    ("submit", {"spec": "[" * 20_000}, "SpecError", "nested too deeply"),
    ("submit", {"spec": {**WORD_COUNT, "params": nested(900)}}, "SpecError", "nested too"),
    ("submit", {"spec": "name: x\n", "set": [{"a": 1}, 7]}, "SpecError", "bad --set '7'"),
    ("status", {}, "MalformedError", "needs 'app_id'"),
    ("status", {"app_id": 5}, "MalformedError", "needs 'app_id'"),
    ("status", {"app_id": UNKNOWN}, "UnknownApp", UNKNOWN),
    ("stop", {}, "MalformedError", "needs 'app_id'"),
    ("stop", {"app_id": UNKNOWN}, "UnknownApp", UNKNOWN),
    ("start", {}, "MalformedError", "needs 'app_id'"),
    ("start", {"app_id": UNKNOWN}, "UnknownApp", "not deployed"),
    ("undeploy", {"app_id": ["x"]}, "MalformedError", "needs 'app_id'"),
    ("app_stats", {"app_id": ""}, "MalformedError", "needs 'app_id'"),
    ("app_sink_done", {"sink": "out"}, "MalformedError", "needs 'app_id'"),
    ("app_failed", {"app_id": None}, "MalformedError", "needs 'app_id'"),
    ("join", {}, "MalformedError", "40 hex digits"),
    ("join", {"to": 12345}, "MalformedError", "40 hex digits"),
    ("join", {"to": "z" * 40}, "MalformedError", "40 hex digits"),
    ("join", {"to": "-" + "f" * 39}, "MalformedError", "40 hex digits"),
    ("register", {}, "MalformedError", "'source'"),
    ("register", {"source": "def f(r): return r"}, "MalformedError", "'source'"),
    ("register", {"source": b"def f(:\n", "name": "bad.py"}, "CodeError", "bad.py"),
    ("register", {"source": b"raise RuntimeError('no')\n"}, "CodeError", "RuntimeError: no"),
    ("register", {"source": b"raise SystemExit(3)\n"}, "CodeError", "SystemExit"),
    (
        "register",
        {"kind": "package", "name": "p", "files": {"x.py": "text"}},
        "MalformedError",
        "'files'",
    ),
    (
        "register",
        {"kind": "package", "name": "p", "files": {"../x.py": b""}},
        "CodeError",
        "must be relative",
    ),
    (
        "register",
        {"kind": "package", "name": "p", "files": {"x.py": b""}},
        "CodeError",
        "no __init__.py",
    ),
    ("register", {"source": b"#" * (8 << 20) + b"\n"}, "CodeError", "the limit is"),
    ("kv_put", {"value": 1}, "StoreError", "record key"),
    ("kv_put", {"k": "xyz", "value": 1}, "StoreError", "record key"),
    ("kv_put", {"k": "g" * 40, "v": 1, "value": 1}, "StoreError", "record key"),
    ("kv_put", {"k": "0" * 40, "v": "new", "value": 1}, "StoreError", "version"),
    ("kv_get", {"k": 7}, "StoreError", "record key"),
    ("kv_add", {"k": "0" * 40, "v": 1, "members": "x"}, "StoreError", "list of members"),
]


@pytest.mark.parametrize(
    ("rpc", "body", "error", "message"),
    REQUESTS,
    ids=[f"{r[0]}-{i}" for i, r in enumerate(REQUESTS)],
)
async def test_garbage_requests_get_typed_errors(
    site: LocalCluster, rpc: str, body: dict[str, Any], error: str, message: str
) -> None:
    i = len(rpc) % site.peers  # spread over the peers
    before = await trouble(site, i)
    exc = await refused(site, i, rpc, body)
    assert type(exc).__name__ == error, exc
    assert message in str(exc)
    assert await trouble(site, i) == before


async def test_requests_for_unknown_apps_that_are_answered(site: LocalCluster) -> None:
    before = await trouble(site, GATEWAY_1)
    assert await site.request(GATEWAY_1, "undeploy", {"app_id": UNKNOWN}) == {"undeployed": False}
    assert await site.request(GATEWAY_1, "app_stats", {"app_id": UNKNOWN}) is None
    body = {"app_id": UNKNOWN, "sink": "out", "info": "garbage"}
    # answered, and False: this peer does not schedule the app (the reporter asks again)
    assert await site.request(GATEWAY_1, "app_sink_done", body) is False
    assert await site.request(GATEWAY_1, "app_failed", {"app_id": UNKNOWN, "error": 5}) is False
    assert await trouble(site, GATEWAY_1) == before


# -- deploy --------------------------------------------------------------------------------

ONE_PEER = """
name: one-peer
sources:
  - {id: src, peer: sensor-2, connector: generator, params: {dataset: urban, rate: 10, count: 5}}
operators:
  - {id: m, op: map, fn: "builtin:identity", inputs: [src]}
sinks:
  - {id: out, peer: sensor-2, connector: file, params: {path: one-peer.jsonl}, inputs: [m]}
"""


def deployment(site: LocalCluster, app_id: str, spec: AppSpec | None = None) -> Deployment:
    """Everything on sensor-2, which is its own scheduler."""
    spec = spec or parse_spec(ONE_PEER)
    return Deployment(
        app_id=app_id,
        spec=spec,
        hosts={n: ("sensor-2",) for n in ("src", "m", "out")},
        addresses={"sensor-2": site.address(SENSOR_2)},
        scheduler=site.address(SENSOR_2),
    )


def deploy_garbage(site: LocalCluster) -> list[tuple[dict[str, Any], str, str]]:
    good = deployment(site, "garbage-deploy").to_wire()
    unregistered = ONE_PEER.replace('"builtin:identity"', '"' + "ab" * 32 + ':f"')
    return [
        ({}, "ExecutionError", "malformed deployment"),
        ({k: v for k, v in good.items() if k != "hosts"}, "ExecutionError", "malformed"),
        ({**good, "hosts": ["m", "sensor-2"]}, "ExecutionError", "malformed"),
        ({**good, "addresses": {"sensor-2": ["127.0.0.3"]}}, "ExecutionError", "malformed"),
        ({**good, "addresses": {"sensor-2": [None, "port"]}}, "ExecutionError", "malformed"),
        ({**good, "scheduler": None}, "ExecutionError", "malformed"),
        ({**good, "spec": 17}, "SpecError", "mapping"),
        ({**good, "spec": "name: [x"}, "SpecError", "not valid YAML"),
        ({**good, "spec": {**good["spec"], "sinks": []}}, "SpecError", "sinks"),
        ({**good, "spec": unregistered}, "CodeError", "not registered"),
    ]


async def test_garbage_deployments_are_refused_and_nothing_runs(site: LocalCluster) -> None:
    before = await trouble(site, SENSOR_2)
    try:
        for body, error, message in deploy_garbage(site):
            exc = await refused(site, SENSOR_2, "deploy", body)
            assert (type(exc).__name__, message in str(exc)) == (error, True), exc
            ring = await site.request(SENSOR_2, "ring", {})
            assert "garbage-deploy" not in ring["apps"]
    finally:
        await site.request(SENSOR_2, "undeploy", {"app_id": "garbage-deploy"})
    assert await trouble(site, SENSOR_2) == before


FACTORIES = b"""
from agiledart.app.functions import factory


@factory
def broken(**params):
    raise ValueError("no")


@factory
def leave(**params):
    raise SystemExit(4)
"""


async def test_deployments_that_cannot_be_built_are_refused(site: LocalCluster) -> None:
    """A deployment hosting a consumer nowhere, and user code that fails (or exits) when
    an operator is built, are execution errors; the peer lives on."""
    before = await trouble(site, SENSOR_2)
    code_id = (await site.request(SENSOR_2, "register", {"source": FACTORIES}))["code_id"]
    half = deployment(site, "half-deploy").to_wire()
    half["hosts"] = {"src": ["sensor-2"]}  # m and out are hosted nowhere
    bodies = [half]
    for fn in ("broken", "leave"):
        spec = parse_spec(ONE_PEER.replace("builtin:identity", f"{code_id}:{fn}"))
        bodies.append(deployment(site, f"factory-{fn}", spec).to_wire())
    try:
        for body in bodies:
            exc = await refused(site, SENSOR_2, "deploy", body)
            assert isinstance(exc, ExecutionError), exc
            if body is half:  # refused before anything is built
                assert "places no peer for ['m', 'out']" in str(exc)
            else:
                assert f"app {body['app_id']} cannot run on sensor-2" in str(exc)
    finally:
        for body in bodies:
            await site.request(SENSOR_2, "undeploy", {"app_id": body["app_id"]})
    running = (await site.request(SENSOR_2, "ring", {}))["apps"]
    assert not {b["app_id"] for b in bodies} & set(running)
    assert await trouble(site, SENSOR_2) == before


async def test_user_code_that_exits_during_validation_is_a_spec_error(site: LocalCluster) -> None:
    before = await trouble(site, GATEWAY_1)
    code_id = (await site.request(GATEWAY_1, "register", {"source": FACTORIES}))["code_id"]
    spec = ONE_PEER.replace("builtin:identity", f"{code_id}:leave")
    exc = await refused(site, GATEWAY_1, "submit", {"spec": spec})
    assert isinstance(exc, SpecError), exc
    assert exc.paths == ("operators[0].fn",)  # the problems crossed with their paths
    assert "SystemExit: 4" in exc.problems[0].message
    assert await trouble(site, GATEWAY_1) == before


# -- one-way data and watermark frames -------------------------------------------------------

BAD_FRAMES: list[tuple[str, dict[str, Any]]] = [
    ("data", {"a": 5, "p": "src", "b": {"e": "x", "r": []}}),
    ("data", {"a": "app", "b": {"e": "x", "r": []}}),
    ("data", {"a": "app", "p": "src"}),
    ("data", {"a": "app", "p": "src", "b": [1, 2, 3]}),
    ("data", {"a": "app", "p": "src", "b": {"r": [{"x": 1}]}}),
    ("wm", {"a": "app", "p": "src", "w": "soon"}),
    ("wm", {"a": "app", "p": "src", "w": 1.5}),
    ("wm", {"a": "app", "p": "src", "w": True}),
    ("wm", {"a": "app", "w": 10}),
]


@pytest.mark.parametrize(
    ("kind", "frame"), BAD_FRAMES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(BAD_FRAMES)]
)
async def test_a_malformed_stream_frame_closes_only_its_connection(
    site: LocalCluster, kind: str, frame: dict[str, Any]
) -> None:
    before = await trouble(site, GATEWAY_1)
    malformed = (await frame_stats(site, GATEWAY_1))["rejected"].get("malformed", 0)
    client = await connect(site, GATEWAY_1)
    async with client:
        await client.send(kind, frame)
        with pytest.raises(PeerUnreachable):  # served in order: the frame closed it first
            await client.request("ring", {}, timeout=10.0)
    assert (await frame_stats(site, GATEWAY_1))["rejected"]["malformed"] == malformed + 1
    assert await trouble(site, GATEWAY_1) == before


async def test_frames_for_an_unknown_app_are_dropped_and_the_connection_lives(
    site: LocalCluster,
) -> None:
    before = await trouble(site, GATEWAY_1)
    client = await connect(site, GATEWAY_1)
    async with client:
        batch = {"e": "src|x", "s": 0, "r": ["not", "records"]}
        await client.send("data", {"a": UNKNOWN, "p": "src", "b": batch})
        await client.send("wm", {"a": UNKNOWN, "p": "src", "w": 10, "c": "noon"})
        ring = await client.request("ring", {}, timeout=10.0)
    assert UNKNOWN not in ring["apps"]
    assert await trouble(site, GATEWAY_1) == before


def lines_of(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


async def test_records_accepted_before_garbage_are_not_lost(site: LocalCluster) -> None:
    """A deployed instance gets good batches, then garbage that closes the connection,
    then more good batches on a new one: every good record reaches the sink."""
    app_id = "kept-records"
    before = await trouble(site, SENSOR_2)
    reply = await site.request(SENSOR_2, "deploy", deployment(site, app_id).to_wire())
    assert reply == {"deployed": True, "operators": ["m"]}
    again = await site.request(SENSOR_2, "deploy", deployment(site, app_id).to_wire())
    assert again == {"deployed": False}

    def data(seq: int, records: Any, **extra: Any) -> dict[str, Any]:
        return {"a": app_id, "p": "src", "b": {"e": "src|prober", "s": seq, "r": records, **extra}}

    try:
        first = await connect(site, SENSOR_2)
        async with first:
            await first.send("data", data(0, [{"ts": 1, "n": 1}, {"ts": 2, "n": 2}]))
            await first.send("data", data(1, [{"ts": 3, "n": 3}], t=[[0, 9, 1.0]]))
            await first.send("data", data(2, [1, "two", None]))  # not records: closes
            with pytest.raises(PeerUnreachable):
                await first.request("ring", {}, timeout=10.0)
        second = await connect(site, SENSOR_2)
        async with second:
            await second.send("data", data(3, []))
            await second.send("data", data(4, [{"ts": 4, "n": 4}, {"n": "no ts"}]))
            await second.send("wm", {"a": app_id, "p": "src", "w": FINAL_WATERMARK, "c": 0})
            assert app_id in (await second.request("ring", {}, timeout=10.0))["apps"]

        async def sink() -> dict[str, Any]:
            stats = await site.request(SENSOR_2, "app_stats", {"app_id": app_id})
            out: dict[str, Any] = stats["sinks"]["out"]
            return out

        for _ in range(400):  # the segment task drains its inbox after the frames came in
            out = await sink()
            if out["done"]:
                break
            await asyncio.sleep(0.05)
        assert out["done"]
        assert out["records"] == 5
        assert len(lines_of(out["path"])) == 5
    finally:
        await site.request(SENSOR_2, "undeploy", {"app_id": app_id})
    assert await trouble(site, SENSOR_2) == before


@pytest.mark.parametrize("traces", [5, [[0, 9, 1.0], "junk"], [[3, 9, 1.0]], [[0, "id", 1.0]]])
async def test_a_batch_with_garbage_traces_is_malformed(site: LocalCluster, traces: Any) -> None:
    """Trace tags are checked like the rest of the batch: one bad tag, not a list of
    tags, or a tag pointing past the records makes the whole frame malformed."""
    app_id = "bad-traces"
    before = await trouble(site, SENSOR_2)
    await site.request(SENSOR_2, "deploy", deployment(site, app_id).to_wire())
    try:
        client = await connect(site, SENSOR_2)
        async with client:
            batch = {"e": "src|prober", "s": 0, "r": [{"ts": 1}], "t": traces}
            await client.send("data", {"a": app_id, "p": "src", "b": batch})
            with pytest.raises(PeerUnreachable):
                await client.request("ring", {}, timeout=10.0)
    finally:
        await site.request(SENSOR_2, "undeploy", {"app_id": app_id})
    assert await trouble(site, SENSOR_2) == before


# -- garbage in the records store ------------------------------------------------------------

CORRUPT = "corrupt-app-000000"


async def test_a_malformed_app_record_is_an_unknown_app_and_apps_still_lists(
    site: LocalCluster,
) -> None:
    """Any peer of the cluster may write records: one that is not an app record makes
    that app unknown, not every listing fail."""
    before = [await trouble(site, i) for i in range(site.peers)]
    app_key = f"{record_key('app', CORRUPT):040x}"
    index_key = f"{apps_index(utc_day(time.time())):040x}"
    for i in range(site.peers):  # whoever owns the keys has them
        garbage = {"app_id": CORRUPT, "state": 5, "scheduler": "here", "final": []}
        await site.request(i, "kv_put", {"k": app_key, "v": 1, "value": garbage})
        await site.request(i, "kv_add", {"k": index_key, "v": 1, "members": [CORRUPT]})
    for i in range(site.peers):
        listed = {a["app_id"]: a["state"] for a in await site.request(i, "apps", {})}
        assert listed[CORRUPT] == "unknown"
        for rpc in ("status", "stop"):
            exc = await refused(site, i, rpc, {"app_id": CORRUPT})
            assert isinstance(exc, UnknownApp), exc
            assert "malformed" in str(exc)
    assert [await trouble(site, i) for i in range(site.peers)] == before


# -- and afterwards, an app still runs -------------------------------------------------------


async def test_an_app_submitted_after_the_garbage_finishes(site: LocalCluster) -> None:
    before = [await trouble(site, i) for i in range(site.peers)]
    base = ["params.count=2000"]
    spec = apps.load("word-count", overrides=base)
    spec = apps.load("word-count", overrides=base + quick(spec))
    reply = await site.request(GATEWAY_1, "submit", {"spec": spec.to_dict()}, timeout=60.0)
    app_id = reply["app_id"]
    for _ in range(600):
        status = await site.request(SENSOR_2, "status", {"app_id": app_id}, timeout=20.0)
        if status["state"] not in ("deploying", "running"):
            break
        await asyncio.sleep(0.1)
    assert status["state"] == "finished", status.get("error")
    assert status["totals"]["source_records"] == 2000
    assert status["totals"]["errors"] == 0
    listed = {a["app_id"]: a["state"] for a in await site.request(SENSOR_1, "apps", {})}
    assert listed[app_id] == "finished"
    assert [await trouble(site, i) for i in range(site.peers)] == before
