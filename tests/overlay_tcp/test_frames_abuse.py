"""A flood of hostile connections while a good client keeps working."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
from typing import Any

import pytest

from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.frames import (
    NEED_DATA,
    FrameConnection,
    Role,
    one_way_message,
    request_message,
)
from agiledart.overlay.tcp import ConnectionInfo, FrameClient, FrameLimits, FrameServer

KEY = ClusterKey.generate(random.Random("test-cluster-key-0123456789"))
OTHER_KEY = ClusterKey.generate(random.Random("some-other-cluster-key-987"))
ATTACKS = 2000
CONCURRENCY = 40
KINDS = ["random", "huge", "plausible", "truncated", "wrong_key", "forged", "replay", "shape"]
#: what the server must count each kind of connection as
EXPECTED = {
    "huge": {"oversize"},
    "random": {"oversize", "malformed", "auth"},
    "plausible": {"malformed", "auth"},
    "truncated": {"malformed"},
    "wrong_key": {"key"},
    "forged": {"auth"},
    "replay": {"auth"},
    "shape": {"malformed"},
}


def framed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def recorded_session() -> bytes:
    """Everything a good client sent in one session: replaying it must not work."""
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="victim")
    server = FrameConnection(role=Role.SERVER, key=KEY, name="bob")
    wire = client.data_to_send()
    server.receive_data(wire)
    server.next_event()
    client.receive_data(server.data_to_send())
    client.next_event()
    return wire + client.send(request_message("echo", 1, {"n": -1}))


async def handshake(
    conn: FrameConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    writer.write(conn.data_to_send())
    while conn.next_event() is NEED_DATA:
        conn.receive_data(await reader.read(4096))
    writer.write(conn.data_to_send())


async def attack(kind: str, rng: random.Random, port: int, replay: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if kind == "random":
            writer.write(rng.randbytes(rng.randint(1, 700)))
        elif kind == "huge":
            writer.write(struct.pack(">I", rng.randint(10**6, 2**32 - 1)) + rng.randbytes(8))
        elif kind == "plausible":
            writer.write(framed(rng.randbytes(rng.randint(1, 500))))
        elif kind == "truncated":
            hello = FrameConnection(role=Role.CLIENT, key=KEY, name="t").data_to_send()
            writer.write(hello[: rng.randint(1, len(hello) - 1)])
        elif kind == "wrong_key":  # a hello under another key: refused, then a proof anyway
            conn = FrameConnection(role=Role.CLIENT, key=OTHER_KEY, name="mallory")
            writer.write(conn.data_to_send())
            head = await reader.readexactly(4)
            await reader.readexactly(int.from_bytes(head, "big"))
            writer.write(framed(rng.randbytes(32)))
        elif kind == "replay":
            writer.write(replay)
        else:  # a real session (it holds the key) that then misbehaves
            conn = FrameConnection(role=Role.CLIENT, key=KEY, name="insider", rng=rng)
            await handshake(conn, reader, writer)
            if kind == "forged":
                frame = bytearray(conn.send(one_way_message("x", {"n": 1})))
                frame[rng.randrange(4, len(frame))] ^= 1 << rng.randrange(8)
                writer.write(bytes(frame))
            else:  # authentic, but not an envelope
                writer.write(conn.send({"no": "type"}))
        writer.write_eof()
        await reader.read()  # until the server hangs up
    except OSError:
        pass  # the server may reset (or have closed) a connection it refused
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_a_flood_of_garbage_leaves_the_server_serving_everyone_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agiledart.overlay.tcp")

    async def echo(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        return request["n"]

    # every attacker comes from 127.0.0.1: room for all of them, so each is parsed to the
    # end rather than shed (shedding is test_frames_tcp's and test_overlay_flood's)
    limits = FrameLimits(max_handshakes=2 * CONCURRENCY, max_handshakes_per_address=CONCURRENCY)
    server = FrameServer(
        key=KEY, name="bob", limits=limits, clock=lambda: 0.0
    )  # logs: once per reason
    server.route("echo", echo)
    rng = random.Random(2024)
    plan = [rng.choice(KINDS) for _ in range(ATTACKS)]
    replay = recorded_session()
    answers: list[int] = []

    async with asyncio.TaskGroup() as group, server:
        host, port = await server.start(group)
        async with await FrameClient.connect(host, port, key=KEY, name="good") as good:
            flooding = True

            async def keep_asking() -> None:
                n = 0
                while flooding or n < 50:
                    answers.append(await good.request("echo", {"n": n}, timeout=30))
                    n += 1

            asker = asyncio.create_task(keep_asking())
            slots = asyncio.Semaphore(CONCURRENCY)

            async def bounded(kind: str, seed: int) -> None:
                async with slots:
                    await attack(kind, random.Random(seed), port, replay)

            async with asyncio.TaskGroup() as attackers:
                for i, kind in enumerate(plan):
                    attackers.create_task(bounded(kind, i))
            flooding = False
            await asker
            await asyncio.sleep(0)
            assert not good.closed

        assert answers == list(range(len(answers)))  # every answer right, none lost
        stats = server.statistics()
        while stats.open_connections:  # the last attackers' tasks wind down
            await asyncio.sleep(0.01)
            stats = server.statistics()

    rejected = stats.rejected
    assert sum(rejected.values()) == ATTACKS  # each hostile connection counted once
    expected_reasons = set().union(*(EXPECTED[k] for k in set(plan)))
    assert set(rejected) <= expected_reasons
    assert {"oversize", "malformed", "auth", "key"} <= set(rejected)
    assert rejected["oversize"] >= plan.count("huge")
    assert rejected["malformed"] >= plan.count("shape") + plan.count("truncated")
    assert rejected["key"] == plan.count("wrong_key")  # told apart from a forgery
    assert rejected["auth"] >= plan.count("forged") + plan.count("replay")
    assert stats.sessions == 1 + plan.count("forged") + plan.count("shape")
    assert stats.events.get("internal_errors", 0) == 0
    assert stats.frames_in == len(answers) + plan.count("shape")  # forged frames never count
    warnings = [r for r in caplog.records if r.name == "agiledart.overlay.tcp"]
    assert len(warnings) == len(rejected)  # a bounded rate: one line per reason here
