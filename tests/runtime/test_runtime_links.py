"""Outgoing links: the emulated control-plane round-trip time (``--control-rtt-ms``), and
no connection left open by a request under way when a peer closes its links."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from agiledart.cli.entry import build_parser
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.errors import PeerUnreachable
from agiledart.overlay.tcp import ConnectionInfo, FrameServer
from agiledart.peer import Peer, PeerConfig
from agiledart.runtime.links import Links

KEY = ClusterKey.generate(random.Random("test-cluster-key-0123456789"))


async def echo(request: dict[str, Any], conn: ConnectionInfo) -> Any:
    return request.get("x")


@pytest.mark.parametrize("rtt_s", [0.0, 0.05])
async def test_every_request_waits_the_emulated_round_trip(rtt_s: float) -> None:
    server = FrameServer(key=KEY, name="bob")
    server.route("echo", echo)
    links = Links(KEY, "alice", rtt_s=rtt_s)
    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as group, server:
        address = await server.start(group)
        try:
            for x in range(3):
                start = loop.time()
                assert await links.request(address, "echo", {"x": x}, timeout=5) == x
                assert loop.time() - start >= rtt_s  # a lower bound: never flaky
        finally:
            await links.aclose()
            await server.aclose()


async def test_a_connection_made_as_the_links_close_is_closed_too() -> None:
    """A peer closes its links before its task group ends, so its tasks can still be
    connecting (or start to): what they connect must not outlive the links, an open
    socket no one closes (it used to be stored after the close)."""
    server = FrameServer(key=KEY, name="bob")
    server.route("echo", echo)
    links = Links(KEY, "alice")
    async with asyncio.TaskGroup() as group, server:
        address = await server.start(group)
        try:
            connecting = asyncio.create_task(links.client(address))
            await asyncio.sleep(0)  # the connection under way
            await links.aclose()
            with pytest.raises(PeerUnreachable, match="closed"):
                await connecting
            with pytest.raises(PeerUnreachable, match="closed"):
                await links.request(address, "echo", {"x": 2}, timeout=5)
            assert not links._clients
        finally:
            await links.aclose()
            await server.aclose()


def test_the_peer_option_reaches_its_links(tmp_path: Any) -> None:
    parser = build_parser()
    args = parser.parse_args(["peer", "--listen", "127.0.0.1:0", "--control-rtt-ms", "25"])
    assert args.control_rtt_ms == 25.0
    config = PeerConfig(listen=("127.0.0.1", 0), state_dir=tmp_path, control_rtt_ms=25.0)
    assert Peer(config, KEY).links.rtt_s == pytest.approx(0.025)
    assert Peer(PeerConfig(listen=("127.0.0.1", 0), state_dir=tmp_path), KEY).links.rtt_s == 0


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "10001", "soon"])
def test_a_bad_round_trip_time_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["peer", "--listen", "127.0.0.1:0", "--control-rtt-ms", bad])
    assert info.value.code == 2
    assert "--control-rtt-ms" in capsys.readouterr().err
