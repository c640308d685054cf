"""Bad input at a live peer process: nothing unauthenticated is acted upon, nothing kills it."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.processes import cli_json, poll

from agiledart.emulation import LocalCluster
from agiledart.overlay import codec, ids
from agiledart.overlay.auth import HEADER, MAC, ClusterKey, DatagramAuth
from agiledart.overlay.errors import BadMessage

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


def ring(cluster: LocalCluster, i: int = 0) -> dict[str, Any]:
    return cli_json(cluster, "ring", "--via", "{}:{}".format(*cluster.address(i)))


def rejected(cluster: LocalCluster) -> int:
    info = asyncio.run(cluster.ring(0))
    if info is None:
        return 0
    return sum(v for k, v in info["stats"].items() if k.startswith("rejected_"))


def kernel_drops(addr: tuple[str, int]) -> int:
    """Datagrams the kernel dropped at the peer's UDP socket (its receive buffer was
    full): they never reached the peer, so the peer cannot count them."""
    want = "{:08X}:{:04X}".format(
        struct.unpack("<I", socket.inet_aton(socket.gethostbyname(addr[0])))[0], addr[1]
    )
    with open("/proc/net/udp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == want:
                return int(fields[-1])
    return 0


def exchange(sock: socket.socket, data: bytes, addr: tuple[str, int], *, wait: float) -> Any:
    """Send a request; the peer's reply to it (by message id), or None if none came."""
    sent = None
    if addr in KEY_OF:
        sent = codec.decode_rpc(data[HEADER:-MAC], max_len=9000)  # our own request
    me = sent.args[0] if isinstance(sent, codec.Request) and sent.args else None
    auth = DatagramAuth(KEY_OF[addr], local_id=me) if me else None
    sock.sendto(data, addr)
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            raw = sock.recv(9000)
        except TimeoutError:
            return None
        if auth is None:
            continue
        try:
            msg = codec.decode_rpc(auth.open(raw).payload, max_len=9000)
        except BadMessage:
            continue
        if isinstance(msg, codec.Response) and sent is not None and msg.msg_id == sent.msg_id:
            return msg.result
    return None


KEY_OF: dict[tuple[str, int], ClusterKey] = {}


def test_garbage_forged_and_replayed_datagrams(
    cluster_factory: Callable[[int], LocalCluster],
) -> None:
    cluster = cluster_factory(3)
    asyncio.run(cluster.wait_formed())
    target = cluster.address(0)
    before = ring(cluster)
    rng = random.Random(7)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        # 10,000 random datagrams, in chunks the kernel's socket buffer can hold: each
        # chunk waits until the peer has counted the previous one, however slow it is
        for chunk in range(20):
            for _ in range(500):
                size = rng.choice([1, 17, 49, 50, 200, 1400, 8000, 8191, 8193, 9000])
                sock.sendto(rng.randbytes(size), target)
                time.sleep(0.0002)
            poll(  # a burst can overflow the socket buffer on a busy machine
                lambda n=chunk: rejected(cluster) + kernel_drops(target) >= 500 * (n + 1),
                what=f"chunk {chunk} of garbage to be counted",
            )
        me = ids.to_bytes(ids.random_id(rng))
        KEY_OF[target] = cluster.key
        auth = DatagramAuth(cluster.key)
        # forged: well-formed, sealed under another cluster's key
        other = DatagramAuth(ClusterKey.generate(random.Random("some-other-cluster-key-123456")))
        for _ in range(50):
            sock.sendto(
                other.seal(codec.encode_request(rng.randbytes(8), "ping", [me, "x"])), target
            )
        # authentic, but an RPC that is not ours, or arguments of the wrong shape
        for name, args in [
            ("store", [me, b"k", b"v"]),
            ("__init__", []),
            ("ping", [b"short-id"]),
            ("route", [me, [1, 2], None]),
        ]:
            bad = auth.seal(codec.encode_request(rng.randbytes(8), name, args))
            assert exchange(sock, bad, target, wait=0.5) is None
        # authentic and fresh: answered once; the same bytes again are a replay
        ping = auth.seal(codec.encode_request(rng.randbytes(8), "ping", [me, "tester"]))
        assert exchange(sock, ping, target, wait=5) is not None
        assert exchange(sock, ping, target, wait=1) is None
    finally:
        sock.close()

    def counted() -> dict[str, Any] | None:
        info = ring(cluster)
        stats = info["stats"]
        total = sum(v for k, v in stats.items() if k.startswith("rejected_"))
        return info if total + kernel_drops(target) >= 10_000 + 50 + 4 + 1 else None

    after = poll(counted, what="every bad datagram to be counted as rejected")
    stats = after["stats"]
    assert stats.get("rejected_replay", 0) >= 1
    assert stats.get("rejected_key", 0) >= 50  # sealed under a key that is not ours
    assert stats.get("rejected_malformed", 0) >= 4
    assert "task_errors" not in stats
    # nothing unauthenticated was acted upon: the only new contact is the one
    # authentic ping, and the peer still routes
    new = {p["node_id"] for p in after["peers"]} - {p["node_id"] for p in before["peers"]}
    assert new <= {me.hex()}
    route = cli_json(cluster, "route", cluster.name(2), "--via", "{}:{}".format(*target))
    assert route["path"][-1]["name"] == cluster.name(2)


def test_garbage_truncated_and_oversized_frames(
    cluster_factory: Callable[[int], LocalCluster],
) -> None:
    cluster = cluster_factory(2)
    asyncio.run(cluster.wait_formed())
    target = cluster.address(0)
    rng = random.Random(8)
    attacks = [
        lambda: rng.randbytes(rng.randrange(1, 3000)),  # garbage
        lambda: struct.pack(">I", 0xFFFFFFF0) + b"x" * 10,  # huge length prefix
        lambda: struct.pack(">I", 4096) + rng.randbytes(100),  # truncated frame
        lambda: struct.pack(">I", 40) + rng.randbytes(40),  # a bogus handshake
    ]
    for i in range(400):
        with socket.create_connection(target, timeout=5) as conn:
            conn.sendall(attacks[i % len(attacks)]())
            conn.shutdown(socket.SHUT_WR)
            try:
                while conn.recv(4096):
                    pass
            except (TimeoutError, ConnectionResetError):
                pass

    def rejected() -> dict[str, Any] | None:
        info = ring(cluster)
        return info if sum(info["frames"]["rejected"].values()) >= 300 else None

    info = poll(rejected, what="bad TCP connections to be counted")
    assert info["self"] == cluster.name(0)
    route = cli_json(cluster, "route", cluster.name(1), "--via", "{}:{}".format(*target))
    assert route["path"][-1]["name"] == cluster.name(1)
