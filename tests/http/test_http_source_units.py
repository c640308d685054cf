"""The webhook source in one process, a real aiohttp client against its real
receiver: 429 while its log is full (and 202 again once it drains), the end at its
``count``, the records' ``ts`` as the source's other records have it, and a repeated
``Idempotency-Key`` answered again without logging twice; its log on its own: one
write for the requests that arrive together, read on from a position when opened
again (with the keys of what it holds), a request torn by the peer dying cut whole."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from support.processes import free_port

from agiledart.app.spec import SourceSpec
from agiledart.operators import Record
from agiledart.runtime.http import HttpSource
from agiledart.runtime.http.log import Offer, RequestLog
from agiledart.runtime.http.source import BadBody, records_of
from agiledart.runtime.mqtt.log import LogWriter, segments


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


async def test_requests_arriving_together_share_one_write(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "log", start=0, limit=100, max_bytes=1 << 20, keys=10)
    writes = 0
    commit = LogWriter.commit

    def counted(self: LogWriter) -> int:
        nonlocal writes
        writes += 1
        return commit(self)

    LogWriter.commit = counted  # type: ignore[method-assign]
    try:

        async def request(i: int) -> bool:
            assert log.offer([{"i": i}, {"i": i}], f"key-{i}") is Offer.TAKEN
            return await log.commit()

        assert await asyncio.gather(*(request(i) for i in range(5))) == [True] * 5
    finally:
        LogWriter.commit = commit  # type: ignore[method-assign]
    assert writes == 1
    assert log.backlog == 10
    assert log.offer([{"i": 9}], "key-3") is Offer.SEEN
    assert log.offer([{"i": 0}] * 91, "") is Offer.FULL  # 10 unread + 91 > 100
    log.close(remove=False)


def test_a_reopened_log_reads_on_from_a_position_and_knows_its_keys(tmp_path: Path) -> None:
    async def fill() -> None:
        log = RequestLog(tmp_path, start=0, limit=100, max_bytes=1 << 20, keys=10)
        for i in range(0, 6, 2):
            assert log.offer([{"i": i}, {"i": i + 1}], f"key-{i}") is Offer.TAKEN
            assert await log.commit()
        log.close(remove=False)

    asyncio.run(fill())
    log = RequestLog(tmp_path, start=2, limit=100, max_bytes=1 << 20, keys=10)
    assert log.logged == 6
    assert [r["i"] for r in log.read(10) + log.read(10)] == [2, 3, 4, 5]
    assert log.offer([{"i": 2}], "key-2") is Offer.SEEN
    assert log.offer([{"i": 6}], "key-6") is Offer.TAKEN
    log.close(remove=False)


def test_a_request_torn_by_the_peer_dying_is_cut_whole(tmp_path: Path) -> None:
    async def fill() -> None:
        log = RequestLog(tmp_path, start=0, limit=100, max_bytes=1 << 20, keys=10)
        for i in range(2):
            assert log.offer([{"i": 2 * i}, {"i": 2 * i + 1}], f"key-{i}") is Offer.TAKEN
            assert await log.commit()
        log.close(remove=False)

    asyncio.run(fill())
    segment = next(tmp_path.glob("*.log"))
    with segment.open("r+b") as f:
        f.truncate(segment.stat().st_size - 3)  # the second request's write, cut short
    log = RequestLog(tmp_path, start=0, limit=100, max_bytes=1 << 20, keys=10)
    assert log.logged == 2
    assert log.read(10) == [{"i": 0}, {"i": 1}]
    assert not log.seen("key-1")  # never answered: its client sends it again, whole
    log.close(remove=False)


async def test_a_repeated_idempotency_key_is_answered_again_and_not_logged_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGILEDART_SECRET_UNIT_HOOK", "tok")
    port = free_port()
    spec = SourceSpec(
        id="hook", peer="p", connector="http",
        params={"port": port, "token_env": "AGILEDART_SECRET_UNIT_HOOK", "count": 6},
    )  # fmt: skip
    source = HttpSource(spec)
    got: list[Record] = []

    async def emit(batch: list[Record]) -> None:
        got.extend(batch)

    task = asyncio.create_task(source.run(emit))
    url, auth = f"http://127.0.0.1:{port}/", {"Authorization": "Bearer tok"}
    async with aiohttp.ClientSession() as session:
        await until(lambda: source.stats.listening is not None)

        async def post(first: int, key: str) -> int:
            body = [{"i": first + j, "ts": first + j} for j in range(2)]
            headers = {**auth, "Idempotency-Key": key}
            async with session.post(url, json=body, headers=headers) as resp:
                return resp.status

        statuses = [await post(0, "a"), await post(0, "a"), await post(2, "b")]
        statuses += [await post(2, "b"), await post(4, "c")]  # "b"'s 2xx was lost: sent again
        assert statuses == [202] * 5
        await asyncio.wait_for(task, 10)
    assert [r["i"] for r in got] == [0, 1, 2, 3, 4, 5]
    assert source.stats.repeated == 2


def test_the_log_keeps_what_follows_the_committed_position_and_reads_on_from_it(
    tmp_path: Path,
) -> None:
    def opened(start: int) -> RequestLog:
        return RequestLog(
            tmp_path, start=start, limit=1000, max_bytes=1 << 20, keys=10, segment_bytes=100
        )

    async def fill(log: RequestLog, first: int, end: int) -> None:
        for i in range(first, end, 2):  # one request of 2 records, about 40 bytes, a commit
            assert log.offer([{"i": i}, {"i": i + 1}]) is Offer.TAKEN
            assert await log.commit()

    log = opened(0)
    asyncio.run(fill(log, 0, 40))
    assert [r["i"] for r in log.read(20)] == list(range(20))
    committed_frame = log.position  # an epoch's position, after record 20
    assert [r["i"] for r in log.read(20)] == list(range(20, 40))
    log.read_to(committed_frame)  # the epoch committed: what it covers may go
    firsts = segments(tmp_path)
    assert firsts[0] > 0  # segments wholly before it went
    assert firsts[0] <= committed_frame  # the one holding it stayed
    log.close(remove=False)
    log = opened(20)  # the source's peer restarted; its app restores from the epoch
    assert log.logged == 40
    got = []
    while batch := log.read(100):
        got += [r["i"] for r in batch]
    assert got == list(range(20, 40))
    log.close(remove=False)
