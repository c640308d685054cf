"""The webhook source in one process, a real aiohttp client against its real
receiver: 429 while its buffer is full (and 202 again once it drains), the end at its
``count``, and the records' ``ts`` as the source's other records have it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest
from support.processes import free_port

from agiledart.app.spec import SourceSpec
from agiledart.operators import Record
from agiledart.runtime.http import HttpSource
from agiledart.runtime.http.source import BadBody, records_of


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"not within {timeout} s")


def test_a_record_without_ts_gets_its_arrival_time_and_bad_bodies_say_why() -> None:
    assert records_of(b'{"v": 1}', 1234.5) == [{"v": 1, "ts": 1234}]
    assert records_of(b'[{"v": 1, "ts": 7.0}]', 0) == [{"v": 1, "ts": 7}]
    for body, why in [
        (b"{", "not JSON"),
        (b"[1]", "record 0 is not a JSON object"),
        (b'{"ts": "noon"}', "'ts' must be an integer"),
    ]:
        with pytest.raises(BadBody, match=why):
            records_of(body, 0)


async def test_a_full_buffer_answers_429_until_it_drains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGILEDART_SECRET_UNIT_HOOK", "tok")
    port = free_port()
    spec = SourceSpec(
        id="hook", peer="p", connector="http",
        params={"port": port, "token_env": "AGILEDART_SECRET_UNIT_HOOK", "buffer": 5, "count": 10},
    )  # fmt: skip
    source = HttpSource(spec, batch_size=100)
    release = asyncio.Event()
    got: list[Record] = []

    async def emit(batch: list[Record]) -> None:
        await release.wait()  # downstream is slow: back-pressure
        got.extend(batch)

    task = asyncio.create_task(source.run(emit))
    url, auth = f"http://127.0.0.1:{port}/", {"Authorization": "Bearer tok"}
    statuses = []
    async with aiohttp.ClientSession() as session:
        await until(lambda: source.stats.listening is not None)

        async def post(n: int, start: int) -> int:
            body = [{"i": start + j, "ts": start + j} for j in range(n)]
            async with session.post(url, json=body, headers=auth) as resp:
                return resp.status

        statuses.append(await post(4, 0))  # taken: 4 in the buffer
        await asyncio.sleep(0.05)  # the source takes them, then waits on emit
        statuses.append(await post(4, 4))  # the buffer holds 4 again
        statuses.append(await post(2, 8))  # 6 > 5: busy
        release.set()
        await until(lambda: source.stats.backlog == 0)
        statuses.append(await post(2, 8))  # 10 taken: the count is reached
        await asyncio.wait_for(task, 10)
    assert statuses == [202, 202, 429, 202]
    assert [r["i"] for r in got] == list(range(10))
    assert source.stats.busy == 1
    assert source.stats.finished
