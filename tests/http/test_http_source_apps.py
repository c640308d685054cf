"""The webhook (``http``) source in a real app: real peer processes on loopback, the
test POSTing with a real aiohttp client. Requests without the token get 401, bodies
over ``max_body_kb`` 413, bad JSON 400 (the peer stays up, the app goes on); the
records POSTed then go through a keyed window to an http sink, and what the receiver
keeps (repeated keys dropped) is exactly the plain-Python reference."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from support.apps import normalise
from support.processes import cli_json, formed_cluster, free_port, poll
from support.webhook import Receiver, running_receiver

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes]

SENSOR_1, SENSOR_2, GATEWAY_1, GATEWAY_2, EDGE_1 = range(5)
TOKEN = "webhook-t0ken"
COUNT = 3_000


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    monkeypatch.setenv("AGILEDART_SECRET_WEBHOOK", TOKEN)  # the peers inherit it
    with formed_cluster(tmp_path, 5, ["--workers", "0"]) as cluster:
        yield cluster


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


def via(cluster: LocalCluster, i: int) -> str:
    return "{}:{}".format(*cluster.address(i))


def app(port: int, url: str) -> dict[str, Any]:
    return {
        "name": "webhook",
        "sources": [
            {
                "id": "hook",
                "peer": "sensor-1",
                "connector": "http",
                "params": {
                    "port": port,
                    "path": "/readings",
                    "token_env": "AGILEDART_SECRET_WEBHOOK",
                    "max_body_kb": 64,
                    "buffer": 500,
                    "count": COUNT,
                },
            }
        ],
        "operators": [
            {
                "id": "per_key",
                "op": "window",
                "params": {"size_ms": 500, "key": "key", "aggregate": "sum", "field": "seq"},
                "inputs": ["hook"],
                "peer": "edge-1",
            }
        ],
        "sinks": [
            {
                "id": "out",
                "peer": "gateway-1",
                "connector": "http",
                "params": {"url": url},
                "inputs": ["per_key"],
            }
        ],
    }


READINGS = [{"key": f"k{i % 7}", "seq": i, "ts": i * 5} for i in range(COUNT)]


async def post_all(url: str) -> dict[str, int]:
    """The refused requests first, then every reading in order, 200 a request, each
    tried again on a refused connection (not listening yet), 429 or 5xx."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    got: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:

        async def post(name: str, **kw: Any) -> int:
            for _ in range(600):
                try:
                    async with session.post(url, **kw) as resp:
                        await resp.read()
                        if resp.status != 429 and resp.status < 500:
                            got[name] = resp.status
                            return resp.status
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
            pytest.fail(f"{name}: never taken")

        await post("no token", json=READINGS[:1])
        await post("wrong token", json=READINGS[:1], headers={"Authorization": "Bearer nope"})
        await post("too large", data=b"[" + b" " * 100_000 + b"]", headers=auth)
        await post("bad json", data=b'[{"key": ', headers=auth)
        await post("not records", json=[1, 2], headers=auth)
        for i in range(0, COUNT, 200):
            assert await post("readings", json=READINGS[i : i + 200], headers=auth) == 202
    return got


def test_a_webhook_fed_app_gives_the_reference_and_refuses_bad_requests(
    site: LocalCluster, receiver: Receiver
) -> None:
    port = free_port()
    spec_raw = app(port, receiver.url)
    assert site.workdir is not None
    path = site.workdir / "webhook.yaml"
    path.write_text(yaml.safe_dump(spec_raw))
    app_id = cli_json(site, "submit", str(path), "--via", via(site, GATEWAY_2))["app_id"]
    got = asyncio.run(post_all(f"http://127.0.0.1:{port}/readings"))
    assert got == {
        "no token": 401,
        "wrong token": 401,
        "too large": 413,
        "bad json": 400,
        "not records": 400,
        "readings": 202,
    }

    def done() -> dict[str, Any] | None:
        s = cli_json(site, "status", app_id, "--via", via(site, GATEWAY_2))
        return s if s["state"] in ("finished", "failed", "stopped") else None

    s = poll(done, what="the webhook app to end", timeout=120)
    assert s["state"] == "finished", s.get("error")
    hook = s["peers"]["sensor-1"]["sources"]["hook"]
    assert (hook["unauthorized"], hook["too_large"], hook["bad_requests"]) == (2, 1, 2)
    assert hook["received"] == hook["emitted"] == COUNT
    assert site.procs[SENSOR_1].poll() is None  # the peer stays up
    want = normalise(
        reference_outputs(parse_spec(spec_raw), inputs={"hook": [dict(r) for r in READINGS]})["out"]
    )
    assert len(receiver.records()) == len(want)
    assert canonical(receiver.records()) == canonical(want)
