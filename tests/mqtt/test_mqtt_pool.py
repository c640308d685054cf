"""The broker pool, mqtt sources and mqtt sinks against a real Mosquitto, in process:
one connection and one SUBSCRIBE however many sources, reconnect and resubscribe
after the broker restarts, buffering and counted drops while it is away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from support.mqtt import Broker, Subscriber

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec, SourceSpec
from agiledart.operators import Record
from agiledart.runtime.mqtt import (
    Backoff,
    BrokerOptions,
    BrokerPool,
    MqttSink,
    MqttSource,
    source_log_dir,
)
from agiledart.traces.schema import check

FAST = Backoff(initial_s=0.05, cap_s=0.5)


async def until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    """Wait for ``condition()``; the bound only keeps a broken build from hanging."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - broker logs and stats: nothing to await
            await asyncio.sleep(0.02)
    assert condition(), what


@asynccontextmanager
async def pools(n: int, **kw: Any) -> AsyncIterator[list[BrokerPool]]:
    """``n`` started pools (each its own connections), closed at the end."""
    made = [BrokerPool(client_id=f"pool{i}", **kw) for i in range(n)]
    async with asyncio.TaskGroup() as group:
        for p in made:
            p.start(group)
        try:
            yield made
        finally:
            for p in made:
                await p.aclose()


def options(broker: Broker) -> BrokerOptions:
    return BrokerOptions(host="127.0.0.1", port=broker.port)


async def publish(pool: BrokerPool, broker: Broker, *messages: tuple[str, bytes]) -> None:
    lease = pool.lease(options(broker))
    try:
        assert await lease.wait_connected()
        assert all(await lease.publish_many(list(messages), 1))
    finally:
        lease.close()


async def test_one_subscribing_connection_and_one_subscribe_for_many_sources(
    broker: Broker,
) -> None:
    got: dict[Any, list[tuple[str, bytes]]] = defaultdict(list)

    def collect(key: Any) -> Callable[[str, bytes], None]:
        return lambda topic, payload: got[key].append((topic, payload))

    async with pools(2) as (pool, publisher):
        o = options(broker)
        shared = [pool.subscribe(o, "s/#", collect(i), qos=1) for i in range(3)]
        narrow = pool.subscribe(o, "s/x", collect("x"))
        lease = pool.lease(o)  # a sink on the same broker: the one publishing connection
        await until(lambda: all(s.active for s in [*shared, narrow]), "subscribed")
        await publish(publisher, broker, ("s/x", b"1"), ("s/y", b"2"))
        await until(lambda: len(got["x"]) == 1 and all(len(got[i]) == 2 for i in range(3)), "got")
        for i in range(3):  # overlapping filters: still one copy each
            assert got[i] == [("s/x", b"1"), ("s/y", b"2")]
        assert got["x"] == [("s/x", b"1")]
        mine = [c for c in broker.connects() if c.startswith("pool0-")]
        assert len([c for c in mine if c.startswith("pool0-in-")]) == 1  # four sources
        assert len(mine) == 2  # and the sink's
        assert broker.subscribes("s/#") == 1
        assert broker.subscribes("s/x") == 1
        st = pool.statistics()
        assert (st.connections, st.connected, st.subscriptions, st.subscribers) == (2, 2, 2, 4)
        assert st.messages_in == 3  # the broker sent s/x once per filter

        shared[0].close()
        shared[1].close()
        await publish(publisher, broker, ("s/z", b"3"))
        await until(lambda: len(got[2]) == 3, "the remaining source still gets messages")
        assert len(got[0]) == len(got[1]) == 2
        shared[2].close()  # the last one on s/#: now the UNSUBSCRIBE
        await until(lambda: broker.unsubscribes("s/#") == 1, "unsubscribed")
        narrow.close()
        lease.close()
        await until(lambda: pool.statistics().connections == 0, "the unused connection closes")
        assert broker.unsubscribes("s/#") == 1
        await until(
            lambda: any("pool0-" in line and "disconnected" in line for line in broker.log()),
            "disconnect",
        )


async def test_reconnect_and_resubscribe_after_the_broker_restarts(broker: Broker) -> None:
    got: list[tuple[str, bytes]] = []
    active: list[bool] = []
    async with pools(2, backoff=FAST) as (pool, publisher):
        sub = pool.subscribe(
            options(broker),
            "r/#",
            lambda t, p: got.append((t, p)),
            qos=1,
            on_active=active.append,
        )
        await until(lambda: sub.active, "subscribed")
        await publish(publisher, broker, ("r/1", b"before"))
        await until(lambda: len(got) == 1, "delivered before the restart")

        await asyncio.to_thread(broker.stop)
        await until(lambda: not sub.active, "the pool notices the broker is gone")
        assert pool.statistics().connected == 0
        await asyncio.to_thread(broker.start)  # same port, fresh broker: no sessions
        await until(lambda: sub.active, "resubscribed")
        st = pool.statistics()
        assert st.reconnects >= 1
        assert st.errors == 0
        assert broker.subscribes("r/#") == 2  # once per broker run
        assert active[0] is True
        assert False in active
        assert active[-1] is True
        await publish(publisher, broker, ("r/2", b"after"))
        await until(lambda: len(got) == 2, "delivered after the restart")
        assert got == [("r/1", b"before"), ("r/2", b"after")]


async def test_a_failing_subscriber_does_not_stop_the_others(broker: Broker) -> None:
    got: list[str] = []

    def bad(topic: str, payload: bytes) -> None:
        raise RuntimeError("a bug in one source")

    async with pools(2) as (pool, publisher):
        o = options(broker)
        subs = [pool.subscribe(o, "f/#", bad), pool.subscribe(o, "f/#", lambda t, p: got.append(t))]
        await until(lambda: all(s.active for s in subs), "subscribed")
        await publish(publisher, broker, ("f/1", b"x"), ("f/2", b"y"))
        await until(lambda: got == ["f/1", "f/2"], "the good subscriber gets everything")
        assert pool.statistics().errors == 2
        assert pool.statistics().connected == 1
    with pytest.raises(ExecutionError, match="closed"):
        pool.subscribe(o, "f/#", lambda t, p: None)


def sink_spec(broker: Broker, **params: Any) -> SinkSpec:
    p = {"broker": broker.address, "qos": 1, **params}
    return SinkSpec(id="out", peer="p", connector="mqtt", inputs=("s",), params=p)


async def test_a_sink_holds_records_while_the_broker_is_away_and_counts_what_overflows(
    mosquitto: Callable[..., Broker], subscribe: Callable[..., Subscriber]
) -> None:
    broker = mosquitto(persistence=True)
    seen = subscribe(broker, "b/#", persistent=True)  # its session outlives the restart
    await asyncio.to_thread(broker.stop)
    async with pools(1, backoff=FAST) as (pool,):
        sink = MqttSink(sink_spec(broker, topic="b/{i}", buffer=100), brokers=pool)
        publisher = asyncio.create_task(sink.run())
        sink.write([{"ts": i, "i": i} for i in range(150)])
        sink.write([{"ts": 0}])  # no field for the topic: an error, counted
        assert not sink.connected
        assert (sink.queued, sink.stats.dropped, sink.stats.errors) == (100, 50, 1)
        await asyncio.to_thread(broker.start)
        assert await sink.drain(timeout=60)
        assert sink.stats.records == 100
        assert sink.stats.dropped == 50
        await until(lambda: len(seen.received()) >= 100, "the buffered records arrive")
        got = sorted({json.loads(p)["i"] for _, p in seen.received()})
        assert got == list(range(50, 150))  # the oldest were dropped
        assert all(t == f"b/{json.loads(p)['i']}" for t, p in seen.received())
        sink.close()
        await publisher
        with pytest.raises(ExecutionError, match="closed"):
            sink.write([{"ts": 1, "i": 1}])


async def test_drain_gives_up_after_its_timeout_and_counts_the_rest(
    mosquitto: Callable[..., Broker],
) -> None:
    broker = mosquitto(start=False)  # never there
    async with pools(1, backoff=FAST) as (pool,):
        sink = MqttSink(sink_spec(broker, topic="t", format="msgpack"), brokers=pool)
        publisher = asyncio.create_task(sink.run())
        sink.write([{"ts": i} for i in range(10)])
        assert not await sink.drain(timeout=0.2)
        assert (sink.queued, sink.stats.records, sink.stats.dropped) == (0, 0, 10)
        sink.close()
        await publisher
        assert pool.statistics().connections == 0


def source_spec(broker: Broker, **params: Any) -> SourceSpec:
    p = {"broker": broker.address, "qos": 1, **params}
    return SourceSpec(id="src", peer="p", connector="mqtt", params=p)


async def test_a_source_counts_bad_payloads_and_ends_after_count(broker: Broker) -> None:
    async with pools(2) as (pool, publisher):
        spec = source_spec(broker, topic="in/+", count=3, fields={"v": "value"}, topic_field="from")
        source = MqttSource(spec, brokers=pool, wall_ms=lambda: 77.0)
        got: list[Record] = []

        async def emit(records: list[Record]) -> None:
            got.extend(records)

        run = asyncio.create_task(source.run(emit))
        await until(lambda: source.stats.subscribed, "subscribed")
        await publish(
            publisher,
            broker,
            ("in/a", b"{garbage"),
            ("in/a", b'{"value": 1, "ts": 10}'),
            ("in/b", b'{"other": 1}'),
            ("in/b", b'{"value": 2}'),
            ("in/c", b"3"),
            ("in/c", b'{"value": 4, "ts": 40}'),
        )
        await run  # ends after 3 records, whatever comes next
        assert got == [
            {"v": 1, "from": "in/a", "ts": 10},
            {"v": 2, "from": "in/b", "ts": 77},
            {"v": 3, "from": "in/c", "ts": 77},
        ]
        st = source.stats
        assert (st.emitted, st.parse_errors, st.shed, st.finished) == (3, 2, 0, True)
        assert not st.subscribed
        ps = pool.statistics()  # its only user gone, the connection closes
        assert (ps.subscribers, ps.connections) == (0, 0)


class Traces:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def emit(self, type: str, **fields: Any) -> None:
        self.records.append({"v": 1, "type": type, "ts": 0.0, "peer": "p", **fields})


async def test_a_source_sheds_the_oldest_while_downstream_blocks(broker: Broker) -> None:
    traces = Traces()
    async with pools(2, trace=traces) as (pool, publisher):
        source = MqttSource(source_spec(broker, topic="shed", count=5, buffer=2), brokers=pool)
        first, release = asyncio.Event(), asyncio.Event()
        got: list[int] = []

        async def emit(records: list[Record]) -> None:
            first.set()
            await release.wait()  # back-pressure from downstream
            got.extend(r["n"] for r in records)

        run = asyncio.create_task(source.run(emit))
        await until(lambda: source.stats.subscribed, "subscribed")
        await publish(publisher, broker, ("shed", b'{"n": 0, "ts": 0}'))
        await first.wait()
        await publish(
            publisher,
            broker,
            *(("shed", json.dumps({"n": n, "ts": n}).encode()) for n in range(1, 5)),
        )
        await until(lambda: source.stats.received == 5, "all arrived")
        release.set()
        await run
        assert got == [0, 3, 4]
        assert (source.stats.emitted, source.stats.shed) == (3, 2)
        last = traces.records[-1]  # the shedding is traced too
        check(last)
        assert (last["type"], last["source"], last["shed"], last["received"]) == (
            "ingest",
            "src",
            2,
            5,
        )


async def test_a_durable_log_is_read_on_from_a_checkpoint_across_generations_and_pools(
    broker: Broker, tmp_path: Path
) -> None:
    """A checkpointed app's source: the log keeps logging while no source reads it
    (the app between generations), a new source reads on from the checkpoint's position,
    and a pool started again on the same directory (the peer restarted) takes the log
    and its broker session up: what came while no pool ran arrives too."""
    root = tmp_path / "mqtt"
    log_dir = source_log_dir(root, "app", "s")
    spec = source_spec(broker, topic="gen/+", qos=1)
    got: list[int] = []

    async def emit(records: list[Record]) -> None:
        got.extend(r["n"] for r in records)

    def msgs(first: int, end: int) -> list[tuple[str, bytes]]:
        return [("gen/a", b'{"n": %d, "ts": %d}' % (i, i)) for i in range(first, end)]

    kept = {"session_expiry_s": 60, "log_root": root}
    async with pools(1, **kept) as (pool,), pools(1) as (publisher,):
        first = MqttSource(spec, brokers=pool, log_dir=log_dir, durable=True)
        run = asyncio.create_task(first.run(emit))
        await until(lambda: first.stats.subscribed, "subscribed")
        await publish(publisher, broker, *msgs(0, 10))
        await until(lambda: len(got) == 10, "the first ten")
        assert first.checkpoint(1) == 10
        await publish(publisher, broker, *msgs(10, 14))
        await until(lambda: len(got) == 14, "four more, after the checkpoint")
        first.committed(1)
        run.cancel()  # the app is undeployed, to be restored from epoch 1
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await publish(publisher, broker, *msgs(14, 20))  # between two generations
        got.clear()
        second = MqttSource(spec, brokers=pool, log_dir=log_dir, durable=True, start=10)
        run = asyncio.create_task(second.run(emit))
        await until(lambda: len(got) == 10, "the replay")
        assert got == list(range(10, 20))  # after the checkpoint, each once
        assert second.checkpoint(2) == 20
        second.committed(2)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    async with pools(1) as (publisher,):  # no peer pool now: the broker keeps them
        await publish(publisher, broker, *msgs(20, 25))
    got.clear()
    async with pools(1, **kept) as (pool,):
        third = MqttSource(spec, brokers=pool, log_dir=log_dir, durable=True, start=20)
        run = asyncio.create_task(third.run(emit))
        await until(lambda: len(got) == 5, "what came while no pool ran")
        assert got == list(range(20, 25))
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        st = pool.statistics()
        assert (st.connections, st.subscriptions) == (1, 1)


async def test_a_resumed_session_keeps_its_subscriptions_and_drops_the_ended_ones(
    mosquitto: Callable[..., Broker],
) -> None:
    """A peer's pool (a persistent session) and a broker that restarts with persistence:
    the session comes back with its subscriptions, so the wanted one is not asked for
    again, and the one whose source ended while the broker was away is unsubscribed
    (it would go on sending what matches it, unrouted, for the session's life)."""
    broker = mosquitto(persistence=True)
    async with pools(1, backoff=FAST, session_expiry_s=60) as (pool,):
        kept = pool.subscribe(options(broker), "kept/#", lambda t, p: None, qos=1)
        ended = pool.subscribe(options(broker), "ended/#", lambda t, p: None, qos=1)
        await until(lambda: kept.active and ended.active, "subscribed")
        await asyncio.to_thread(broker.stop)
        await until(lambda: not kept.active, "the pool notices the broker is gone")
        ended.close()  # its source ended meanwhile
        await asyncio.to_thread(broker.start)
        await until(lambda: kept.active, "the session resumed")
        await until(lambda: broker.unsubscribes("ended/#") == 1, "the ended one unsubscribed")
        assert broker.subscribes("kept/#") == 1  # the broker kept it: not asked again
        assert pool.statistics().subscriptions == 1
