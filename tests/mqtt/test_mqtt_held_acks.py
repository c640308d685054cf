"""A checkpointed app's QoS 1 mqtt source has its own broker session, its
acknowledgements held until a committed epoch covers them, so the session follows the
source to another peer: real Mosquitto (its defaults), pools in process."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from support.mqtt import Broker
from test_mqtt_burst import publish_burst
from test_mqtt_pool import options, pools, publish, source_spec, until

from agiledart.operators import Record
from agiledart.runtime.mqtt import MqttSource, source_log_dir, source_session


def msgs(first: int, end: int) -> list[tuple[str, bytes]]:
    return [("held/a", b'{"n": %d, "ts": %d}' % (i, i)) for i in range(first, end)]


async def test_a_burst_arrives_whole_and_stays_at_the_broker_until_an_epoch_commits(
    broker: Broker, tmp_path: Path
) -> None:
    """Mosquitto's defaults (20 in flight, 1000 queued) would drop most of a burst if
    they bounded the messages held unacknowledged; the session's Receive Maximum does.
    Nothing committed, the broker still holds them all: a source elsewhere gets them
    again; once an epoch covering them commits, it has none left."""
    got: list[int] = []

    async def emit(records: list[Record]) -> None:
        got.extend(r["n"] for r in records)

    spec = source_spec(broker, topic="held/+", qos=1)
    root = tmp_path / "mqtt"
    async with pools(1) as (publisher,):
        for peer in ("here", "there", "later"):
            got.clear()
            async with pools(1) as (pool,):
                log_dir = source_log_dir(root / peer, "app", "src")
                source = MqttSource(spec, brokers=pool, log_dir=log_dir, durable=True)
                run = asyncio.create_task(source.run(emit))
                await until(lambda s=source: s.stats.subscribed, "subscribed")
                if peer == "here":  # one mosquitto_pub -l: as fast as the broker takes them
                    burst = [{"n": i, "ts": i} for i in range(5000)]
                    await asyncio.to_thread(publish_burst, broker, "held/a", burst, 1)
                if peer == "later":  # nothing is redelivered: only what comes now
                    await publish(publisher, broker, *msgs(5000, 5001))
                    await until(lambda: len(got) == 1, "the new one")
                    await asyncio.sleep(0.3)  # a redelivery would come first anyway
                    assert got == [5000]
                else:
                    await until(lambda: len(got) == 5000, "the whole burst")
                    assert got == list(range(5000))
                    assert source.stats.shed == 0
                    assert pool.statistics().connections == 1  # its own session only
                if peer == "there":  # an epoch covering them all commits
                    source.checkpoint(1)
                    source.committed(1)
                    await asyncio.sleep(0.5)  # the PUBACKs reach the broker
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run


async def test_the_session_follows_the_source_and_checkpointed_redeliveries_are_dropped(
    broker: Broker, tmp_path: Path
) -> None:
    """A source logs 30 messages, a checkpoint at 20 records their packet ids, and its
    peer goes before any epoch commits (nothing was acknowledged): a source on another
    peer, started at 20 with those ids, gets the broker's redeliveries of all 30 and
    keeps 20-29 only, then the new messages, each once."""
    got: list[int] = []

    async def emit(records: list[Record]) -> None:
        got.extend(r["n"] for r in records)

    spec = source_spec(broker, topic="held/+", qos=1)
    here = source_log_dir(tmp_path / "here", "app", "src")
    there = source_log_dir(tmp_path / "there", "app", "src")
    assert source_session(here, options(broker)) == source_session(there, options(broker))
    async with pools(1) as (publisher,):
        async with pools(1) as (pool,):
            first = MqttSource(spec, brokers=pool, log_dir=here, durable=True)
            run = asyncio.create_task(first.run(emit))
            await until(lambda: first.stats.subscribed, "subscribed")
            await publish(publisher, broker, *msgs(0, 30))
            await until(lambda: len(got) == 30, "thirty logged")
            assert first.checkpoint(1) == 30
            replay = first.replay_ids(20)  # what a checkpoint at 20 records
            assert replay is not None
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
        # the first peer is gone; its session, and the 30 unacknowledged, stay
        await publish(publisher, broker, *msgs(30, 35))
        got.clear()
        async with pools(1) as (pool,):
            moved = MqttSource(
                spec, brokers=pool, log_dir=there, durable=True, start=20, replay=replay
            )
            run = asyncio.create_task(moved.run(emit))
            await until(lambda: len(got) >= 15, "the tail and what came meanwhile")
            await publish(publisher, broker, *msgs(35, 40))
            await until(lambda: len(got) >= 20, "new ones")
            await asyncio.sleep(0.3)  # anything more would be a duplicate
            assert got == list(range(20, 40))
            assert moved.stats.duplicates == 20
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
