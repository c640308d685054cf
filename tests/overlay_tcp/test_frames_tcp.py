"""FrameServer and FrameClient over real loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.errors import (
    AuthError,
    ConfigError,
    KeyMismatch,
    MalformedError,
    PeerUnreachable,
    UnknownRequest,
)
from agiledart.overlay.frames import FrameConnection, Role
from agiledart.overlay.tcp import (
    ConnectionInfo,
    FrameClient,
    FrameLimits,
    FrameServer,
    RemoteError,
)

KEY = ClusterKey.generate(random.Random("test-cluster-key-0123456789"))
OTHER_KEY = ClusterKey.generate(random.Random("some-other-cluster-key-987"))


@contextlib.asynccontextmanager
async def serving(server: FrameServer) -> AsyncIterator[tuple[str, int]]:
    async with asyncio.TaskGroup() as group, server:
        yield await server.start(group)


async def until(predicate: Any, what: str) -> None:
    """Poll a condition (the per-test timeout bounds the wait)."""
    while not predicate():  # noqa: ASYNC110 (the state lives in other objects)
        await asyncio.sleep(0.01)


async def echo(request: dict[str, Any], conn: ConnectionInfo) -> Any:
    return {"echo": request.get("x"), "peer": conn.peer_name}


async def test_request_and_reply() -> None:
    server = FrameServer(key=KEY, name="bob")
    server.route("echo", echo)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="alice") as client,
    ):
        assert client.peer_name == "bob"
        assert await client.request("echo", {"x": [1, "two", b"3"]}, timeout=5) == {
            "echo": [1, "two", b"3"],
            "peer": "alice",
        }
        assert await client.request("echo", timeout=5) == {"echo": None, "peer": "alice"}
        stats = server.statistics()
        assert stats.sessions == 1
        assert stats.frames_in == 2
        assert stats.frames_out == 2
        assert stats.rejected == {}


async def test_concurrent_requests_are_multiplexed_over_one_connection() -> None:
    running = peak = 0
    rng = random.Random(4)

    async def slow_echo(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(rng.random() / 100)
        running -= 1
        return request["n"] * 2

    server = FrameServer(key=KEY, name="bob")
    server.route("double", slow_echo)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="alice") as client,
    ):
        results = await asyncio.gather(
            *(client.request("double", {"n": n}, timeout=20) for n in range(300))
        )
    assert results == [2 * n for n in range(300)]
    assert peak > 1  # handlers overlapped: replies came back out of order, matched by id
    assert server.statistics().sessions == 1


async def test_handler_errors_become_typed_remote_errors() -> None:
    async def refuses(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        raise ConfigError("no such app: x")

    async def crashes(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        raise ZeroDivisionError("secret detail")

    async def unencodable(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        return object()

    async def too_big(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        return bytes(5000)

    server = FrameServer(key=KEY, name="bob", limits=FrameLimits(max_frame=4096))
    handlers = [("refuses", refuses), ("crashes", crashes), ("odd", unencodable), ("big", too_big)]
    for name, handler in handlers:
        server.route(name, handler)
    server.route("echo", echo)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="alice") as client,
    ):
        with pytest.raises(ConfigError) as refused:
            await client.request("refuses", timeout=5)
        assert (str(refused.value), refused.value.remote_peer) == ("no such app: x", "bob")
        with pytest.raises(RemoteError) as info:
            await client.request("crashes", timeout=5)
        assert info.value.error_type == "InternalError"
        assert "secret" not in info.value.remote_message
        with pytest.raises(RemoteError) as info:
            await client.request("odd", timeout=5)
        assert info.value.error_type == "InternalError"
        assert "encode" in info.value.remote_message
        with pytest.raises(RemoteError, match="exceeds the 4096-byte limit") as info:
            await client.request("big", timeout=5)
        assert info.value.error_type == "InternalError"
        with pytest.raises(UnknownRequest) as unknown:
            await client.request("nope", timeout=5)
        assert unknown.value.remote_peer == "bob"
        # none of that cost the connection
        assert (await client.request("echo", {"x": 1}, timeout=5))["echo"] == 1
        events = server.statistics().events
        assert events["internal_errors"] == 1
        assert events["unencodable_replies"] == 2
        assert events["unknown_request_type"] == 1


async def test_one_way_messages_arrive_in_order_both_ways() -> None:
    got: list[int] = []
    pushed: list[int] = []
    done = asyncio.Event()

    async def batch(message: dict[str, Any], conn: ConnectionInfo) -> None:
        got.append(message["n"])
        if message["n"] % 100 == 99:
            await conn.send("credit", {"n": message["n"]})  # back over the same connection

    server = FrameServer(key=KEY, name="bob")
    server.on_stream("batch", batch)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="alice") as client,
    ):

        async def credit(message: dict[str, Any], conn: ConnectionInfo) -> None:
            pushed.append(message["n"])
            if len(pushed) == 10:
                done.set()

        client.on_stream("credit", credit)
        for n in range(1000):
            await client.send("batch", {"n": n, "pad": b"x" * 50})
        await done.wait()
    assert got == list(range(1000))
    assert pushed == list(range(99, 1000, 100))


async def test_a_request_that_times_out_is_peer_unreachable() -> None:
    release = asyncio.Event()

    async def stuck(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        await release.wait()
        return "late"

    server = FrameServer(key=KEY, name="bob")
    server.route("stuck", stuck)
    server.route("echo", echo)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="alice") as client,
    ):
        with pytest.raises(PeerUnreachable, match="did not answer 'stuck'"):
            await client.request("stuck", timeout=0.05)
        release.set()  # its late reply is counted and dropped
        assert (await client.request("echo", {"x": 2}, timeout=5))["echo"] == 2
        await until(lambda: client.statistics().events.get("unexpected_replies"), "late")


async def test_connect_failures_are_peer_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(PeerUnreachable, match="cannot connect"):
            await FrameClient.connect("127.0.0.1", port, key=KEY, name="a", timeout=5)
    with socket.socket() as s:  # listening but never answering: times out
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(PeerUnreachable, match=r"within 0\.2 s"):
            await FrameClient.connect(
                "127.0.0.1", s.getsockname()[1], key=KEY, name="a", timeout=0.2
            )


async def test_wrong_key_is_refused_on_both_sides_with_words_that_name_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FrameServer(key=KEY, name="bob")
    server.route("echo", echo)
    async with serving(server) as (host, port):
        fix = "the cluster key differs from this peer's: check --cluster-key-file"
        with pytest.raises(KeyMismatch, match=f"{host}:{port}: {fix}"):
            await FrameClient.connect(host, port, key=OTHER_KEY, name="mallory", timeout=5)
        await until(lambda: server.statistics().rejected.get("key") == 1, "rejected")
        assert any(f"client 'mallory': {fix}" in r.getMessage() for r in caplog.records)
        async with await FrameClient.connect(host, port, key=KEY, name="alice") as client:
            assert (await client.request("echo", {"x": 3}, timeout=5))["echo"] == 3
        assert server.statistics().sessions == 1


async def test_handshake_timeout_closes_silent_and_trickling_connections() -> None:
    server = FrameServer(key=KEY, name="bob", limits=FrameLimits(handshake_timeout_s=0.2))
    async with serving(server) as (host, port):
        silent_r, silent_w = await asyncio.open_connection(host, port)
        trickle_r, trickle_w = await asyncio.open_connection(host, port)
        hello = FrameConnection(role=Role.CLIENT, key=KEY, name="slow").data_to_send()
        for byte in hello:  # a slowloris: one byte now and then, never a full hello
            if trickle_r.at_eof():
                break
            trickle_w.write(bytes([byte]))
            await asyncio.sleep(0.02)
        assert await silent_r.read() == b""
        assert await trickle_r.read() == b""
        for w in (silent_w, trickle_w):
            w.close()
            with contextlib.suppress(ConnectionError):
                await w.wait_closed()
        assert server.statistics().rejected["handshake_timeout"] == 2
        await until(lambda: server.statistics().open_connections == 0, "closed")


async def test_a_full_handshake_budget_sheds_the_oldest_idle_connection_not_the_client() -> None:
    limits = FrameLimits(max_handshakes=3, max_handshakes_per_address=3, handshake_timeout_s=60)
    server = FrameServer(key=KEY, name="bob", limits=limits)
    server.route("echo", echo)
    async with serving(server) as (host, port):
        idle = [await asyncio.open_connection(host, port) for _ in range(3)]
        await until(lambda: server.statistics().open_connections == 3, "three open")
        async with await FrameClient.connect(host, port, key=KEY, name="alice", timeout=5) as c:
            assert (await c.request("echo", {"x": 4}, timeout=5))["echo"] == 4
        assert server.statistics().events["shed_handshakes"] == 1
        assert await idle[0][0].read() == b""  # the oldest idle one made room
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def test_proven_sessions_have_their_own_cap() -> None:
    server = FrameServer(key=KEY, name="bob", limits=FrameLimits(max_connections=2))
    server.route("echo", echo)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="a") as a,
        await FrameClient.connect(host, port, key=KEY, name="b") as b,
    ):
        await a.request("echo", {"x": 1}, timeout=5)
        await b.request("echo", {"x": 1}, timeout=5)
        late = await FrameClient.connect(host, port, key=KEY, name="c", timeout=5)
        with pytest.raises(PeerUnreachable):
            await late.request("echo", {"x": 1}, timeout=5)
        await late.aclose()
        assert server.statistics().rejected["over_capacity"] == 1


async def test_requests_in_flight_per_connection_are_bounded() -> None:
    running = peak = 0
    release = asyncio.Event()

    async def held(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return request["n"]

    server = FrameServer(key=KEY, name="bob", limits=FrameLimits(max_concurrent_requests=2))
    server.route("held", held)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="alice") as client,
    ):
        calls = [
            asyncio.create_task(client.request("held", {"n": n}, timeout=20)) for n in range(6)
        ]
        await until(lambda: running == 2, "two running")
        for _ in range(20):
            await asyncio.sleep(0)
        assert running == 2
        release.set()
        assert await asyncio.gather(*calls) == list(range(6))
    assert peak == 2


async def test_a_blocked_receiver_pushes_back_on_the_sender() -> None:
    release = asyncio.Event()
    received = 0

    async def sink(message: dict[str, Any], conn: ConnectionInfo) -> None:
        nonlocal received
        await release.wait()
        received += 1

    limits = FrameLimits(write_buffer_high=256 * 1024)
    server = FrameServer(key=KEY, name="bob", limits=limits)
    server.on_stream("data", sink)
    total, payload = 2000, bytes(64 * 1024)  # 128 MiB if nothing pushed back
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="a", limits=limits) as client,
    ):
        sent = 0

        async def produce() -> None:
            nonlocal sent
            for _ in range(total):
                await client.send("data", {"d": payload})
                sent += 1

        producer = asyncio.create_task(produce())
        last, still = -1, 0
        while still < 20:  # until the producer has been stuck for a while
            await asyncio.sleep(0.01)
            still, last = (still + 1, last) if sent == last else (0, sent)
        assert sent < total // 2  # bounded by socket buffers, not by memory
        release.set()
        await producer
        await until(lambda: received == total, "all received")


async def test_closing_the_server_fails_pending_requests() -> None:
    entered = asyncio.Event()

    async def forever(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        entered.set()
        await asyncio.Event().wait()

    server = FrameServer(key=KEY, name="bob")
    server.route("forever", forever)
    async with serving(server) as (host, port):
        client = await FrameClient.connect(host, port, key=KEY, name="alice")
        call = asyncio.create_task(client.request("forever", timeout=30))
        await entered.wait()
        await server.aclose()
        with pytest.raises(PeerUnreachable, match="closed"):
            await call
        with pytest.raises(PeerUnreachable):
            await client.request("forever", timeout=30)
        assert client.closed
        await client.aclose()
        assert server.statistics().open_connections == 0


async def test_a_stream_handler_refusing_input_closes_that_connection() -> None:
    async def picky(message: dict[str, Any], conn: ConnectionInfo) -> None:
        raise MalformedError("bad batch")

    server = FrameServer(key=KEY, name="bob")
    server.on_stream("batch", picky)
    server.route("echo", echo)
    async with serving(server) as (host, port):
        async with (
            await FrameClient.connect(host, port, key=KEY, name="bad") as bad,
            await FrameClient.connect(host, port, key=KEY, name="good") as good,
        ):
            await bad.send("batch", {"rows": []})
            await until(lambda: bad.closed, "closed by the server")
            with pytest.raises(PeerUnreachable):
                await bad.request("echo", timeout=5)
            assert (await good.request("echo", {"x": 5}, timeout=5))["echo"] == 5
        assert server.statistics().rejected == {"malformed": 1}


async def test_a_server_that_breaks_the_protocol_gives_bad_message() -> None:
    finished = asyncio.Event()

    async def rogue(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FrameConnection(role=Role.SERVER, key=KEY, name="rogue")
        try:
            conn.receive_data(await reader.read(4096))
            conn.next_event()
            writer.write(conn.data_to_send())
            await reader.read(4096)  # the proof (and perhaps the request)
            writer.write(b"\x00\x00\x00\x30" + bytes(48))  # a frame with a forged tag
            await reader.read()
        except ConnectionError:
            pass
        finally:
            writer.close()
            finished.set()

    listener = await asyncio.start_server(rogue, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with listener, await FrameClient.connect("127.0.0.1", port, key=KEY, name="a") as client:
        with pytest.raises(AuthError, match="bad frame tag"):
            await client.request("ring", timeout=5)
        assert client.statistics().rejected == {"auth": 1}
        await finished.wait()


async def test_bad_limits_and_addresses() -> None:
    with pytest.raises(ValueError, match="positive"):
        FrameLimits(max_connections=0)
    server = FrameServer(key=KEY, name="bob")
    async with serving(server) as (host, port):
        other = FrameServer(key=KEY, name="eve")
        async with asyncio.TaskGroup() as group:
            with pytest.raises(ConfigError, match="cannot listen"):
                await other.start(group, host, port)
