"""The http sink in one process against a real aiohttp receiver on loopback: epochs
POSTed once they commit, with keys that stay the same when an epoch is sent again
(after a 503, after the sink's reopening), a 4xx failing with the endpoint's reason,
and specs checked when they are parsed or opened."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.webhook import Receiver, running_receiver

from agiledart.app import SpecError, parse_spec
from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec
from agiledart.runtime.confine import DataPolicy, EnvNotAllowed
from agiledart.runtime.connectors import open_sink
from agiledart.runtime.http import HttpSink

Open = Callable[..., HttpSink]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture
async def sinks(tmp_path: Path, receiver: Receiver) -> AsyncIterator[Open]:
    """Opens http sinks (to ``receiver``) whose forwarders run until the test ends."""
    tasks: list[tuple[HttpSink, asyncio.Task[None]]] = []

    def open_(resume: dict[str, Any] | None = None, **params: Any) -> HttpSink:
        spec = SinkSpec(
            id="out",
            peer="p",
            connector="http",
            inputs=("x",),
            params={"url": receiver.url, **params},
        )
        sink = HttpSink(
            spec, app_id="app1", instance="p", out_dir=tmp_path, checkpointed=True, resume=resume
        )
        tasks.append((sink, asyncio.create_task(sink.run())))
        return sink

    yield open_
    for sink, task in tasks:
        sink.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"not within {timeout} s")


RECORDS = [{"k": "a", "n": 1}, {"k": "b", "n": 2}, {"k": "c", "n": 3}]


async def test_an_epoch_is_posted_once_it_commits_in_keyed_batches(
    sinks: Open, receiver: Receiver
) -> None:
    sink = sinks(batch_records=2, headers={"X-Site": "plant-3"})
    sink.write(RECORDS)
    assert await sink.seal(1) == {"epoch": 1, "peer": "p"}
    sink.write([{"k": "d", "n": 4}])
    await sink.seal(2)
    await asyncio.sleep(0.3)
    assert receiver.requests == []
    sink.committed_epoch(1)
    await until(lambda: sink.stats.records == 3)
    assert [r.key for r in receiver.requests] == ["app1/out/p/1/0", "app1/out/p/1/1"]
    assert receiver.records() == RECORDS
    assert sink.buffered()["buffered_rows"] == 1  # epoch 2 waits for its commit
    assert sink.connection()["state"] == "connected"


async def test_an_outage_keeps_the_epoch_on_disk_and_resends_it_with_the_same_keys(
    sinks: Open, receiver: Receiver
) -> None:
    """The first batch is taken, the second meets 503s: the epoch goes again whole,
    the first batch under its old key, which a deduplicating receiver drops."""
    receiver.plan = [200, 503, 503, 503]
    sink = sinks(batch_records=2)
    sink.write(RECORDS)
    await sink.seal(1)
    sink.committed_epoch(1)
    await until(lambda: sink.connection()["state"] == "retrying")
    assert "503" in str(sink.connection()["last_error"])
    assert sink.buffered()["buffered_rows"] == 3
    await until(lambda: sink.stats.records == 3)
    keys = [r.key for r in receiver.requests]
    assert set(keys) == {"app1/out/p/1/0", "app1/out/p/1/1"}
    assert keys.count("app1/out/p/1/0") > 1
    assert receiver.records() == RECORDS
    assert sink.buffered()["buffered_rows"] == 0


async def test_a_reopened_sink_sends_its_committed_epochs_with_the_same_keys(
    sinks: Open, receiver: Receiver
) -> None:
    """The sink's peer restarts during an outage: its spool survives, and the epochs
    up to the restored one go out under the keys they had; later ones are replayed."""
    receiver.status = 503
    first = sinks(batch_records=2)
    first.write(RECORDS)
    await first.seal(1)
    first.write([{"k": "d", "n": 4}])
    await first.seal(2)
    first.committed_epoch(1)
    await until(lambda: receiver.answered(503) >= 1)
    first.close()
    receiver.status = 200
    again = sinks(resume={"epoch": 1}, batch_records=2)
    again.write([{"k": "d", "n": 4}, {"k": "e", "n": 5}])  # the replay after epoch 1
    await again.drain()  # the input ended: the rest goes out, then the final mark
    assert receiver.records() == [*RECORDS, {"k": "d", "n": 4}, {"k": "e", "n": 5}]
    taken = [r.key for r in receiver.taken()]
    assert taken == ["app1/out/p/1/0", "app1/out/p/1/1", "app1/out/p/final/0"]
    third = sinks(resume={"epoch": 1})  # a replay after the end sends nothing again
    third.write([{"k": "d", "n": 4}])
    await third.drain()
    assert len(receiver.taken()) == 3


async def test_a_4xx_fails_with_the_status_and_the_endpoints_reason(
    tmp_path: Path, receiver: Receiver
) -> None:
    receiver.status, receiver.reason = 400, "field n must be a string"
    spec = SinkSpec(
        id="out", peer="p", connector="http", inputs=("x",), params={"url": receiver.url}
    )
    sink = HttpSink(spec, app_id="a", instance="p", out_dir=tmp_path, checkpointed=False)
    sink.write(RECORDS)
    with pytest.raises(ExecutionError, match=r"HTTP 400 Bad Request: field n must be a string"):
        await asyncio.wait_for(sink.run(), 10)
    assert receiver.answered(400) == 1  # not tried again


async def test_without_checkpoints_batches_go_out_as_they_come(
    tmp_path: Path, receiver: Receiver
) -> None:
    spec = SinkSpec(
        id="out", peer="p", connector="http", inputs=("x",),
        params={"url": receiver.url, "flush_ms": 50},
    )  # fmt: skip
    sink = HttpSink(spec, app_id="a", instance="p", out_dir=tmp_path, checkpointed=False)
    task = asyncio.create_task(sink.run())
    try:
        sink.write(RECORDS[:1])
        await until(lambda: len(receiver.requests) == 1)
        sink.write(RECORDS[1:])
        await until(lambda: len(receiver.requests) == 2)
    finally:
        sink.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert receiver.records() == RECORDS
    assert len({r.key for r in receiver.requests}) == 2


def test_token_env_is_read_under_the_peers_allow_env_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SinkSpec(
        id="out", peer="p", connector="http", inputs=("x",),
        params={"url": "http://127.0.0.1:9/in", "token_env": "HOME"},
    )  # fmt: skip
    policy = DataPolicy.of(tmp_path)
    with pytest.raises(EnvNotAllowed, match="token_env names 'HOME'"):
        open_sink(spec, out_dir=tmp_path, policy=policy)
    spec = SinkSpec(
        id="out", peer="p", connector="http", inputs=("x",),
        params={"url": "http://127.0.0.1:9/in", "token_env": "AGILEDART_SECRET_HTTP_UNIT"},
    )  # fmt: skip
    monkeypatch.delenv("AGILEDART_SECRET_HTTP_UNIT", raising=False)
    with pytest.raises(ExecutionError, match="not set in this peer's environment"):
        open_sink(spec, out_dir=tmp_path, policy=policy)
    monkeypatch.setenv("AGILEDART_SECRET_HTTP_UNIT", "s3cret")
    sink = open_sink(spec, out_dir=tmp_path, policy=policy)
    assert isinstance(sink, HttpSink)
    assert sink.headers["Authorization"] == "Bearer s3cret"


def test_a_bad_url_or_header_is_refused_when_parsed() -> None:
    raw = {
        "name": "x",
        "sources": [
            {"id": "s", "peer": "sensor-1", "connector": "generator",
             "params": {"dataset": "counter", "rate": 10, "count": 10}},
        ],
        "sinks": [
            {"id": "o", "peer": "gateway-1", "connector": "http", "inputs": ["s"],
             "params": {"url": "ftp://host/x", "headers": {"bad header": "v"}}},
        ],
    }  # fmt: skip
    with pytest.raises(SpecError) as e:
        parse_spec(raw)
    text = str(e.value)
    assert "sinks[0].params.url" in text
    assert "sinks[0].params.headers" in text
